package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/homelab/bootstrap/gitsnap"
	"github.com/homelab/bootstrap/postcheck"
	"github.com/homelab/bootstrap/stages"
	"github.com/homelab/bootstrap/state"
)

// StatusCmd is `bootstrap status`.
type StatusCmd struct {
	Output string `short:"o" default:"text" enum:"text,json" help:"Output format: text or json."`
	All    bool   `help:"List every cluster with state under the config's state directory (one line each: last run, its exit code, the last postcheck)."`
}

// clusterLine is one cluster in `bootstrap status --all`.
type clusterLine struct {
	Cluster   string           `json:"cluster"`
	Updated   time.Time        `json:"updated,omitzero"`
	LastRun   *state.Run       `json:"last_run,omitempty"`
	Postcheck *state.Postcheck `json:"postcheck,omitempty"`
}

// allClusters reads the state of every cluster under root (the config's
// state.dir), sorted by name; a directory without a state file is skipped.
func allClusters(root string) ([]clusterLine, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("listing clusters under %s: %w", root, err)
	}
	var out []clusterLine
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(root, e.Name(), state.FileName)); err != nil {
			continue
		}
		st, err := state.Load(filepath.Join(root, e.Name()), e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, clusterLine{Cluster: st.Cluster, Updated: st.Updated, LastRun: st.LastRun, Postcheck: st.Outputs.Postcheck})
	}
	return out, nil
}

// writeAll prints one line per cluster.
func writeAll(w io.Writer, root string, lines []clusterLine) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "CLUSTER\tLAST RUN\tEXIT\tPOSTCHECK\tUPDATED\n")
	for _, l := range lines {
		run, exit, pc, updated := "never", "-", "never", "-"
		if l.LastRun != nil {
			run = l.LastRun.Command
			exit = fmt.Sprint(l.LastRun.ExitCode)
			if l.LastRun.Finished.IsZero() {
				exit = "running or killed"
			}
		}
		if l.Postcheck != nil {
			pc = fmt.Sprintf("%s (%s)", l.Postcheck.Overall, l.Postcheck.Started.UTC().Format(time.RFC3339))
		}
		if !l.Updated.IsZero() {
			updated = l.Updated.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", l.Cluster, oneLine(run, 40), exit, pc, updated)
	}
	if len(lines) == 0 {
		fmt.Fprintf(tw, "(no cluster has state under %s)\n", root)
	}
	return tw.Flush()
}

// statusReport is the JSON shape of `bootstrap status --output json`.
type statusReport struct {
	Cluster string `json:"cluster"`
	// TalosVersion is the version the config names (nodes report theirs).
	TalosVersion string `json:"talos_version"`
	// KubernetesVersion is the Kubernetes version the config names.
	KubernetesVersion string            `json:"kubernetes_version"`
	StateFile         string            `json:"state_file"`
	Updated           time.Time         `json:"updated,omitzero"`
	Stages            []stageStatus     `json:"stages"`
	LastRun           *state.Run        `json:"last_run,omitempty"`
	Outputs           state.Outputs     `json:"outputs"`
	Paths             map[string]string `json:"paths"`
	Next              string            `json:"next"`
	// SnapshotServer is the git snapshot server the state directory
	// records (started by the flux stage, or standalone with --state-dir).
	SnapshotServer *snapshotServer `json:"snapshot_server,omitempty"`
}

type snapshotServer struct {
	PID        int    `json:"pid"`
	Standalone bool   `json:"standalone"`
	Alive      bool   `json:"alive"`
	URL        string `json:"url"`
	Serving    string `json:"serving,omitempty"`
	Error      string `json:"error,omitempty"`
	Withheld   int    `json:"withheld"`
}

type stageStatus struct {
	Name            string    `json:"name"`
	Status          string    `json:"status"`
	Started         time.Time `json:"started,omitzero"`
	DurationSeconds float64   `json:"duration_seconds,omitempty"`
	Attempts        int       `json:"attempts"`
	Error           string    `json:"error,omitempty"`
}

