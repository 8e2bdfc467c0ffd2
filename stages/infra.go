package stages

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/infra"
	"github.com/homelab/bootstrap/kube"
	"github.com/homelab/bootstrap/state"
	"github.com/homelab/bootstrap/talos"
)

// InfraStage installs the base infrastructure: Cilium first when the CNI
// is cilium (nothing needing pods works before it), then the NFS dynamic
// provisioner with its StorageClass as the only default.
type InfraStage struct{}

// Name implements Stage.
func (InfraStage) Name() string { return Infra }

// infraTimeout bounds each chart install/upgrade and its Deployments' wait.
const infraTimeout = 10 * time.Minute

// cniWait bounds the wait for a user's CNI to make the nodes Ready once its
// DaemonSet exists (cni.name none): image pulls and the agents' start on a
// small host take a minute or two.
const cniWait = 5 * time.Minute

// Run implements Stage.
func (InfraStage) Run(ctx context.Context, env *Env) error {
	cfg := env.Config
	kc, err := kubeconfig(env)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && env.DryRun {
			env.UI.Warn("%v: the talos stage creates it; infra changes cannot be planned in detail", err)
			if cfg.CNI.Name == "cilium" {
				_ = env.Wet(fmt.Sprintf("install cilium@%s into %s", cfg.CNI.Cilium.ChartVersion, infra.CiliumNamespace), nil)
			}
			return env.Wet(fmt.Sprintf("install %s@%s into %s and make %s the only default StorageClass",
				infra.NFSChart, cfg.Storage.NFS.ChartVersion, infra.NFSNamespace, cfg.Storage.NFS.StorageClass), nil)
		}
		return err
	}
	h, err := infra.NewHelm(kc, env.Paths.Kubeconfig, env.Log)
	if err != nil {
		return err
	}
	cs := h.Clientset()
	charts, _, err := takePrepared[[]fetchedChart](ctx, env, prepCharts, 2*time.Minute)
	if err != nil {
		return err
	}
	for _, c := range charts {
		h.Preload(c.release, c.archive)
	}

	rels, err := infraReleases(env)
	if err != nil {
		return err
	}
	names := nodeNames(cfg)
	for _, rel := range rels {
		var before func() error
		switch rel.Name {
		case infra.NFSRelease:
			// Talos brings flannel up itself. A pod created while no node
			// can take it waits out the scheduler's backoff (14s seen in
			// the lab) even once one can: install once a Ready node takes
			// pods. With "none" they wait for the user's CNI: nothing to
			// wait for.
			if cfg.CNI.Name == "flannel" && !env.DryRun {
				if err := kube.WaitNodesOpen(ctx, cs, names, infraTimeout, env.Log); err != nil {
					return fmt.Errorf("before installing the NFS provisioner: %w", err)
				}
				env.UI.OK("all %d node(s) Ready", len(names))
			}
			if cfg.CNI.Name == "none" && !env.DryRun {
				if err := ownCNIRuns(ctx, env, cs, names); err != nil {
					return err
				}
			}
			// The class as the chart renders it with the merged values: a
			// values file may add parameters (pathPattern, onDelete) to it.
			before = func() error {
				manifest, err := h.Render(ctx, rel)
				if err != nil {
					return err
				}
				want, ok, err := infra.ClassIn(manifest)
				if err != nil || !ok {
					return err
				}
				_, err = infra.CheckClass(ctx, cs, want, rel)
				return err
			}
		}
		if err := keepRelease(ctx, env, h, rel, before); err != nil {
			return err
		}
		if rel.Name == infra.CiliumRelease && !env.DryRun {
			if err := kube.WaitNodesReady(ctx, cs, names, infraTimeout, env.Log); err != nil {
				return fmt.Errorf("after installing Cilium: %w", err)
			}
			env.UI.OK("all %d node(s) Ready with Cilium", len(names))
		}
	}

	n := cfg.Storage.NFS
	// Exactly one default class: ours. Talos or an earlier install may have
	// left another one claiming it, and someone may have removed ours.
	if isDefault, err := infra.IsDefaultNamed(ctx, cs, n.StorageClass); err == nil && !isDefault {
		if err := env.Wet(fmt.Sprintf("annotate StorageClass %s as the default", n.StorageClass), func() error {
			return infra.MakeDefault(ctx, cs, n.StorageClass)
		}); err != nil {
			return err
		}
	} else if err != nil && !env.DryRun {
		return fmt.Errorf("reading StorageClass %s: %w", n.StorageClass, err)
	}
	others, err := infra.OtherDefaults(ctx, cs, n.StorageClass)
	if err != nil {
		return err
	}
	for _, name := range others {
		if err := env.Wet(fmt.Sprintf("remove the default annotation from StorageClass %s (only %s may be default)", name, n.StorageClass), func() error {
			return infra.Demote(ctx, cs, name)
		}); err != nil {
			return err
		}
	}
	env.withState(func(st *state.State) {
		st.Outputs.Infra.CNI = cfg.CNI.Name
		st.Outputs.Infra.StorageClass = n.StorageClass
	})
	return nil
}

