package lab_test

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/gitsnap"
	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/lab"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
	"github.com/homelab/bootstrap/stages"
	"github.com/homelab/bootstrap/state"
	"github.com/homelab/bootstrap/ui"
)

func pipeline() []stages.Stage {
	return []stages.Stage{stages.PrecheckStage{}, stages.ProvisionStage{}, stages.TalosStage{}, stages.InfraStage{}, stages.FluxStage{}, stages.PostcheckStage{}}
}

// TestFullPipelineOnTheLab runs every stage against the lab: simulated
// Proxmox and Talos, a real control plane, real Flux, NFS and Helm. The
// postcheck at the end must pass, and a second run must change nothing.
func TestFullPipelineOnTheLab(t *testing.T) {
	bins := kubetest.Binaries(t)
	for _, k := range []string{"HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"} {
		t.Setenv(k, filepath.Join(t.TempDir(), k))
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	l, err := lab.Start(ctx, lab.Options{Dir: dir, BinDir: bins.Dir, Log: kubetest.Logger(t), ControlPlanes: 1, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Stop(); err != nil {
			t.Errorf("stopping the lab: %v", err)
		}
	})
	cfg, err := config.Load(l.ConfigPath(), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gitsnap.Stop(context.Background(), cfg.Paths().StateDir, 5*time.Second, zerolog.Nop()) })
	st := state.New(cfg.Cluster.Name)
	var out bytes.Buffer
	run := func() *stages.Env {
		t.Helper()
		log := kubetest.Logger(t)
		out.Reset()
		env := &stages.Env{Config: cfg, Paths: cfg.Paths(), State: st, Log: log, UI: ui.NewReporter(log), Out: &out,
			Secrets: &redact.Set{}, Now: time.Now}
		if err := stages.Run(ctx, env, pipeline(), stages.RunInfo{ID: "test"}); err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
		return env
	}
	start := time.Now()
	run()
	t.Logf("pipeline converged in %s\n%s", time.Since(start).Round(100*time.Millisecond), out.String())
	pc := st.Outputs.Postcheck
	if pc == nil || pc.Overall != "pass" && pc.Overall != "warn" || pc.Failed != 0 {
		t.Fatalf("postcheck: %+v\n%s", pc, out.String())
	}
	if !strings.Contains(out.String(), "talos-etcd") || strings.Contains(out.String(), "FAIL") {
		t.Fatalf("postcheck table:\n%s", out.String())
	}

	pveBefore := l.PVE.MutatingCalls()
	start = time.Now()
	env := run()
	t.Logf("converged re-run in %s", time.Since(start).Round(100*time.Millisecond))
	for _, c := range env.Changes() {
		t.Errorf("re-run changed: %s: %s", c.Stage, c.Action)
	}
	if n := l.PVE.MutatingCalls() - pveBefore; n != 0 {
		t.Errorf("re-run made %d mutating Proxmox calls", n)
	}
	for _, n := range l.Talos.Nodes() {
		if c := n.Counters(); c.Applies != 1 || c.Bootstraps > 1 {
			t.Errorf("node %s: %d applies, %d bootstraps", n.Hostname(), c.Applies, c.Bootstraps)
		}
	}
}
