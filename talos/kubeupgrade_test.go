package talos

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

func kubeVersions(v string, nodes ...Target) KubeVersions {
	out := KubeVersions{}
	for _, n := range nodes {
		for _, c := range ComponentsOf(n.Role) {
			out.set(n.Name, c, v)
		}
	}
	return out
}

func TestPlanKubernetes(t *testing.T) {
	wk := Target{Name: "wk-1", Role: RoleWorker}
	cp1, cp2 := Target{Name: "cp-1", Role: RoleControlPlane}, Target{Name: "cp-2", Role: RoleControlPlane}
	nodes := []Target{wk, cp1, cp2}
	running := kubeVersions("1.35.4", nodes...)
	running.set("cp-2", KubeAPIServer, "1.36.1") // a killed run moved it already
	plan, err := PlanKubernetes(nodes, running, map[string]string{"cp-1": "v1.13.3"}, "v1.36.1", false)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range plan.Steps {
		got = append(got, s.String())
	}
	want := []string{
		"upgrade kube-apiserver on cp-1 1.35.4 → 1.36.1 (1/8)",
		"upgrade kube-controller-manager on cp-1 1.35.4 → 1.36.1 (2/8)",
		"upgrade kube-controller-manager on cp-2 1.35.4 → 1.36.1 (3/8)",
		"upgrade kube-scheduler on cp-1 1.35.4 → 1.36.1 (4/8)",
		"upgrade kube-scheduler on cp-2 1.35.4 → 1.36.1 (5/8)",
		"upgrade kubelet on cp-1 1.35.4 → 1.36.1 (6/8)",
		"upgrade kubelet on cp-2 1.35.4 → 1.36.1 (7/8)",
		// Workers after the control planes, though the config lists it first.
		"upgrade kubelet on wk-1 1.35.4 → 1.36.1 (8/8)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The plan starts from the lowest version any component runs.
	running.set("wk-1", Kubelet, "1.35.0")
	plan, err = PlanKubernetes(nodes, running, nil, "1.36.1", false)
	if err != nil {
		t.Fatal(err)
	}
	if s := plan.Summary(); s != "upgrade Kubernetes 1.35.0 → 1.36.1: kube-apiserver, kube-controller-manager, kube-scheduler on 2 node(s), kubelet on 3" {
		t.Fatalf("summary %q", s)
	}

	var pe *PlanError
	if _, err := PlanKubernetes(nodes, running, nil, "1.35.4", false); !errors.As(err, &pe) || !pe.Downgrade || !strings.Contains(pe.Reason, "cp-2") {
		t.Fatalf("downgrade: %v", err)
	}
	if _, err := PlanKubernetes(nodes, kubeVersions("1.34.4", nodes...), nil, "1.36.1", false); !errors.As(err, &pe) || !strings.Contains(pe.Reason, "skips a minor") || !strings.Contains(pe.Reason, "1.35 release first") {
		t.Fatalf("minor skip: %v", err)
	}
	if _, err := PlanKubernetes(nodes, kubeVersions("1.36.1", nodes...), nil, "1.34.4", true); !errors.As(err, &pe) || !strings.Contains(pe.Reason, "minor downgrade") {
		t.Fatalf("downgrade by two minors: %v", err)
	}
	// A minor downgrade is no upgrade-k8s path (go-kubernetes
	// upgrade/path.go IsSupported), even with --allow-downgrade; a patch
	// downgrade within the minor is.
	if _, err := PlanKubernetes(nodes, kubeVersions("1.36.1", nodes...), nil, "1.35.4", true); !errors.As(err, &pe) || !strings.Contains(pe.Reason, "minor downgrade, which neither Kubernetes nor talosctl upgrade-k8s supports, even with --allow-downgrade") {
		t.Fatalf("minor downgrade allowed: %v", err)
	}
	if plan, err := PlanKubernetes(nodes, kubeVersions("1.36.1", nodes...), nil, "1.36.0", true); err != nil || len(plan.Steps) != 9 {
		t.Fatalf("allowed patch downgrade: %v %v", plan, err)
	}
	// Talos v1.12 supports Kubernetes up to 1.35.
	if _, err := PlanKubernetes(nodes, kubeVersions("1.35.4", nodes...), map[string]string{"wk-1": "v1.12.6"}, "1.36.1", false); !errors.As(err, &pe) || !strings.Contains(pe.Reason, "wk-1") || !strings.Contains(pe.Reason, "upgrade Talos first") {
		t.Fatalf("unsupported pair: %v", err)
	}
	partial := kubeVersions("1.35.4", cp1)
	if _, err := PlanKubernetes(nodes, partial, nil, "1.36.1", false); err == nil || errors.As(err, &pe) || !strings.Contains(err.Error(), "unknown") {
		t.Fatalf("unknown versions: %v", err)
	}
}

// A kubelet image variant (-fat, -slim) is kept across versions, as
// upgrade-k8s keeps it, and is not part of the version.
func TestKubeletImageVariant(t *testing.T) {
	for image, want := range map[string]string{
		"ghcr.io/siderolabs/kubelet:v1.35.4-fat":              "ghcr.io/siderolabs/kubelet:v1.36.1-fat",
		"ghcr.io/siderolabs/kubelet:v1.35.4-slim@sha256:abcd": "ghcr.io/siderolabs/kubelet:v1.36.1-slim",
		"ghcr.io/siderolabs/kubelet:v1.35.4":                  "ghcr.io/siderolabs/kubelet:v1.36.1",
		"registry.local:5000/kubelet:v1.35.4":                 "registry.local:5000/kubelet:v1.36.1",
	} {
		if got := withTag(image, "1.36.1"); got != want {
			t.Errorf("withTag(%s) = %s, want %s", image, got, want)
		}
		if v := imageVersion(image); v != "1.35.4" {
			t.Errorf("imageVersion(%s) = %q", image, v)
		}
	}
}

func TestPinKubeImages(t *testing.T) {
	h := newHarness(t, harnessOptions{controlPlanes: 1, workers: 1})
	for _, n := range h.res.Nodes {
		pinned, err := PinKubeImages(n.Config, map[string]string{
			KubeAPIServer: "1.35.4", KubeControllerManager: "1.35.4", KubeScheduler: "1.35.4", Kubelet: "1.35.0",
		})
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := configloader.NewFromBytes(pinned)
		if err != nil {
			t.Fatal(err)
		}
		if got := configImage(cfg, Kubelet); got != "ghcr.io/siderolabs/kubelet:v1.35.0" {
			t.Fatalf("%s kubelet image %q", n.Name, got)
		}
		// A worker's config carries no cluster.proxy section.
		if got := cfg.K8sProxyConfig().Image(); n.Role == RoleControlPlane && got != "registry.k8s.io/kube-proxy:v1.35.0" {
			t.Fatalf("%s kube-proxy image %q, want the kubelet's version", n.Name, got)
		}
		if n.Role == RoleControlPlane {
			for got, want := range map[string]string{
				configImage(cfg, KubeAPIServer):         "registry.k8s.io/kube-apiserver:v1.35.4",
				configImage(cfg, KubeControllerManager): "registry.k8s.io/kube-controller-manager:v1.35.4",
				configImage(cfg, KubeScheduler):         "registry.k8s.io/kube-scheduler:v1.35.4",
			} {
				if got != want {
					t.Fatalf("%s image %q, want %q", n.Name, got, want)
				}
			}
		}
		// Everything else is the rendered config's.
		orig, _ := configloader.NewFromBytes(n.Config)
		if cfg.K8sClusterConfig().ClusterEndpoint().String() != orig.K8sClusterConfig().ClusterEndpoint().String() || cfg.Machine().Install().Image() != orig.Machine().Install().Image() {
			t.Fatalf("%s: pinning changed more than the images", n.Name)
		}
		// Pinning to what the config names returns it unchanged.
		same, err := PinKubeImages(n.Config, map[string]string{Kubelet: DefaultKubernetesVersion})
		if err != nil || string(same) != string(n.Config) {
			t.Fatalf("%s: pinning to the rendered version changed the config (%v)", n.Name, err)
		}
	}
}

func TestRemovedInUpgrade(t *testing.T) {
	if r := RemovedIn("1.36.0", "1.36.1"); len(r.Resources)+len(r.FeatureGates) != 0 {
		t.Fatalf("a patch upgrade removes %v", r)
	}
	r := RemovedIn("1.31.4", "1.32.0")
	if len(r.Resources) != 1 || r.Resources[0] != "podschedulingcontexts.v1alpha3.resource.k8s.io" {
		t.Fatalf("1.31 → 1.32 resources %v", r.Resources)
	}
	h := newHarness(t, harnessOptions{controlPlanes: 1})
	n := h.res.Nodes[0]
	patched, err := PinKubeImages(n.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	withGate := strings.Replace(string(patched), "    apiServer:\n", "    apiServer:\n        extraArgs:\n            feature-gates: ServerSideApply=true,Foo=false\n", 1)
	if withGate == string(patched) {
		t.Fatal("test config has no apiServer section to patch")
	}
	err = r.CheckConfigs(map[string][]byte{n.Name: []byte(withGate)})
	if err == nil || !strings.Contains(err.Error(), "cp-1: kube-apiserver feature gate ServerSideApply") || strings.Contains(err.Error(), "Foo") {
		t.Fatalf("removed gate: %v", err)
	}
	if err := RemovedIn("1.32.0", "1.33.0").CheckConfigs(map[string][]byte{n.Name: []byte(withGate)}); err != nil {
		t.Fatalf("gate removed in another release: %v", err)
	}
	// A flag Kubernetes 1.35 removed from the kubelet, still in extraArgs.
	withFlag := strings.Replace(string(patched), "    kubelet:\n", "    kubelet:\n        extraArgs:\n            pod-infra-container-image: registry.k8s.io/pause:3.10\n", 1)
	if withFlag == string(patched) {
		t.Fatal("test config has no kubelet section to patch")
	}
	err = RemovedIn("1.34.3", "1.35.0").CheckConfigs(map[string][]byte{n.Name: []byte(withFlag)})
	if err == nil || !strings.Contains(err.Error(), "cp-1: kubelet flag --pod-infra-container-image") {
		t.Fatalf("removed flag: %v", err)
	}
	if err := RemovedIn("1.35.0", "1.36.1").CheckConfigs(map[string][]byte{n.Name: []byte(withFlag)}); err != nil {
		t.Fatalf("a flag removed before: %v", err)
	}
	// 1.37 removed cAdvisor's deprecated kubelet flags (go-kubernetes
	// v0.2.41, the version Talos v1.14 pins).
	withCadvisor := strings.Replace(string(patched), "    kubelet:\n", "    kubelet:\n        extraArgs:\n            housekeeping-interval: 10s\n            global-housekeeping-interval: 1m\n", 1)
	err = RemovedIn("1.36.1", "1.37.2").CheckConfigs(map[string][]byte{n.Name: []byte(withCadvisor)})
	if err == nil || !strings.Contains(err.Error(), "cp-1: kubelet flag --global-housekeeping-interval") || strings.Contains(err.Error(), "--housekeeping-interval") {
		t.Fatalf("1.37's removed kubelet flag: %v", err)
	}
	if r := RemovedIn("1.36.1", "1.37.2"); !slices.Contains(r.Resources, "podgroups.v1alpha2.scheduling.k8s.io") {
		t.Fatalf("1.36 → 1.37 resources %v", r.Resources)
	}

	gvr := schema.GroupVersionResource{Group: "resource.k8s.io", Version: "v1alpha3", Resource: "podschedulingcontexts"}
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion("resource.k8s.io/v1alpha3")
	obj.SetKind("PodSchedulingContext")
	obj.SetNamespace("default")
	obj.SetName("left-behind")
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "PodSchedulingContextList"}, obj)
	found, err := r.FindObjects(context.Background(), dyn)
	if err != nil || !strings.Contains(found, "1 object(s) of podschedulingcontexts.v1alpha3.resource.k8s.io") {
		t.Fatalf("found %q, %v", found, err)
	}
	empty := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "PodSchedulingContextList"})
	if found, err := r.FindObjects(context.Background(), empty); err != nil || found != "" {
		t.Fatalf("nothing stored: %q, %v", found, err)
	}
}

