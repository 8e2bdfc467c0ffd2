package talos

import (
	"fmt"
	"sort"
	"strings"

	"github.com/Masterminds/semver/v3"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/compatibility"
)

// UpgradeOrder says which of a Talos and a Kubernetes upgrade runs first
// when one run moves both.
type UpgradeOrder int

// The orders PlanUpgradeOrder chooses from.
const (
	// TalosFirst: every node moves to the target Talos while it runs its
	// current Kubernetes, then Kubernetes moves (the order Talos' own
	// upgrade guides follow).
	TalosFirst UpgradeOrder = iota
	// KubernetesFirst: Kubernetes moves on the current Talos, then Talos;
	// needed when the target Talos cannot run the current Kubernetes.
	KubernetesFirst
)

func (o UpgradeOrder) String() string {
	if o == KubernetesFirst {
		return "Kubernetes first, then Talos"
	}
	return "Talos first, then Kubernetes"
}

// PlanUpgradeOrder picks the order of a combined upgrade from what the
// nodes run: talosNow and kubeNow by node name (a node missing from either
// is not checked), to talosWant and kubeWant. Every pair of versions a
// node passes through must be one Talos supports (machinery's
// compatibility matrix, the check Talos applies to every config:
// ValidateKubernetesImageTag): Talos first passes through (talosWant,
// Kubernetes now), Kubernetes first through (Talos now, kubeWant). Talos
// first is chosen when it works; Kubernetes first when only it does; when
// neither does, a *PlanError names both paths and why each fails.
func PlanUpgradeOrder(talosNow, kubeNow map[string]string, talosWant, kubeWant string) (UpgradeOrder, error) {
	kubeWant = strings.TrimPrefix(kubeWant, "v")
	names := make([]string, 0, len(talosNow))
	for n := range talosNow {
		names = append(names, n)
	}
	sort.Strings(names)
	talosMoves, kubeMoves := false, false
	for _, n := range names {
		if !sameVersion(talosNow[n], talosWant) {
			talosMoves = true
		}
		if k, ok := kubeNow[n]; ok && !sameVersion(k, kubeWant) {
			kubeMoves = true
		}
	}
	if !talosMoves || !kubeMoves {
		// One of them stays: the other's own plan checks its pairs.
		return TalosFirst, nil
	}
	var talosFirst, kubeFirst []string
	for _, n := range names {
		k, ok := kubeNow[n]
		if !ok {
			continue
		}
		if err := supported(k, talosWant); err != nil {
			talosFirst = append(talosFirst, fmt.Sprintf("%s would run Kubernetes %s on Talos %s: %v", n, k, talosWant, err))
		}
		if err := supported(kubeWant, talosNow[n]); err != nil {
			kubeFirst = append(kubeFirst, fmt.Sprintf("%s would run Kubernetes %s on Talos %s: %v", n, kubeWant, talosNow[n], err))
		}
	}
	switch {
	case len(talosFirst) == 0:
		return TalosFirst, nil
	case len(kubeFirst) == 0:
		return KubernetesFirst, nil
	}
	return TalosFirst, &PlanError{Reason: fmt.Sprintf("no supported order for Talos %s with Kubernetes %s: Talos first, %s; Kubernetes first, %s. "+
		"Move in smaller steps: first to a Kubernetes or Talos version both the current and the target release support",
		talosWant, kubeWant, strings.Join(talosFirst, "; "), strings.Join(kubeFirst, "; "))}
}

// supported checks one pair against machinery's compatibility matrix.
func supported(kube, talosVersion string) error {
	kv, err := compatibility.ParseKubernetesVersion(strings.TrimPrefix(kube, "v"))
	if err != nil {
		return err
	}
	tv, err := compatibility.ParseTalosVersion(&machine.VersionInfo{Tag: talosVersion})
	if err != nil {
		return err
	}
	return kv.SupportedWith(tv)
}

func sameVersion(a, b string) bool {
	va, errA := semver.NewVersion(strings.TrimPrefix(a, "v"))
	vb, errB := semver.NewVersion(strings.TrimPrefix(b, "v"))
	if errA != nil || errB != nil {
		return a == b
	}
	return va.Equal(vb)
}