// Run prints the status. It reads state without taking the lock, so it
// works while a run is in progress.
func (s *StatusCmd) Run(ctx context.Context, a *App) error {
	cfg, err := a.loadConfig()
	if err != nil {
		return err
	}
	paths := cfg.Paths()
	if s.All {
		root := filepath.Dir(paths.StateDir)
		lines, err := allClusters(root)
		if err != nil {
			return err
		}
		if s.Output == "json" {
			enc := json.NewEncoder(a.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(lines)
		}
		return writeAll(a.Stdout, root, lines)
	}
	st, err := state.Load(paths.StateDir, cfg.Cluster.Name)
	if err != nil {
		return err
	}
	kept := stages.KeptFiles(cfg)
	rep := statusReport{
		Cluster: cfg.Cluster.Name, TalosVersion: cfg.Cluster.TalosVersion, KubernetesVersion: cfg.Cluster.KubernetesVersion, StateFile: filepath.Join(paths.StateDir, state.FileName), Updated: st.Updated,
		LastRun: st.LastRun, Outputs: st.Outputs, Next: nextHint(st),
		Paths: map[string]string{"talos_dir": paths.TalosDir, "talosconfig": kept.Path(paths.Talosconfig), "kubeconfig": kept.Path(paths.Kubeconfig), "state_dir": paths.StateDir},
	}
	if gs, err := gitsnap.Check(ctx, paths.StateDir); err == nil && gs.State != nil {
		rep.SnapshotServer = &snapshotServer{PID: gs.State.PID, Standalone: gs.State.Standalone, Alive: gs.Alive, URL: gs.State.URL, Withheld: len(gs.State.Withheld)}
		if gs.ProbeError != nil {
			rep.SnapshotServer.Error = gs.ProbeError.Error()
		} else {
			rep.SnapshotServer.Serving = gs.ServedHash.String()
		}
	}
	for _, name := range stages.Order {
		r := st.Stages[name]
		ss := stageStatus{Name: name, Status: string(r.EffectiveStatus())}
		if r != nil {
			ss.Started, ss.DurationSeconds, ss.Attempts, ss.Error = r.Started, r.DurationSeconds, r.Attempts, r.Error
		}
		rep.Stages = append(rep.Stages, ss)
	}
	if s.Output == "json" {
		enc := json.NewEncoder(a.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return writeStatus(a.Stdout, rep)
}

func writeStatus(w io.Writer, r statusReport) error {
	fmt.Fprintf(w, "Cluster %s  (state %s", r.Cluster, r.StateFile)
	if !r.Updated.IsZero() {
		fmt.Fprintf(w, ", updated %s", r.Updated.Format(time.RFC3339))
	}
	fmt.Fprintln(w, ")")
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STAGE\tSTATUS\tSTARTED\tDURATION\tATTEMPTS\tLAST ERROR")
	for _, s := range r.Stages {
		started, dur := "-", "-"
		if !s.Started.IsZero() {
			started = s.Started.Local().Format("2006-01-02 15:04:05")
		}
		if s.DurationSeconds > 0 {
			dur = roundDuration(time.Duration(s.DurationSeconds * float64(time.Second)))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", s.Name, s.Status, started, dur, s.Attempts, oneLine(s.Error, 80))
	}
	tw.Flush()

	if g := r.SnapshotServer; g != nil {
		how := "started by the flux stage"
		if g.Standalone {
			how = "standalone"
		}
		fmt.Fprintf(w, "\nSnapshot server: pid %d (%s) alive=%v at %s", g.PID, how, g.Alive, g.URL)
		if g.Error != "" {
			fmt.Fprintf(w, ", not answering: %s\n", oneLine(g.Error, 120))
		} else {
			fmt.Fprintf(w, ", serving %s, %d file(s) withheld (bootstrap gitsnap status names them)\n", g.Serving, g.Withheld)
		}
	}

	o := r.Outputs
	if len(o.Nodes) > 0 {
		fmt.Fprintln(w, "\nNodes:")
		names := make([]string, 0, len(o.Nodes))
		for n := range o.Nodes {
			names = append(names, n)
		}
		sort.Strings(names)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, n := range names {
			node := o.Nodes[n]
			version := node.TalosVersion
			if version != "" && version != r.TalosVersion {
				version += " (drift: the config says " + r.TalosVersion + ")"
			}
			k8s := node.KubernetesVersion
			if want := strings.TrimPrefix(r.KubernetesVersion, "v"); k8s != "" && k8s != want {
				k8s += " (drift: the config says " + want + ")"
			}
			if k8s != "" {
				k8s = "Kubernetes " + k8s
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\tvmid %d\t%s\t%s\t%s\n", node.Name, node.Role, node.IP, node.VMID, node.InstallDisk, version, k8s)
		}
		tw.Flush()
	}
	fmt.Fprintln(w, "\nFiles:")
	fmt.Fprintf(w, "  talosconfig  %s\n  kubeconfig   %s\n", r.Paths["talosconfig"], r.Paths["kubeconfig"])
	if o.GitSnapshot.URL != "" {
		fmt.Fprintf(w, "  git snapshot %s (pid %d, %s)\n", o.GitSnapshot.URL, o.GitSnapshot.PID, short(o.GitSnapshot.Hash))
		for _, wh := range o.GitSnapshot.Withheld {
			fmt.Fprintf(w, "    withheld %s\n", wh)
		}
	}
	if pc := o.Postcheck; pc != nil {
		fmt.Fprintf(w, "\nLast postcheck: %s at %s (%d passed, %d warnings, %d failed)\n", strings.ToUpper(pc.Overall), pc.Started.Local().Format("2006-01-02 15:04:05"), pc.Passed, pc.Warned, pc.Failed)
		if pc.Archive != "" {
			fmt.Fprintf(w, "  archive %s\n", pc.Archive)
		}
		if pc.Page != "" {
			fmt.Fprintf(w, "  history %s (the last %d nights; open it in a browser)\n", pc.Page, postcheck.HistoryNights)
		}
	}
	if r.LastRun != nil {
		fmt.Fprintf(w, "\nLast run: %s (exit %d)", r.LastRun.Command, r.LastRun.ExitCode)
		if r.LastRun.LogPath != "" {
			fmt.Fprintf(w, ", log %s", r.LastRun.LogPath)
		}
		fmt.Fprintln(w)
	}
	_, err := fmt.Fprintf(w, "\nNext: %s\n", r.Next)
	return err
}

// nextHint tells the user what to run next.
func nextHint(st *state.State) string {
	if st.LastRun == nil {
		return "bootstrap run --stage all"
	}
	for _, name := range stages.Order {
		switch st.Stage(name).EffectiveStatus() {
		case state.Failed, state.Interrupted:
			return fmt.Sprintf("bootstrap run --resume   (restarts at %s; see `bootstrap run --stage %s --dry-run` first)", name, name)
		}
	}
	for _, name := range stages.Order {
		if st.Stage(name).EffectiveStatus() == state.Never {
			return fmt.Sprintf("bootstrap run --from %s   (%s has never run)", name, name)
		}
	}
	return "bootstrap run --stage postcheck   (all stages ok; this is what the nightly cron runs)"
}

func oneLine(s string, max int) string {
	s = strings.ReplaceAll(strings.TrimSpace(s), "\n", " ")
	if len(s) > max {
		return s[:max-1] + "…"
	}
	return s
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

func roundDuration(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}