func TestPodState(t *testing.T) {
	st := podState(map[string]any{
		"conditions":        []any{map[string]any{"type": "Ready", "status": "True"}},
		"containerStatuses": []any{map[string]any{"image": "registry.k8s.io/kube-apiserver:v1.36.1@sha256:abc"}},
	})
	if st.Version != "1.36.1" || !st.Ready {
		t.Fatalf("%+v", st)
	}
	if st := podState(map[string]any{"phase": "Pending"}); st.Version != "" || st.Ready || st.Detail == "" {
		t.Fatalf("%+v", st)
	}
}

// TestPinKubeImagesInEachConfigForm: the images are pinned where each
// Talos minor's config keeps them. A v1.14 config holds them in the typed
// documents and refuses a v1alpha1 .machine.kubelet or .cluster.apiServer
// beside them (machinery's validation), so pinning there must write the
// documents; v1.12 and v1.13 configs keep the v1alpha1 fields.
func TestPinKubeImagesInEachConfigForm(t *testing.T) {
	for _, version := range []string{"v1.12.6", DefaultTalosVersion, "v1.14.1"} {
		t.Run(version, func(t *testing.T) {
			opts := atVersion(func(dir string) GenerateOptions {
				o := haCluster(dir)
				o.CNI = "" // flannel: kube-proxy runs and is pinned too
				return o
			}, version)(clusterDir(t, "secrets.yaml"))
			res, err := Generate(opts)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range res.Nodes {
				pinned, err := PinKubeImages(n.Config, map[string]string{
					KubeAPIServer: "1.35.4", KubeControllerManager: "1.35.4", KubeScheduler: "1.35.4", Kubelet: "1.35.0",
				})
				if err != nil {
					t.Fatalf("%s: %v", n.Name, err)
				}
				cfg, err := configloader.NewFromBytes(pinned)
				if err != nil {
					t.Fatalf("%s: %v", n.Name, err)
				}
				if _, errs := ValidateMetal(cfg); len(errs) != 0 {
					t.Fatalf("%s: the pinned config does not validate: %v\n%s", n.Name, errs, pinned)
				}
				want := map[string]string{Kubelet: "ghcr.io/siderolabs/kubelet:v1.35.0"}
				if n.Role == RoleControlPlane {
					want[KubeAPIServer] = "registry.k8s.io/kube-apiserver:v1.35.4"
					want[KubeControllerManager] = "registry.k8s.io/kube-controller-manager:v1.35.4"
					want[KubeScheduler] = "registry.k8s.io/kube-scheduler:v1.35.4"
					if got := cfg.K8sProxyConfig().Image(); got != "registry.k8s.io/kube-proxy:v1.35.0" {
						t.Errorf("%s kube-proxy image %q, want the kubelet's version", n.Name, got)
					}
				}
				for comp, w := range want {
					if got := configImage(cfg, comp); got != w {
						t.Errorf("%s %s image %q, want %q", n.Name, comp, got, w)
					}
				}
				typed := strings.HasPrefix(version, "v1.14")
				v1 := cfg.RawV1Alpha1()
				if hasV1 := v1 != nil && v1.MachineConfig != nil && v1.MachineConfig.MachineKubelet != nil && v1.MachineConfig.MachineKubelet.KubeletImage != ""; hasV1 == typed {
					t.Errorf("%s at %s: .machine.kubelet.image set %v, want %v", n.Name, version, hasV1, !typed)
				}
				if typed && v1 != nil && v1.ClusterConfig != nil && v1.ClusterConfig.APIServerConfig != nil && v1.ClusterConfig.APIServerConfig.ContainerImage != "" {
					t.Errorf("%s at %s: .cluster.apiServer.image set beside KubeAPIServerConfig", n.Name, version)
				}
			}
		})
	}
}
