package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/lab/pvesim"
	"github.com/homelab/bootstrap/stages"
	"github.com/homelab/bootstrap/state"
)

func TestDestroyCommand(t *testing.T) {
	sim, err := pvesim.New(pvesim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	id, secret := sim.Token()
	cfg := string(config.Example)
	for old, repl := range map[string]string{
		"https://pve.lan:8006/api2/json": sim.APIURL(),
		"bootstrap@pve!homelab":          id,
		"00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD:EE:FF:00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD:EE:FF": sim.Fingerprint(),
	} {
		if !strings.Contains(cfg, old) {
			t.Fatalf("example config has no %q", old)
		}
		cfg = strings.ReplaceAll(cfg, old, repl)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "bootstrap.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	for vmid, tags := range map[int]string{701: "talos;bootstrap-homelab;controlplane", 711: "talos;bootstrap-homelab;worker", 650: "dns"} {
		if err := sim.SeedVM(vmid, map[string]string{"tags": tags, "scsi0": "local-lvm:8"}, true); err != nil {
			t.Fatal(err)
		}
	}
	// The cluster's VM 702 runs on another node, pve2: destroy finds it
	// in /cluster/resources and destroys it there. VM 701 is HA-managed:
	// its stop only queues, and its delete must purge it from HA.
	sim.SeedGuest(pvesim.GuestSpec{VMID: 702, Type: "qemu", Node: "pve2", Name: "cp-2", Tags: "talos;bootstrap-homelab;controlplane", Status: "running"})
	if err := sim.SetHAManaged(701, true); err != nil {
		t.Fatal(err)
	}
	run := func(stdin string, args ...string) (int, string) {
		var out, errb bytes.Buffer
		app := &App{Stdout: &out, Stderr: &errb, LookupEnv: func(k string) (string, bool) {
			if k == config.EnvTokenSecret {
				return secret, true
			}
			return "", false
		}, Stages: registeredStages}
		if stdin != "" {
			app.Stdin = strings.NewReader(stdin)
		}
		code := app.Main(context.Background(), append([]string{"--config", path, "--log-format", "json"}, args...))
		return code, out.String() + errb.String()
	}

	if code, out := run("", "destroy"); code != stages.ExitUsage || !strings.Contains(out, "pass --yes") {
		t.Fatalf("no terminal, no --yes: exit %d\n%s", code, out)
	}
	if code, out := run("no\n", "destroy"); code != stages.ExitFailed || !strings.Contains(out, "aborted: nothing was changed") {
		t.Fatalf("declined: exit %d\n%s", code, out)
	}
	if got := len(sim.VMIDs()); got != 3 {
		t.Fatalf("nothing may be deleted before confirmation: %v", sim.VMIDs())
	}
	// What a provisioned cluster has recorded: its nodes' facts and its
	// Talos directory.
	loaded, err := config.Load(path, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	paths := loaded.Paths()
	st := state.New(loaded.Cluster.Name)
	st.Outputs.Nodes = map[string]state.Node{"cp-1": {Name: "cp-1", VMID: 701}, "cp-2": {Name: "cp-2", VMID: 702}, "w-1": {Name: "w-1", VMID: 711}}
	if err := st.Save(paths.StateDir, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(paths.TalosDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if code, out := run("", "destroy", "--dry-run"); code != 0 || !strings.Contains(out, "would stop and delete VM 701") {
		t.Fatalf("dry run: exit %d\n%s", code, out)
	}
	code, out := run("", "destroy", "--yes")
	if code != 0 {
		t.Fatalf("destroy --yes: exit %d\n%s", code, out)
	}
	if got := sim.VMIDs(); len(got) != 1 || got[0] != 650 {
		t.Fatalf("left %v\n%s", got, out)
	}
	if _, ok := sim.Guest(702); ok {
		t.Fatalf("VM 702 on node pve2 must be destroyed there, not dropped as gone:\n%s", out)
	}
	if sim.HAManaged(701) {
		t.Fatal("VM 701 is still an HA resource")
	}
	if strings.Contains(out, secret) {
		t.Fatal("the token secret leaked into the output")
	}
	if st, err := state.Load(paths.StateDir, loaded.Cluster.Name); err != nil || len(st.Outputs.Nodes) != 0 {
		t.Errorf("node facts must go with their VMs: %v %+v", err, st.Outputs.Nodes)
	}
	if _, err := os.Stat(paths.TalosDir); err != nil {
		t.Errorf("secrets must be kept without --purge-secrets: %v", err)
	}
	if code, out := run("", "destroy", "--yes", "--purge-secrets"); code != 0 {
		t.Fatalf("destroy --purge-secrets: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(paths.TalosDir); !os.IsNotExist(err) {
		t.Errorf("--purge-secrets must delete %s: %v", paths.TalosDir, err)
	}
}