// prepCharts keys the chart archives fetched in the background.
const prepCharts = "infra-charts"

// fetchedChart is the archive of a release's pinned chart version.
type fetchedChart struct {
	release infra.Release
	archive []byte
}

// Prepare implements Preparer: the charts' archives are fetched while the
// cluster comes up (the chart and version are the config's; values and
// the API endpoint, which need the Talos configs, are not part of it).
// One that fails is fetched again in line, where its error is reported.
func (InfraStage) Prepare(ctx context.Context, env *Env) {
	refs, err := releasesOf(env, false)
	if err != nil {
		return // reported in line
	}
	env.prepareCPU(ctx, prepCharts, "the infra charts' archives", func(context.Context) (any, error) {
		var out []fetchedChart
		for _, r := range refs {
			archive, err := infra.FetchChart(r)
			if err != nil {
				return out, err
			}
			out = append(out, fetchedChart{release: r, archive: archive})
		}
		return out, nil
	})
}

// infraReleases returns the releases the infra stage keeps, in install
// order (Cilium first: nothing needing pods works before it), with the
// user's values files merged.
func infraReleases(env *Env) ([]infra.Release, error) {
	return releasesOf(env, true)
}

// releasesOf is infraReleases; without withAPI, Cilium's API endpoint is
// left out: it needs the Talos configs, which Prepare runs without, and
// the chart and version are the config's alone.
func releasesOf(env *Env, withAPI bool) ([]infra.Release, error) {
	cfg := env.Config
	var rels []infra.Release
	if cfg.CNI.Name == "cilium" {
		o := infra.CiliumOptions{RepoURL: cfg.CNI.Cilium.ChartRepo, Version: cfg.CNI.Cilium.ChartVersion, Nodes: len(cfg.Nodes), Timeout: infraTimeout}
		if withAPI {
			// The agents need the API before any Service works; KubePrism
			// serves it on every node's localhost when the configs enable it.
			kubePrism, err := talos.KubePrismPort(keptFiles(env), env.Paths.TalosDir, nodeNames(cfg))
			if err != nil {
				return nil, fmt.Errorf("deciding how Cilium reaches the API: %w", err)
			}
			host, port, why, err := infra.APIEndpoint(kubePrism, cfg.Cluster.Endpoint)
			if err != nil {
				return nil, err
			}
			env.Log.Debug().Str("host", host).Int("port", port).Msg("Cilium reaches the API through " + why)
			o.APIHost, o.APIPort = host, port
		}
		rel := infra.Cilium(o)
		var err error
		if rel.Values, err = infra.MergeValuesFile(rel.Values, cfg.Resolve(cfg.CNI.Cilium.ValuesFile)); err != nil {
			return nil, err
		}
		rels = append(rels, rel)
	}
	n := cfg.Storage.NFS
	rel := infra.NFSProvisioner(infra.NFSOptions{Server: n.Server, Path: n.Path, MountOptions: n.MountOptions, StorageClass: n.StorageClass,
		ReclaimPolicy: n.ReclaimPolicy, ArchiveOnDelete: n.ArchiveOnDelete, RepoURL: n.ChartRepo, Version: n.ChartVersion, Timeout: infraTimeout})
	var err error
	if rel.Values, err = infra.MergeValuesFile(rel.Values, cfg.Resolve(n.ValuesFile)); err != nil {
		return nil, err
	}
	return append(rels, rel), nil
}

