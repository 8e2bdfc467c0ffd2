package config

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// examplesDir is examples/envs in this checkout.
func examplesDir(t *testing.T) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the repository")
	}
	return filepath.Join(filepath.Dir(file), "..", "examples", "envs")
}

// The shipped environments validate: each extends base.yaml, names its own
// cluster and nodes (a list replaces the base's), keeps the base's other
// values, and the base's patch path still names examples/envs/patches.
func TestExampleEnvironments(t *testing.T) {
	dir := examplesDir(t)
	common, _ := filepath.Abs(filepath.Join(dir, "patches", "common.yaml"))
	for env, nodes := range map[string]int{"dev": 2, "prod": 5} {
		path := filepath.Join(dir, env, "bootstrap.yaml")
		cfg, err := Load(path, noEnv)
		if err != nil {
			t.Fatalf("%s does not validate:\n%v", env, err)
		}
		if cfg.Cluster.Name != env || len(cfg.Nodes) != nodes || cfg.Cluster.TalosVersion != "v1.13.3" {
			t.Errorf("%s: cluster %s, %d nodes, talos %s", env, cfg.Cluster.Name, len(cfg.Nodes), cfg.Cluster.TalosVersion)
		}
		if got := cfg.Cluster.Patches.All; len(got) != 1 || cfg.Resolve(got[0]) != common {
			t.Errorf("%s: patches.all %v resolve to %v, want %s", env, got, cfg.Resolve(got[0]), common)
		}
		if files := cfg.Files(); len(files) != 2 || filepath.Base(files[1]) != "base.yaml" {
			t.Errorf("%s: files %v", env, files)
		}
		out, err := cfg.Render()
		if err != nil || strings.Contains(string(out), "extends:") || !strings.Contains(string(out), "name: "+env) || !strings.Contains(string(out), "../patches/common.yaml") {
			t.Errorf("%s: render %v:\n%s", env, err, out)
		}
	}
}

// A value that comes from the base is reported in the base's file, at its
// line; bases that loop, a missing base and a non-string extends are
// errors naming the file and the extends line.
func TestExtendsErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	base := string(Example)
	base = strings.Replace(base, "  talosVersion: v1.13.3\n", "  talosVersion: v1.13\n", 1)
	basePath := write("base.yaml", base)
	env := write("env/bootstrap.yaml", "extends: ../base.yaml\ncluster:\n  name: env\n")
	_, err := Load(env, noEnv)
	if err == nil || !strings.Contains(err.Error(), basePath) || !strings.Contains(err.Error(), "cluster.talosVersion") {
		t.Fatalf("a bad base value: %v", err)
	}
	var errs *Errors
	if !errors.As(err, &errs) {
		t.Fatalf("not field errors: %v", err)
	}
	for _, fe := range errs.Items {
		if fe.Path == "cluster.talosVersion" && (fe.File != basePath || fe.Line != strings.Count(base[:strings.Index(base, "talosVersion: v1.13\n")], "\n")+1) {
			t.Errorf("talosVersion reported at %s:%d", fe.File, fe.Line)
		}
	}

	write("a.yaml", "extends: b.yaml\n")
	write("b.yaml", "extends: a.yaml\n")
	if _, err := Load(filepath.Join(dir, "a.yaml"), noEnv); err == nil || !strings.Contains(err.Error(), "extends itself") {
		t.Errorf("a loop: %v", err)
	}
	if _, err := Load(write("c.yaml", "extends: nowhere.yaml\n"), noEnv); err == nil || !strings.Contains(err.Error(), "c.yaml:1") || !strings.Contains(err.Error(), "reading the base nowhere.yaml") {
		t.Errorf("a missing base: %v", err)
	}
	if _, err := Load(write("dup.yaml", "extends: base.yaml\ncluster:\n  name: a\ncluster:\n  name: b\n"), noEnv); err == nil || !strings.Contains(err.Error(), "dup.yaml:4") {
		t.Errorf("a key repeated in the extending file: %v", err)
	}
	if _, err := Load(write("d.yaml", "extends: [x]\n"), noEnv); err == nil || !strings.Contains(err.Error(), "expected the path of a base config file") {
		t.Errorf("a list as extends: %v", err)
	}
}
