package config

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"filippo.io/age"
	"go.yaml.in/yaml/v3"

	"github.com/homelab/bootstrap/sops"
)

var update = flag.Bool("update", false, "rewrite golden files")

func noEnv(string) (string, bool) { return "", false }

func envMap(m map[string]string) LookupEnv {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestExampleIsValid(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, DefaultFile)
	if err := os.WriteFile(p, Example, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(p, noEnv)
	if err != nil {
		t.Fatalf("example config does not validate:\n%v", err)
	}
	if cfg.Cluster.Name != "homelab" || len(cfg.Nodes) != 2 {
		t.Fatalf("example decoded wrongly: %+v", cfg.Cluster)
	}
}

// TestExampleIsComplete keeps `config init` honest: every field of the
// config types appears in the example with a value.
func TestExampleIsComplete(t *testing.T) {
	var doc map[string]any
	if err := yaml.Unmarshal(Example, &doc); err != nil {
		t.Fatal(err)
	}
	// A list of structs may be empty where it is optional (proxmox.vm's
	// disks) when an item of the same list elsewhere shows its fields
	// (a node's vm.disks): a field counts once it appears at any path of
	// its type.
	var missing []string
	seen := map[string]bool{}
	var walk func(t reflect.Type, v any, path string)
	walk = func(t reflect.Type, v any, path string) {
		if t.Kind() != reflect.Struct || t == durationType {
			return
		}
		m, _ := v.(map[string]any)
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name := strings.Split(f.Tag.Get("yaml"), ",")[0]
			if !f.IsExported() || name == "" {
				continue
			}
			key := t.Name() + "." + f.Name
			sub, ok := m[name]
			if !ok {
				missing = append(missing, key+" ("+path+name+")")
				continue
			}
			ft := f.Type
			if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
				items, _ := sub.([]any)
				if len(items) == 0 && sub != nil {
					// An empty list (pci: [], where an item would give
					// every VM a device) must show its item in a comment.
					for j := 0; j < ft.Elem().NumField(); j++ {
						field := strings.Split(ft.Elem().Field(j).Tag.Get("yaml"), ",")[0]
						if !regexp.MustCompile(`(?m)^\s*#.*\b` + field + `: `).Match(Example) {
							missing = append(missing, path+name+"[0]."+field+" (in a comment)")
						}
					}
					continue
				}
				if len(items) == 0 {
					missing = append(missing, key+" ("+path+name+"[0])")
					continue
				}
				seen[key] = true
				for j, item := range items {
					walk(ft.Elem(), item, fmt.Sprintf("%s%s[%d].", path, name, j))
				}
				continue
			}
			seen[key] = true
			walk(ft, sub, path+name+".")
		}
	}
	walk(reflect.TypeFor[Config](), doc, "")
	var lacking []string
	for _, m := range missing {
		if key, _, _ := strings.Cut(m, " "); !seen[key] && !slices.Contains(lacking, m) {
			lacking = append(lacking, m)
		}
	}
	if len(lacking) > 0 {
		t.Fatalf("example.yaml lacks: %s", strings.Join(lacking, ", "))
	}
}

func TestGoodConfigs(t *testing.T) {
	files, _ := filepath.Glob("testdata/good/*.yaml")
	if len(files) == 0 {
		t.Fatal("no good configs")
	}
	for _, f := range files {
		cfg, err := Load(f, noEnv)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if len(cfg.ControlPlanes()) != 3 || len(cfg.Workers()) != 2 {
			t.Errorf("%s: roles decoded wrongly", f)
		}
		if cfg.Proxmox.Parallelism != 4 || cfg.Storage.NFS.StorageClass != DefaultStorageClass {
			t.Errorf("%s: defaults not kept under absent keys", f)
		}
	}
}

// TestBadConfigs runs the corpus of broken configs: each must fail as a user
// error whose text (field paths, positions, fixes) matches its golden file.
func TestBadConfigs(t *testing.T) {
	secureCorpusFiles(t, "testdata/bad/files")
	// No age identity from this machine's own ~/.config/sops.
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	files, _ := filepath.Glob("testdata/bad/*.yaml")
	if len(files) < 60 {
		t.Fatalf("bad-config corpus has %d entries, want at least 25", len(files))
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			_, err := Load(f, noEnv)
			if err == nil {
				t.Fatal("accepted a bad config")
			}
			if !IsUserError(err) {
				t.Fatalf("not a user error: %T %v", err, err)
			}
			got := err.Error() + "\n"
			noMarker(t, got)
			golden := strings.TrimSuffix(f, ".yaml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("missing golden file (run with -update): %v", err)
			}
			if got != string(want) {
				t.Fatalf("error output changed:\n--- got\n%s--- want\n%s", got, want)
			}
		})
	}
}

