package stages

import (
	"os"
	"testing"

	"github.com/homelab/bootstrap/gitsnap/gitsnaptest"
)

// TestMain lets this test binary serve as `bootstrap gitsnap serve`: the flux
// stage starts the snapshot server from its own executable.
func TestMain(m *testing.M) {
	gitsnaptest.ServeIfChild()
	os.Exit(m.Run())
}
