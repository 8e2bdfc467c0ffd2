package stages

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/factory"
	"github.com/homelab/bootstrap/postcheck"
	"github.com/homelab/bootstrap/state"
)

// Namespaces the exit criteria look at.
const (
	FluxNamespace = "flux-system"
	NFSNamespace  = "nfs-provisioner"
)

// PostcheckStage proves the exit criteria: kubeconfig works, every node
// Ready, the NFS class the only default, Flux Ready, a test PVC binds, etcd
// and the Talos API healthy, certificates not about to expire. It changes
// nothing but its own test PVC, so it is safe to run nightly from cron.
type PostcheckStage struct{}

// Name implements Stage.
func (PostcheckStage) Name() string { return Postcheck }

// Run implements Stage.
func (PostcheckStage) Run(ctx context.Context, env *Env) error {
	cfg := env.Config
	start := env.now()
	ctx, cancel := context.WithTimeout(ctx, cfg.Postcheck.Timeout.D())
	defer cancel()

	nodes := make([]postcheck.Node, len(cfg.Nodes))
	for i, n := range cfg.Nodes {
		nodes[i] = postcheck.Node{Name: n.Name, Role: n.Role}
	}
	opts := postcheck.Options{
		Cluster: cfg.Cluster.Name, KubeconfigPath: env.Paths.Kubeconfig, TalosconfigPath: env.Paths.Talosconfig, Files: keptFiles(env),
		Nodes: nodes, StorageClass: cfg.Storage.NFS.StorageClass, PVCNamespace: NFSNamespace,
		PVCTimeout: cfg.Postcheck.PVCTimeout.D(), FluxNamespace: FluxNamespace, FluxName: FluxNamespace,
		CertWarnDays: cfg.Postcheck.CertWarnDays, TalosVersion: cfg.Cluster.TalosVersion, KubernetesVersion: cfg.Cluster.KubernetesVersion, Now: env.Now, Log: env.Log, DryRun: env.DryRun,
		Talos: env.postcheckTalosProbe(ctx), Proxmox: env.postcheckVMProbe(ctx), Observed: &postcheck.Observed{},
		BackupDir: BackupDir(env), BackupMaxAge: cfg.Backup.MaxAge.D(), TakeBackup: env.postcheckBackup(ctx), NewestRemote: env.postcheckRemote(),
		Hosts: cfg.Proxmox.Hosts,
	}
	im := cfg.Images()
	opts.GuestAgent = im.GuestAgent
	if im.InstallerDerived {
		opts.Schematic = im.SchematicID
		opts.SameSchematic = sameImageAs(env)
		for _, e := range im.Schematic.Extensions() {
			opts.Extensions = append(opts.Extensions, factory.ManifestName(e))
		}
	}
	results := check.RunAll(ctx, postcheck.Checks(opts), 4)
	report := postcheck.NewReport(cfg.Cluster.Name, start, env.now().Sub(start), results)
	report.TalosVersions, report.WantTalos = opts.Observed.TalosVersions, cfg.Cluster.TalosVersion
	report.KubeletVersions, report.APIServerVersion, report.WantKubernetes = opts.Observed.KubeletVersions, opts.Observed.APIServerVersion, cfg.Cluster.KubernetesVersion
	report.NewestBackup = opts.Observed.NewestBackup
	report.FluxObjects = opts.Observed.FluxObjects
	report.Extensions = opts.Observed.Extensions
	if err := check.Table(env.Out, results); err != nil {
		return err
	}
	for _, r := range results {
		ev := env.Log.Debug()
		if r.Status == check.Fail {
			ev = env.Log.Error()
		} else if r.Status == check.Warn {
			ev = env.Log.Warn()
		}
		ev.Str("check", r.Name).Str("result", string(r.Status)).Dur("duration", r.Duration).Msg(r.Reason)
	}

	if !env.DryRun {
		// Evidence and the archive are gathered even when ctx ran out: they
		// are what a failed night is debugged from.
		actx, acancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer acancel()
		archive, err := writePostcheckArchive(actx, env, report)
		if err != nil {
			env.UI.Warn("postcheck archive not written: %v", err)
		} else {
			env.UI.OK("postcheck archived to %s", archive)
		}
		if p := cfg.Postcheck.PrometheusFile; p != "" {
			if err := postcheck.WritePrometheus(cfg.PrometheusPath(), report); err != nil {
				env.UI.Warn("Prometheus textfile %s not written: %v", p, err)
			}
		}
		env.State.Outputs.Postcheck = &state.Postcheck{
			Overall: string(report.Overall), Started: report.Started, DurationSeconds: report.DurationSeconds,
			Passed: check.Count(results, check.Pass), Warned: check.Count(results, check.Warn), Failed: check.Count(results, check.Fail),
			Archive: archive,
		}
	}
	if n := check.Count(results, check.Fail); n > 0 {
		return fmt.Errorf("%d of %d postcheck(s) failed", n, len(results))
	}
	return nil
}

// writePostcheckArchive stores the reports, this run's log and the evidence
// as one tar.gz under ai/state/<cluster>/postcheck/<UTC-timestamp>/ and
// keeps the newest postcheck.keep archives.
func writePostcheckArchive(ctx context.Context, env *Env, report postcheck.Report) (string, error) {
	files := postcheck.Evidence(ctx, func() (*rest.Config, error) { return kubeRESTConfig(env) }, FluxNamespace, NFSNamespace)
	js, err := report.JSON()
	if err != nil {
		return "", err
	}
	junit, err := report.JUnit()
	if err != nil {
		return "", err
	}
	files["report.json"], files["junit.xml"], files["metrics.prom"] = js, junit, report.Prometheus()
	if env.LogPath != "" {
		if b, err := os.ReadFile(env.LogPath); err == nil {
			files["run.log"] = b
		}
	}
	dir := filepath.Join(env.Paths.StateDir, "postcheck")
	path, err := postcheck.WriteArchive(dir, report.Started, files)
	if err != nil {
		return "", err
	}
	if _, err := state.KeepNewest(dir, env.Config.Postcheck.Keep); err != nil {
		env.UI.Warn("pruning old postcheck archives: %v", err)
	}
	return path, nil
}