func TestEnvOverrides(t *testing.T) {
	env := envMap(map[string]string{
		EnvClusterName: "other", EnvGitRepo: "https://git.example.com/x.git", EnvGitBranch: "dev",
		EnvLocalSnapshot: "1", EnvTalosDir: "/tmp/talos-other", EnvKubeconfig: "kube/cfg",
		EnvTokenSecret: "s3cret-value",
	})
	cfg, err := Parse("testdata/good/three-plus-two.yaml", mustRead(t, "testdata/good/three-plus-two.yaml"), env)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Cluster.Name != "other" || cfg.Flux.Repo != "https://git.example.com/x.git" || cfg.Flux.Branch != "dev" || !cfg.Flux.LocalSnapshot.Enabled {
		t.Fatalf("overrides not applied: %+v %+v", cfg.Cluster, cfg.Flux)
	}
	p := cfg.Paths()
	if p.TalosDir != "/tmp/talos-other" || !strings.HasSuffix(p.Kubeconfig, "config/testdata/good/kube/cfg") || !strings.HasSuffix(p.StateDir, "ai/state/other") {
		t.Fatalf("paths: %+v", p)
	}
	if s, err := cfg.ProxmoxTokenSecret(); err != nil || s != "s3cret-value" {
		t.Fatalf("token secret: %q %v", s, err)
	}
	if src, ok := cfg.FromEnv("cluster.name"); !ok || src != EnvClusterName {
		t.Fatal("env source not recorded")
	}

	_, err = Parse("x.yaml", mustRead(t, "testdata/good/three-plus-two.yaml"), envMap(map[string]string{EnvLocalSnapshot: "maybe"}))
	var fe *Errors
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "flux.localSnapshot.enabled") {
		t.Fatalf("bad boolean env not reported: %v", err)
	}
}

