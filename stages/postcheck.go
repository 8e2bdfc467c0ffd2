package stages

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"k8s.io/client-go/rest"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/factory"
	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/notify"
	"github.com/homelab/bootstrap/postcheck"
	"github.com/homelab/bootstrap/state"
	"github.com/homelab/bootstrap/talos"
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
	var archiveErr error
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
	for _, n := range cfg.Nodes {
		if vols := userVolumes(cfg, n); len(vols) > 0 {
			if opts.UserVolumes == nil {
				opts.UserVolumes = map[string][]talos.UserVolume{}
			}
			opts.UserVolumes[n.Name] = vols
		}
	}
	opts.Security = securityWants(cfg)
	im := cfg.Images()
	opts.GuestAgent = im.GuestAgent
	if im.InstallerDerived {
		opts.Schematic = im.SchematicID
		opts.SameSchematic = sameImageAs(env)
		for _, e := range im.Schematic.Extensions() {
			opts.Extensions = append(opts.Extensions, factory.ManifestName(e))
		}
	}
	checks := append(postcheck.Checks(opts), check.Check{Name: postcheck.CheckArchive, Run: func(context.Context) (check.Status, string) {
		return archiveWritable(env)
	}})
	results := runPostchecks(ctx, env, checks)
	report := postcheck.NewReport(cfg.Cluster.Name, start, env.now().Sub(start), results)
	report.TalosVersions, report.WantTalos = opts.Observed.TalosVersions, cfg.Cluster.TalosVersion
	report.KubeletVersions, report.APIServerVersion, report.WantKubernetes = opts.Observed.KubeletVersions, opts.Observed.APIServerVersion, cfg.Cluster.KubernetesVersion
	report.NewestBackup = opts.Observed.NewestBackup
	report.FluxObjects = opts.Observed.FluxObjects
	report.Extensions = opts.Observed.Extensions
	report.SetCauses(opts.Observed.Causes)
	// What a person reads (the table, the log) says what to do next on
	// each row that did not pass; report.json carries it as next.
	shown := postcheck.WithNext(cfg.Cluster.Name, results, opts.Observed.Causes)
	if err := check.Table(env.Out, shown); err != nil {
		return err
	}
	for _, r := range shown {
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
			// The night's evidence is lost: the run fails, even when
			// every check passed (the archive row could write a moment
			// ago, so this is rare: the disk filled up in between).
			archiveErr = fmt.Errorf("postcheck archive not written: %w", err)
		} else {
			env.UI.OK("postcheck archived to %s", archive)
		}
		if p := cfg.Postcheck.PrometheusFile; p != "" {
			if err := postcheck.WritePrometheus(cfg.PrometheusPath(), report); err != nil {
				env.UI.Warn("Prometheus textfile %s not written: %v", p, err)
			}
		}
		// The history page: the last nights at a glance, rewritten each
		// night from the archives kept (this one included).
		page, err := postcheck.WriteHistory(filepath.Join(env.Paths.StateDir, "postcheck"), cfg.Cluster.Name, env.now())
		if err != nil {
			env.UI.Warn("postcheck history page not written: %v", err)
			page = ""
		} else {
			env.UI.OK("postcheck history: %s", page)
		}
		var prev check.Status
		var unsent []string
		if pc := env.State.Outputs.Postcheck; pc != nil {
			prev, unsent = check.Status(pc.Overall), pc.Unsent
		}
		var sent []string
		sent, unsent = notifyNight(env, prev, unsent, report, archive, page)
		if archive != "" && len(sent)+len(unsent) > 0 {
			// The page was written before the notifications went out (they
			// name it): written again with tonight's marker.
			if err := postcheck.WriteNotified(archive, postcheck.Notified{Sent: sent, Failed: unsent}); err != nil {
				env.UI.Warn("the night's notifications not recorded for the history page: %v", err)
			} else if page != "" {
				if _, err := postcheck.WriteHistory(filepath.Join(env.Paths.StateDir, "postcheck"), cfg.Cluster.Name, env.now()); err != nil {
					env.UI.Warn("postcheck history page not written: %v", err)
				}
			}
		}
		env.State.Outputs.Postcheck = &state.Postcheck{
			Overall: string(report.Overall), Started: report.Started, DurationSeconds: report.DurationSeconds,
			Passed: check.Count(results, check.Pass), Warned: check.Count(results, check.Warn), Failed: check.Count(results, check.Fail),
			Archive: archive, Page: page, Unsent: unsent,
		}
	}
	if n := check.Count(results, check.Fail); n > 0 {
		return fmt.Errorf("%d of %d postcheck(s) failed", n, len(results))
	}
	return archiveErr
}