// HandoverManifest renders the Flux HelmRepository and HelmRelease objects
// that adopt the releases the infra stage keeps, exactly as it keeps them
// (`bootstrap handover`): committed under flux.path, they make Flux the
// owner, and the infra stage only verifies those releases from then on.
func HandoverManifest(ctx context.Context, env *Env, namespace string, interval time.Duration) ([]byte, error) {
	rels, err := infraReleases(env)
	if err != nil {
		return nil, err
	}
	plain := map[string]bool{}
	for _, r := range rels {
		if !infra.IsOCI(r.RepoURL) {
			continue
		}
		isPlain, err := infra.OCIPlainHTTP(ctx, r.RepoURL)
		if err != nil {
			env.UI.Warn("%v: the HelmRepository for %s is written for HTTPS", err, r.RepoURL)
		}
		plain[r.RepoURL] = isPlain
	}
	return infra.Handover{Namespace: namespace, Interval: interval, PlainHTTP: plain}.Manifest(rels)
}

func nodeNames(cfg *config.Config) []string {
	names := make([]string, len(cfg.Nodes))
	for i, n := range cfg.Nodes {
		names[i] = n.Name
	}
	return names
}

// keepRelease keeps rel installed as configured, unless a Flux HelmRelease
// manages it: then the stage only verifies it, so a nightly re-run never
// upgrades or rolls back what Flux rolled out (helm-controller would take
// any revision it did not write as unmanaged and upgrade again: the two
// would fight every night). before runs ahead of an install or upgrade.
func keepRelease(ctx context.Context, env *Env, h *infra.Helm, rel infra.Release, before func() error) error {
	owner, owned, err := h.FluxOwner(ctx, rel)
	if err != nil {
		return err
	}
	if owned {
		msg := fmt.Sprintf("%s: managed by %s; verifying only (seen by %s)", rel.Name, owner, owner.Evidence)
		if env.DryRun {
			env.UI.OK("%s", msg)
			return nil
		}
		last, err := h.Verify(ctx, rel, owner)
		if err != nil {
			return err
		}
		env.UI.OK("%s: revision %d, %s %s, deployed and available", msg, last.Version, last.Chart.Metadata.Name, last.Chart.Metadata.Version)
		if last.Chart.Metadata.Version != rel.Version {
			env.UI.Warn("%s runs chart %s where the config says %s: Flux's HelmRelease decides now; align %s or leave it", rel.Name, last.Chart.Metadata.Version, rel.Version, configChartField(rel))
		}
		recordRelease(env, rel, last.Chart.Metadata.Version, last.Version)
		return nil
	}
	if before != nil {
		if err := before(); err != nil {
			return err
		}
	}
	return applyRelease(ctx, env, h, rel)
}

func configChartField(rel infra.Release) string {
	if rel.Name == infra.CiliumRelease {
		return "cni.cilium.chartVersion"
	}
	return "storage.nfs.chartVersion"
}

// applyRelease plans a release, reports the plan, and applies it through Wet.
func applyRelease(ctx context.Context, env *Env, h *infra.Helm, rel infra.Release) error {
	plan, err := h.Plan(ctx, rel)
	if err != nil {
		return err
	}
	if plan.Action == infra.ActionNone {
		env.UI.OK("%s", plan.Reason)
		recordRelease(env, rel, rel.Version, plan.Deployed.Version)
		return nil
	}
	return env.Wet(plan.Reason, func() error {
		deployed, err := h.Apply(ctx, rel, plan)
		if err != nil {
			return err
		}
		recordRelease(env, rel, rel.Version, deployed.Version)
		return nil
	})
}

