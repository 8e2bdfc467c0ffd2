package stages

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/factory"
	"github.com/homelab/bootstrap/lab/imagefactory"
	"github.com/homelab/bootstrap/ui"
)

// The precheck row of the Image Factory against the lab factory: a
// schematic it can build passes (and the list is cached), an extension it
// does not offer fails naming it, a Talos version it does not build fails,
// and a factory that cannot be reached warns.
func TestFactoryPrecheck(t *testing.T) {
	f, dir := labFactory(t)
	row := func(extensions, version string) (check.Status, string, *Env) {
		env := factoryEnv(t, f, dir, extensions, version)
		st, why := factoryCheck(env).Run(context.Background())
		return st, why, env
	}
	st, why, env := row("siderolabs/qemu-guest-agent, siderolabs/i915", "v1.13.3")
	if st != check.Pass || !strings.Contains(why, "not registered yet") {
		t.Errorf("pass: %s %s", st, why)
	}
	if _, ok, err := factory.LoadCatalog(env.Paths.StateDir, f.URL(), "v1.13.3"); !ok || err != nil {
		t.Errorf("the list was not cached: %v %v", ok, err)
	}
	if st, why, _ := row("siderolabs/qemu-guest-agent, siderolabs/i9l5", "v1.13.3"); st != check.Fail || !strings.Contains(why, "siderolabs/i9l5") {
		t.Errorf("unknown extension: %s %s", st, why)
	}
	if st, why, _ := row("siderolabs/qemu-guest-agent", "v1.11.0"); st != check.Fail || !strings.Contains(why, "does not build Talos v1.11.0") {
		t.Errorf("unknown version: %s %s", st, why)
	}
	// An upgrade to a version the factory does not build is refused
	// before anything changes (exit 2).
	if err := factoryBuilds(context.Background(), env, "v1.11.0"); err == nil || !config.IsUserError(err) || !strings.Contains(err.Error(), "does not build Talos v1.11.0") {
		t.Errorf("upgrade to an unbuilt version: %v", err)
	}
	if err := factoryBuilds(context.Background(), env, "v1.13.3"); err != nil {
		t.Errorf("upgrade to a built version: %v", err)
	}
	f.SetDown(true)
	if st, why, _ := row("siderolabs/qemu-guest-agent", "v1.13.3"); st != check.Warn || !strings.Contains(why, "unreachable") || !strings.Contains(why, "checked against the list cached") {
		t.Errorf("unreachable: %s %s", st, why)
	}
	if st, why, _ := row("siderolabs/i9l5", "v1.13.3"); st != check.Fail || !strings.Contains(why, "by the cached list") {
		t.Errorf("unreachable with a bad name: %s %s", st, why)
	}
}

// labFactory starts the lab's Image Factory for the test and writes its CA
// as factory-ca.pem into the directory it returns.
func labFactory(t *testing.T) (*imagefactory.Server, string) {
	t.Helper()
	f, err := imagefactory.Start(imagefactory.Options{ISOSize: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Stop() })
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "factory-ca.pem"), f.CAPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	return f, dir
}

// factoryEnv is a run's Env for a one-node cluster whose schematic has the
// extensions, built by the lab factory f (its CA in dir).
func factoryEnv(t *testing.T, f *imagefactory.Server, dir, extensions, version string) *Env {
	t.Helper()
	yaml := `cluster:
  name: lab
  endpoint: https://10.0.20.11:6443
  talosVersion: ` + version + `
  factory: ` + f.URL() + `
  factoryCAFile: factory-ca.pem
  schematic: {extensions: [` + extensions + `]}
  network: {cidr: 10.0.20.0/24, gateway: 10.0.20.1, nameservers: [10.0.20.1]}
nodes:
  - {name: cp-1, role: controlplane, vmid: 701, ip: 10.0.20.11, cores: 2, memoryMiB: 4096, diskGiB: 32}
`
	cfg, err := config.Parse(filepath.Join(dir, "bootstrap.yaml"), []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	log := zerolog.New(zerolog.NewTestWriter(t))
	return &Env{Config: cfg, Paths: cfg.Paths(), Log: log, UI: ui.NewReporter(log), Now: time.Now}
}

// TestSchematicAskedInTheBackground: the talos stage's question whether
// the factory knows the schematic is asked while earlier stages run; a
// known schematic then costs the stage no round trip (it passes with the
// factory gone), and an unknown one is asked again and registered in line.
func TestSchematicAskedInTheBackground(t *testing.T) {
	f, dir := labFactory(t)
	ctx := context.Background()
	prepared := func(env *Env) {
		prepareSchematic(ctx, env)
		<-env.prepared[prepSchematic].done
	}
	first := factoryEnv(t, f, dir, "siderolabs/qemu-guest-agent", "v1.13.3")
	prepared(first)
	if err := ensureSchematic(ctx, first); err != nil {
		t.Fatal(err)
	}
	if len(first.Changes()) != 1 || !strings.Contains(first.Changes()[0].Action, "register schematic") {
		t.Fatalf("an unknown schematic was not registered: %v", first.Changes())
	}
	again := factoryEnv(t, f, dir, "siderolabs/qemu-guest-agent", "v1.13.3")
	prepared(again)
	f.SetDown(true)
	if err := ensureSchematic(ctx, again); err != nil || len(again.Changes()) != 0 {
		t.Fatalf("a schematic the factory knew asked it again: %v %v", err, again.Changes())
	}
	// The answer, or the registration, holds for the rest of the run:
	// the talos stage after provision does not ask again.
	if err := ensureSchematic(ctx, again); err != nil {
		t.Fatalf("asked again later in the run: %v", err)
	}
	f.SetDown(false)
	if err := ensureSchematic(ctx, first); err != nil {
		t.Fatal(err)
	}
	f.SetDown(true)
	if err := ensureSchematic(ctx, first); err != nil || len(first.Changes()) != 1 {
		t.Fatalf("after registering it, the run asked again: %v %v", err, first.Changes())
	}

	// Provision downloads to every member at once: one registration
	// serves them all.
	f.SetDown(false)
	members := factoryEnv(t, f, dir, "siderolabs/qemu-guest-agent,siderolabs/iscsi-tools", "v1.13.3")
	prepared(members)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { errs[i] = ensureSchematic(ctx, members) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil || len(members.Changes()) != 1 {
		t.Errorf("three members at once: %v, changes %v (want one registration)", err, members.Changes())
	}
}