func TestTokenSecretFile(t *testing.T) {
	cfg, err := Parse("testdata/good/three-plus-two.yaml", mustRead(t, "testdata/good/three-plus-two.yaml"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cfg.ProxmoxTokenSecret(); err == nil || !IsUserError(err) || !strings.Contains(err.Error(), EnvTokenSecret) {
		t.Fatalf("missing secret must be a user error naming the variable: %v", err)
	}
	f := filepath.Join(t.TempDir(), "token")
	os.WriteFile(f, []byte("file-secret\n"), 0o600)
	cfg.Proxmox.TokenSecretFile = f
	if s, err := cfg.ProxmoxTokenSecret(); err != nil || s != "file-secret" {
		t.Fatalf("%q %v", s, err)
	}
}

func TestSchema(t *testing.T) {
	b, err := Schema()
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Properties map[string]struct {
			Properties map[string]map[string]any `json:"properties"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	var top []string
	for k := range s.Properties {
		top = append(top, k)
	}
	sort.Strings(top)
	if strings.Join(top, ",") != "backup,cluster,cni,extends,flux,nodes,postcheck,proxmox,secrets,state,storage" {
		t.Fatalf("top-level properties: %v", top)
	}
	vlan := s.Properties["proxmox"].Properties["vlan"]
	if vlan["type"] != "integer" || vlan["description"] == nil {
		t.Fatalf("proxmox.vlan schema: %v", vlan)
	}
	if d := s.Properties["proxmox"].Properties["taskTimeout"]["default"]; d != "10m0s" {
		t.Fatalf("duration default: %v", d)
	}
	if _, ok := s.Properties["proxmox"].Properties["tokenSecret"]; ok {
		t.Fatal("schema must not offer a secret field")
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReferenceDoc keeps docs/config.md in step with the types.
func TestReferenceDoc(t *testing.T) {
	path := filepath.Join("..", "docs", "config.md")
	got := Reference()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, _ := os.ReadFile(path)
	if got != string(want) {
		t.Fatalf("docs/config.md is stale: run go test ./config -run TestReferenceDoc -update")
	}
	for _, key := range []string{"`nodes[].vmid`", "`flux.localSnapshot.url`", "`storage.nfs.chartVersion` | string | `4.0.18`"} {
		if !strings.Contains(got, key) {
			t.Fatalf("reference lacks %s", key)
		}
	}
}

// Talos deploys flannel itself; with cilium or none no CNI runs until one
// is installed, and the talos stage's health wait must not wait for Ready
// nodes or CoreDNS (talosctl health skips both then).
func TestTalosDeploysCNI(t *testing.T) {
	for name, want := range map[string]bool{"": true, "flannel": true, "cilium": false, "none": false} {
		if got := (CNI{Name: name}).TalosDeploysCNI(); got != want {
			t.Errorf("cni %q: TalosDeploysCNI %v, want %v", name, got, want)
		}
	}
}

// TestProtected: the paths a snapshot must never serve follow the config's
// own state, Talos and credential locations, resolved like every path.
func TestProtected(t *testing.T) {
	env := envMap(map[string]string{EnvTalosDir: "/tmp/talos-other", EnvKubeconfig: "kube/cfg"})
	cfg, err := Parse("testdata/good/three-plus-two.yaml", mustRead(t, "testdata/good/three-plus-two.yaml"), env)
	if err != nil {
		t.Fatal(err)
	}
	cfg.State.Dir, cfg.State.TalosDir = "var/state", "secrets/talos"
	cfg.Proxmox.TokenSecretFile = "creds/pve-token"
	cfg.Flux.Auth.SSHKeyFile = "/home/u/.ssh/deploy"
	cfg.Backup.CopyDir = "backups"
	base := cfg.Paths().Base
	got := cfg.Protected()
	for _, want := range []string{
		filepath.Join(base, "var", "state"), filepath.Join(base, "secrets", "talos"), "/tmp/talos-other",
		filepath.Join(base, "var", "state", cfg.Cluster.Name), filepath.Join(base, "kube", "cfg"), filepath.Join(base, "kube", "cfg.age"),
		filepath.Join(base, "backups"), filepath.Join(base, "creds", "pve-token"), "/home/u/.ssh/deploy",
	} {
		if !slices.Contains(got, want) {
			t.Errorf("Protected() = %v, missing %s", got, want)
		}
	}
	if slices.Contains(got, "") {
		t.Errorf("Protected() holds an empty path: %q", got)
	}
}

// secureCorpusFiles gives the corpus's credential files the 0600 a user's
// would have (git checks every file out 0644); a file whose name says
// world-readable keeps 0644 for the case about exactly that.
func secureCorpusFiles(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		mode := os.FileMode(0o600)
		if strings.Contains(e.Name(), "world-readable") {
			mode = 0o644
		}
		if err := os.Chmod(filepath.Join(dir, e.Name()), mode); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStateDirsOverlap: run state and Talos files in one directory, or
// one inside the other, is warned about; apart, nothing is said.
func TestStateDirsOverlap(t *testing.T) {
	for _, tc := range []struct {
		dir, talos string
		warn       bool
	}{
		{"ai/state", ".talos", false},
		{"state", "state", true},
		{"state", "state/talos", true},
		{"/srv/bootstrap", "/srv", true},
	} {
		cfg, err := Parse("testdata/good/three-plus-two.yaml", mustRead(t, "testdata/good/three-plus-two.yaml"), noEnv)
		if err != nil {
			t.Fatal(err)
		}
		cfg.State.Dir, cfg.State.TalosDir = tc.dir, tc.talos
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%s + %s: %v", tc.dir, tc.talos, err)
		}
		warned := false
		for _, w := range cfg.Warnings() {
			if strings.HasPrefix(w.Path, "state.talosDir") {
				warned = true
			}
		}
		if warned != tc.warn {
			t.Errorf("state.dir %s, talosDir %s: warned %v, want %v", tc.dir, tc.talos, warned, tc.warn)
		}
	}
}

// TestSSHKeyWithHTTPSRepoWarns: a deploy key configured for an https://
// repository is never used; validate says so and still passes.
func TestSSHKeyWithHTTPSRepoWarns(t *testing.T) {
	cfg, err := Parse("testdata/good/three-plus-two.yaml", mustRead(t, "testdata/good/three-plus-two.yaml"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(t.TempDir(), "deploy_key")
	b, err := os.ReadFile("testdata/bad/files/deploy_key")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Flux.Repo, cfg.Flux.Auth.SSHKeyFile = "https://git.example.com/homelab.git", key
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, w := range cfg.Warnings() {
		if w.Path == "flux.auth.sshKeyFile" && strings.Contains(w.Msg, "not used") {
			found = true
		}
	}
	if !found {
		t.Errorf("no warning about the unused SSH key: %v", cfg.Warnings())
	}
}

// A .sops.yaml creation rule for the secrets bundle is followed when it is
// sealed; one the tool cannot follow (a PGP key), or one whose key groups
// the key file does not open, fails config validate.
func TestBundleCreationRuleIsValidated(t *testing.T) {
	dir := t.TempDir()
	if err := os.CopyFS(filepath.Join(dir, "patches"), os.DirFS("testdata/good/patches")); err != nil {
		t.Fatal(err)
	}
	mine, myRec, _ := sops.GenerateIdentity()
	_, otherRec, _ := sops.GenerateIdentity()
	keyFile := filepath.Join(dir, "age.key")
	if err := os.WriteFile(keyFile, []byte(mine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := string(mustRead(t, "testdata/good/three-plus-two.yaml")) + "secrets:\n  age:\n    recipients: [" + myRec + "]\n    keyFile: age.key\n"
	cfgPath := filepath.Join(dir, "bootstrap.yaml")
	for _, tc := range []struct{ name, rules, want string }{
		{"no .sops.yaml", "", ""},
		{"a rule for other files", "creation_rules:\n  - path_regex: ^clusters/\n    pgp: FBC7B9E2A4F9289AC0C1D4843D16CEE4A27381B4\n", ""},
		{"a PGP rule for the bundle", "creation_rules:\n  - path_regex: secrets\\.yaml$\n    pgp: FBC7B9E2A4F9289AC0C1D4843D16CEE4A27381B4\n", "secrets.age.recipients"},
		{"groups the key file opens", "creation_rules:\n  - path_regex: secrets\\.yaml$\n    shamir_threshold: 1\n    key_groups:\n      - age: [" + myRec + "]\n      - age: [" + otherRec + "]\n", ""},
		{"groups it does not", "creation_rules:\n  - path_regex: secrets\\.yaml$\n    key_groups:\n      - age: [" + myRec + "]\n      - age: [" + otherRec + "]\n", "secrets.age.keyFile"},
	} {
		os.Remove(filepath.Join(dir, ".sops.yaml"))
		if tc.rules != "" {
			if err := os.WriteFile(filepath.Join(dir, ".sops.yaml"), []byte(tc.rules), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		cfg, err := Parse(cfgPath, []byte(base), noEnv)
		if err != nil {
			t.Fatal(err)
		}
		wantValid(t, tc.name, cfg, tc.want)
	}
}

// Post-quantum age keys (age-keygen -pq; sops v3.12 and later, what
// kustomize-controller v1.9.5 decrypts with) validate: a recipient
// age1pq1…, a key file holding AGE-SECRET-KEY-PQ-1… beside a classic
// identity, and PQ backup recipients. A mix of kinds in one list that age
// seals whole files to is refused, naming the field.
func TestPostQuantumAgeKeysValidate(t *testing.T) {
	dir := t.TempDir()
	if err := os.CopyFS(filepath.Join(dir, "patches"), os.DirFS("testdata/good/patches")); err != nil {
		t.Fatal(err)
	}
	pq, err := age.GenerateHybridIdentity()
	if err != nil {
		t.Fatal(err)
	}
	classic, classicRec, _ := sops.GenerateIdentity()
	keyFile := filepath.Join(dir, "age.key")
	if err := os.WriteFile(keyFile, []byte("# classic\n"+classic+"\n# post-quantum\n"+pq.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "copies"), 0o700); err != nil {
		t.Fatal(err)
	}
	good := string(mustRead(t, "testdata/good/three-plus-two.yaml"))
	cfgPath := filepath.Join(dir, "bootstrap.yaml")
	for _, tc := range []struct{ name, extra, want string }{
		{"PQ recipient and key file", "secrets:\n  age:\n    recipients: [" + pq.Recipient().String() + "]\n    keyFile: age.key\n", ""},
		{"PQ backup recipients", "backup:\n  copyDir: copies\n  ageRecipients: [" + pq.Recipient().String() + "]\n", ""},
		{"mixed bundle recipients", "secrets:\n  age:\n    recipients: [" + pq.Recipient().String() + ", " + classicRec + "]\n    keyFile: age.key\n", "secrets.age.recipients: post-quantum"},
		{"mixed backup recipients", "backup:\n  copyDir: copies\n  ageRecipients: [" + classicRec + ", " + pq.Recipient().String() + "]\n", "backup.ageRecipients: post-quantum"},
		// The sops-age Secret of a Flux before v2.9 cannot hold one.
		{"PQ identity for Flux v2.8", "  version: v2.8.1\n  decryption: {enabled: true}\nsecrets:\n  age:\n    keyFile: age.key\n", "secrets.age.keyFile: age.key holds a post-quantum age identity"},
		{"PQ identity for Flux v2.9", "  version: v2.9.0\n  decryption: {enabled: true}\nsecrets:\n  age:\n    keyFile: age.key\n", ""},
	} {
		cfg, err := Parse(cfgPath, []byte(good+tc.extra), noEnv)
		if err != nil {
			t.Fatal(err)
		}
		wantValid(t, tc.name, cfg, tc.want)
		if err := cfg.Validate(); tc.want != "" && strings.Contains(tc.want, "post-quantum age identity") && (err == nil || !strings.Contains(err.Error(), "flux.version v2.8.1") || !strings.Contains(err.Error(), "v2.9.0 or later")) {
			t.Errorf("%s: %v, want it to name flux.version v2.8.1 and v2.9.0", tc.name, err)
		}
	}
}

// wantValid checks that cfg validates when want is empty, and otherwise
// fails with an error containing want.
func wantValid(t *testing.T, name string, cfg *Config, want string) {
	t.Helper()
	err := cfg.Validate()
	switch {
	case want == "" && err != nil:
		t.Errorf("%s: %v", name, err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Errorf("%s: %v, want an error with %q", name, err, want)
	}
}
