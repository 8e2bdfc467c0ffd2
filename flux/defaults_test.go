package flux

import (
	"slices"
	"testing"

	"github.com/fluxcd/flux2/v2/pkg/manifestgen/install"

	"github.com/homelab/bootstrap/config"
)

// The default flux.components is Flux's own default set (flux2 v2.9.5
// pkg/manifestgen/install MakeDefaultOptions, what `flux install` installs).
func TestDefaultComponentsAreFluxsDefaults(t *testing.T) {
	if got, want := config.Default().Flux.Components, install.MakeDefaultOptions().Components; !slices.Equal(got, want) {
		t.Fatalf("flux.components defaults to %v, Flux's default set is %v", got, want)
	}
}
