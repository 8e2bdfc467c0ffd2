package config

import (
	"fmt"
	"os"
	"strings"

	"github.com/Masterminds/semver/v3"
	"go.yaml.in/yaml/v3"
)

// ciliumTested is, per Cilium minor, the Kubernetes minors its release
// documents as end-to-end tested
// (Documentation/network/kubernetes/compatibility.rst in the cilium
// source at the tag named). Minors not listed are not known here.
var ciliumTested = map[uint64]struct {
	min, max uint64
	source   string
}{
	18: {30, 33, "v1.18.4"},
	19: {31, 34, "v1.19.0"},
	20: {33, 36, "v1.20.2"},
}

// ciliumCompatibility warns when the Cilium chart's own compatibility page
// does not cover the cluster's Kubernetes version. A warning, not an error:
// an untested pair often works, and the user may know better.
func (v *validator) ciliumCompatibility() {
	c := v.c.CNI.Cilium
	cv, err := semver.StrictNewVersion(strings.TrimPrefix(c.ChartVersion, "v"))
	if err != nil {
		return // v.chart reports it
	}
	kv, err := semver.StrictNewVersion(strings.TrimPrefix(v.c.Cluster.KubernetesVersion, "v"))
	if err != nil {
		return // talosVersions reports it
	}
	tested, ok := ciliumTested[cv.Minor()]
	switch {
	case cv.Major() != 1 || !ok:
		v.warnf("cni.cilium.chartVersion", "bootstrap does not know which Kubernetes versions Cilium %d.%d is tested with (it knows 1.18 to 1.20): check Cilium's Kubernetes compatibility page for %s, or use %s",
			cv.Major(), cv.Minor(), kv, DefaultCiliumVersion)
	case kv.Major() != 1 || kv.Minor() < tested.min || kv.Minor() > tested.max:
		v.warnf("cni.cilium.chartVersion", "Cilium %d.%d is tested with Kubernetes 1.%d to 1.%d, not %s (compatibility.rst at cilium %s): use a Cilium version tested with it, such as %s",
			cv.Major(), cv.Minor(), tested.min, tested.max, kv, tested.source, DefaultCiliumVersion)
	}
}

// ciliumValues checks what the Cilium values file changes that cannot
// work on this cluster: more operator replicas than nodes. The chart
// requires operator pods on different nodes (a required hostname
// anti-affinity, install/kubernetes/cilium/values.yaml), so the surplus
// never schedules and the operator Deployment never becomes Available.
func (v *validator) ciliumValues() {
	f := v.c.CNI.Cilium.ValuesFile
	if f == "" {
		return
	}
	data, err := os.ReadFile(v.c.Resolve(f))
	if err != nil {
		return // v.file reports it
	}
	var vals struct {
		Operator struct {
			Replicas *int `yaml:"replicas"`
		} `yaml:"operator"`
	}
	if err := yaml.Unmarshal(data, &vals); err != nil {
		v.errf("cni.cilium.valuesFile", "%s is not a YAML values file: %v", f, err)
		return
	}
	var all map[string]any
	_ = yaml.Unmarshal(data, &all)
	for _, key := range talosCiliumValues {
		if _, set := lookupValue(all, key); set {
			v.errf("cni.cilium.valuesFile", "%s sets %s, which bootstrap sets as Talos requires (kube-proxy replacement, the API through KubePrism, Talos' cgroup mount and capabilities: siderolabs/talos v1.13.3 hack/test/e2e.sh): "+
				"the merge would replace it silently and Cilium would not run on Talos; remove the key", f, key)
		}
	}
	if r := vals.Operator.Replicas; r != nil && *r > len(v.c.Nodes) {
		v.errf("cni.cilium.valuesFile", "%s sets operator.replicas: %d, but the cluster has %s: the chart puts each operator replica on its own node, so %s never schedule%s and Cilium never becomes ready. "+
			"Remove it (bootstrap runs one operator per node, up to 2) or set at most %d",
			f, *r, plural(len(v.c.Nodes), "node"), plural(*r-len(v.c.Nodes), "replica"), map[bool]string{true: "s", false: ""}[*r-len(v.c.Nodes) == 1], len(v.c.Nodes))
	}
}

func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// talosCiliumValues are the chart values bootstrap sets because Talos needs
// them (infra.Cilium); a values file may not override them.
var talosCiliumValues = []string{
	"kubeProxyReplacement", "k8sServiceHost", "k8sServicePort",
	"cgroup.autoMount.enabled", "cgroup.hostRoot",
	"securityContext.capabilities.ciliumAgent", "securityContext.capabilities.cleanCiliumState",
}

// lookupValue finds a dotted key in decoded YAML.
func lookupValue(m map[string]any, key string) (any, bool) {
	head, rest, nested := strings.Cut(key, ".")
	val, ok := m[head]
	if !ok || !nested {
		return val, ok
	}
	sub, isMap := val.(map[string]any)
	if !isMap {
		return nil, false
	}
	return lookupValue(sub, rest)
}