func recordRelease(env *Env, rel infra.Release, chartVersion string, revision int) {
	if rel.Name != infra.NFSRelease {
		return
	}
	env.withState(func(st *state.State) {
		o := &st.Outputs.Infra
		o.Release, o.Namespace, o.ChartVersion, o.Revision = rel.Name, rel.Namespace, chartVersion, revision
	})
}

// Prechecks implements Prechecker: the NFS export the provisioner will use
// answers, is exported to this host and takes a root write.
func (InfraStage) Prechecks(_ context.Context, env *Env) []check.Check {
	n := env.Config.Storage.NFS
	return []check.Check{infra.NFSCheck(infra.NFSProbeOptions{
		Server: n.Server, Path: n.Path, PortmapperPort: n.Probe.PortmapperPort, MountPort: n.Probe.MountPort,
		NFSPort: n.Probe.NFSPort, WriteTest: n.Probe.WriteTest, Timeout: n.Probe.Timeout.D(),
	})}
}

// ownCNIRuns is where a cluster with cni.name none (bring your own) stops
// until its CNI runs: a node without one stays NotReady and tainted
// not-ready (kubelet: "container runtime network not ready"), so the NFS
// provisioner and everything after it would wait for ever. With no CNI
// installed it does not wait: the user installs one, then resumes. With
// one installed (a DaemonSet that runs on NotReady nodes) it waits, up to
// cniWait, for the nodes it makes Ready: a resume right after `kubectl
// apply` of the CNI finds its agents still starting.
func ownCNIRuns(ctx context.Context, env *Env, cs kubernetes.Interface, names []string) error {
	missing, notReady, err := kube.NodeStatus(ctx, cs, names)
	if err != nil {
		return fmt.Errorf("reading the nodes: %w", err)
	}
	if len(missing)+len(notReady) == 0 {
		env.UI.OK("all %d node(s) Ready with your CNI", len(names))
		return nil
	}
	agents, err := kube.NetworkAgents(ctx, cs)
	if err != nil {
		return fmt.Errorf("reading the DaemonSets: %w", err)
	}
	if len(agents) > 0 {
		env.Log.Info().Strs("daemonsets", agents).Msgf("your CNI is starting (DaemonSet %s); waiting up to %s for %d node(s) to be Ready", strings.Join(agents, ", "), cniWait, len(names))
		werr := kube.WaitNodesReady(ctx, cs, names, cniWait, env.Log)
		if werr == nil {
			env.UI.OK("all %d node(s) Ready with your CNI", len(names))
			return nil
		}
		if ctx.Err() != nil {
			return werr
		}
		if missing, notReady, err = kube.NodeStatus(ctx, cs, names); err != nil {
			return fmt.Errorf("reading the nodes: %w", err)
		}
		if agents, err = kube.NetworkAgents(ctx, cs); err != nil {
			return fmt.Errorf("reading the DaemonSets: %w", err)
		}
	}
	var why []string
	for _, n := range notReady {
		why = append(why, n+" NotReady")
		if node, err := cs.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{}); err == nil {
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Message != "" {
					why[len(why)-1] += " (" + c.Message + ")"
				}
			}
		}
	}
	for _, n := range missing {
		why = append(why, n+" not registered")
	}
	if len(agents) > 0 {
		return fmt.Errorf("cni.name is none and the nodes are not Ready %s after your CNI was installed (DaemonSet %s): %s. see why its agents do not run (kubectl -n NAMESPACE describe daemonset), then run `bootstrap run --stage infra` (or --stage all) to go on", cniWait, strings.Join(agents, ", "), strings.Join(why, "; "))
	}
	return fmt.Errorf("cni.name is none and the cluster has no pod network yet: %s. install your CNI now (its agent must run on every node), then run `bootstrap run --stage infra` (or --stage all) to go on", strings.Join(why, "; "))
}
