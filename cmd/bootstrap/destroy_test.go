package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/proxmox/pvesim"
	"github.com/homelab/bootstrap/stages"
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
	if code, out := run("no\n", "destroy"); code != stages.ExitFailed || !strings.Contains(out, "destroy aborted") {
		t.Fatalf("declined: exit %d\n%s", code, out)
	}
	if got := len(sim.VMIDs()); got != 3 {
		t.Fatalf("nothing may be deleted before confirmation: %v", sim.VMIDs())
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
	if strings.Contains(out, secret) {
		t.Fatal("the token secret leaked into the output")
	}
}
