package e2e_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/talos"
)

// TestKubeconfigRenewedBeforeItExpires: the control plane mints admin
// kubeconfigs valid for 45 s (cluster.adminKubeconfig.certLifetime, a
// config patch; Talos' default is a year), so every kept one is in its
// last 30 days: the next talos stage renews it while it still works, and
// the cluster stays reachable across the first one's expiry. The code
// before kept a kubeconfig as long as it worked, and it expired.
func TestKubeconfigRenewedBeforeItExpires(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 3*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1})
	patchControlPlanes(t, h, "short-kubeconfig.yaml", "cluster:\n  adminKubeconfig:\n    certLifetime: 45s\n")
	for _, stage := range []string{"provision", "talos"} {
		if r := run(t, ctx, h, "run", "--stage", stage); r.ExitCode != 0 {
			t.Fatalf("%s:\n%s", stage, r.Tail(30))
		}
	}
	read := func() ([]byte, time.Time) {
		t.Helper()
		data, err := os.ReadFile(h.Paths().Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		exp, err := talos.KubeconfigCertExpiry(data)
		if err != nil {
			t.Fatal(err)
		}
		return data, exp
	}
	first, exp1 := read()
	if left := time.Until(exp1); left > 45*time.Second {
		t.Fatalf("the kubeconfig's certificate expires in %s: the config's certLifetime was not honoured", left)
	}
	r := run(t, ctx, h, "run", "--stage", "talos")
	if r.ExitCode != 0 || !strings.Contains(r.Stdout+r.Stderr, "renew kubeconfig ") {
		t.Fatalf("the run with a kubeconfig in its last 30 days (exit %d):\n%s", r.ExitCode, r.Tail(30))
	}
	second, exp2 := read()
	if !exp2.After(exp1) {
		t.Fatalf("the kubeconfig was not renewed: expires %s, was %s", exp2, exp1)
	}
	// Across the first certificate's expiry.
	select {
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	case <-time.After(time.Until(exp1) + 2*time.Second):
	}
	if _, err := talos.CheckAPIServer(ctx, first, 10*time.Second); err == nil {
		t.Fatal("the first kubeconfig still works after its certificate expired")
	}
	if v, err := talos.CheckAPIServer(ctx, second, 10*time.Second); err != nil {
		t.Fatalf("the renewed kubeconfig does not reach the cluster: %v", err)
	} else {
		t.Logf("the renewed kubeconfig reaches Kubernetes %s after the first one expired", v)
	}
	if r := run(t, ctx, h, "run", "--stage", "talos"); r.ExitCode != 0 {
		t.Fatalf("a run after the first kubeconfig expired:\n%s", r.Tail(30))
	}
}