// runPostchecks runs the checks and puts on their rows what the stage
// logged as a warning meanwhile (postcheck.WithWarnings): a line logged
// through env.inCheck on its check's row, any other on the run-warnings
// row. The lines are read back from env.Warnings, masked as the log is.
func runPostchecks(ctx context.Context, env *Env, checks []check.Check) []check.Result {
	mark := env.Warnings.Mark()
	results := check.RunAll(ctx, checks, 4)
	var warned []postcheck.Warning
	for _, w := range env.Warnings.Since(mark) {
		// Stages running beside this one warn about their own work.
		if env.stage != "" && w.Stage != env.stage {
			continue
		}
		warned = append(warned, postcheck.Warning{Check: w.Check, Text: w.Text})
	}
	return postcheck.WithWarnings(results, warned)
}

// archiveWritable is the archive row: the directory the night's archive
// goes to takes a file now (created if missing, a probe written, synced
// and removed), so a state directory that is not a directory, read-only
// or full fails the night instead of losing its evidence quietly.
func archiveWritable(env *Env) (check.Status, string) {
	dir := filepath.Join(env.Paths.StateDir, "postcheck")
	if env.DryRun {
		return check.Passf("not probed in a dry run (it writes nothing); archives go to %s", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return check.Failf("the archive cannot be written: %v", err)
	}
	f, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return check.Failf("the archive cannot be written to %s: %v", dir, err)
	}
	_, werr := f.Write([]byte("probe\n"))
	serr := f.Sync()
	cerr := f.Close()
	_ = os.Remove(f.Name())
	if err := errors.Join(werr, serr, cerr); err != nil {
		return check.Failf("the archive cannot be written to %s: %v", dir, err)
	}
	return check.Passf("archives go to %s (keeping %d)", dir, env.Config.Postcheck.Keep)
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
	// The archive is read by people and sent around: every file of it
	// through the masking every log line goes through.
	mask := env.Secrets
	if mask == nil {
		mask = &redact.Set{}
	}
	for name, b := range files {
		files[name] = mask.Bytes(b)
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

// notifyNight sends the night's result to postcheck.notify's URLs when it
// changed (or on every failure with everyFailure), and to those a previous
// night could not reach (pending, by notify.Label) whatever the result: a
// change is never lost to one failed send. A notification that cannot be
// sent is a warning: the night's verdict stands. It returns the labels
// sent, and those still unsent (for the state).
func notifyNight(env *Env, prev check.Status, pending []string, report postcheck.Report, archive, page string) (sent, unsent []string) {
	n := env.Config.Postcheck.Notify
	if n.URLsFile == "" && n.URLsEnv == "" {
		return nil, nil
	}
	urls, err := env.Config.NotifyURLs()
	if err != nil {
		env.UI.Warn("notifications not sent: %v", err)
		return nil, pending
	}
	if len(urls) == 0 {
		env.UI.Warn("notifications not sent: %s names no URL", n.URLsEnv)
		return nil, pending
	}
	due := postcheck.ShouldNotify(prev, report, n.EveryFailure)
	var idx []int
	for i, u := range urls {
		if due || slices.Contains(pending, notify.Label(i, u)) {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		env.Log.Debug().Str("previous", string(prev)).Str("overall", string(report.Overall)).Msg("result unchanged: no notification")
		return nil, nil
	}
	if !due {
		env.Log.Info().Strs("notifications", pending).Msg("sending again what the last run could not send")
	}
	title, body := postcheck.Message(report, archive, page)
	if env.Secrets != nil {
		// The reasons went through the log's masking; the message goes
		// elsewhere, so through the same set.
		title, body = env.Secrets.String(title), env.Secrets.String(body)
	}
	send := make([]string, len(idx))
	for j, i := range idx {
		send[j] = urls[i]
	}
	for j, r := range notify.Send(send, title, body) {
		// Named by its position in the whole list, as the state keeps it.
		label := notify.Label(idx[j], send[j])
		if r.Err != nil {
			env.UI.Warn("%s not sent: %v (sent again on the next run)", label, r.Err)
			unsent = append(unsent, label)
			continue
		}
		env.UI.OK("%s sent (%s)", label, wait.Round(r.Took))
		sent = append(sent, label)
	}
	return sent, unsent
}
