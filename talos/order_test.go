package talos

import (
	"errors"
	"strings"
	"testing"
)

// The order of a combined upgrade comes from the live versions and
// machinery's compatibility matrix (talos112: Kubernetes 1.30–1.35,
// talos113: 1.31–1.36).
func TestPlanUpgradeOrder(t *testing.T) {
	both := func(v string) map[string]string { return map[string]string{"cp-1": v, "wk-1": v} }
	for _, tc := range []struct {
		name                string
		talosNow, kubeNow   string
		talosWant, kubeWant string
		want                UpgradeOrder
		refused             []string
	}{
		// Talos 1.13 cannot run 1.30: Kubernetes moves first, on 1.12.
		{"1.12+1.30 to 1.13+1.31", "v1.12.6", "1.30.14", "v1.13.3", "1.31.0", KubernetesFirst, nil},
		// Talos 1.12 cannot run 1.36: Talos moves first.
		{"1.12+1.35 to 1.13+1.36", "v1.12.6", "1.35.4", "v1.13.3", "1.36.1", TalosFirst, nil},
		// Both orders work: Talos first.
		{"1.12+1.33 to 1.13+1.34", "v1.12.6", "1.33.2", "v1.13.3", "1.34.0", TalosFirst, nil},
		// Only one moves.
		{"Talos only", "v1.12.6", "1.33.2", "v1.13.3", "1.33.2", TalosFirst, nil},
		{"Kubernetes only", "v1.13.3", "1.33.2", "v1.13.3", "1.34.0", TalosFirst, nil},
		// Neither order: 1.13 cannot run 1.29, 1.11 cannot run 1.35.
		{"1.11+1.29 to 1.13+1.35", "v1.11.5", "1.29.3", "v1.13.3", "1.35.0", TalosFirst,
			[]string{"no supported order for Talos v1.13.3 with Kubernetes 1.35.0", "Talos first, cp-1 would run Kubernetes 1.29.3 on Talos v1.13.3", "Kubernetes first, cp-1 would run Kubernetes 1.35.0 on Talos v1.11.5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PlanUpgradeOrder(both(tc.talosNow), both(tc.kubeNow), tc.talosWant, tc.kubeWant)
			if tc.refused != nil {
				var pe *PlanError
				if !errors.As(err, &pe) {
					t.Fatalf("want a PlanError, got %v", err)
				}
				for _, s := range tc.refused {
					if !strings.Contains(pe.Reason, s) {
						t.Errorf("reason %q lacks %q", pe.Reason, s)
					}
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %s, %v; want %s", got, err, tc.want)
			}
		})
	}
}
