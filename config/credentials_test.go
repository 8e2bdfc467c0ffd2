package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/sops"
)

// notCredentials are the fields naming files that hold no credential.
// Every path:"file" field is either marked secret:"file" or listed here,
// so a new file field has to be classified before the suite passes.
var notCredentials = map[string]string{
	"cluster.factoryCAFile":          "a CA certificate",
	"cluster.patches.all":            "Talos patches (no secrets: the bundle holds them)",
	"cluster.patches.controlplane":   "Talos patches",
	"cluster.patches.worker":         "Talos patches",
	"cluster.patches.nodes":          "Talos patches",
	"proxmox.caFile":                 "a CA certificate",
	"storage.nfs.valuesFile":         "Helm values",
	"cni.cilium.valuesFile":          "Helm values",
	"flux.auth.knownHostsFile":       "public host keys",
	"flux.localSnapshot.source":      "the work tree served",
	"flux.localSnapshot.tlsCertFile": "a certificate",
	"postcheck.prometheusFile":       "metrics",
	"backup.copyDir":                 "backup copies (protected as a directory)",
	"backup.s3.caFile":               "a CA certificate",
	"state.dir":                      "run state (protected as a directory)",
	"state.talosDir":                 "Talos files (protected as a directory)",
	"state.kubeconfig":               "the kubeconfig (protected by name)",
}

// credentialName is what a field naming a credential file is called.
var credentialName = regexp.MustCompile(`(?i)(secret|token|key|credential|password|auth)`)

// TestEveryCredentialFieldIsMarked: every field naming a file is marked
// secret:"file" or known to hold no credential, and a field whose name
// says credential is marked.
func TestEveryCredentialFieldIsMarked(t *testing.T) {
	marked := map[string]bool{}
	for _, f := range credentialFields(reflect.TypeOf(Config{}), "") {
		marked[f.path] = true
	}
	fileFields := allFileFields(reflect.TypeOf(Config{}), "")
	for _, path := range fileFields {
		_, plain := notCredentials[path]
		name := path[strings.LastIndex(path, ".")+1:]
		switch {
		case marked[path] && plain:
			t.Errorf("%s is both marked secret:\"file\" and listed as holding no credential", path)
		case !marked[path] && !plain:
			t.Errorf("%s names a file but is neither marked secret:\"file\" nor listed in notCredentials: classify it", path)
		case !marked[path] && credentialName.MatchString(name) && !strings.Contains(path, "knownHosts") && !strings.Contains(path, "Cert"):
			t.Errorf("%s is named like a credential but not marked secret:\"file\"", path)
		}
	}
	for p := range notCredentials {
		if !slices.Contains(fileFields, p) {
			t.Errorf("notCredentials lists %s, which is not a path:\"file\" field", p)
		}
	}
	for _, want := range []string{"proxmox.tokenSecretFile", "secrets.age.keyFile", "flux.auth.sshKeyFile", "flux.auth.tokenFile", "flux.localSnapshot.tlsKeyFile", "backup.s3.credentialsFile"} {
		if !marked[want] {
			t.Errorf("%s is not marked secret:\"file\"", want)
		}
	}
}

// allFileFields lists the paths of the fields tagged path:"file".
func allFileFields(rt reflect.Type, prefix string) []string {
	var out []string
	for i := 0; i < rt.NumField(); i++ {
		f := rt.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		path := strings.TrimPrefix(prefix+"."+name, ".")
		if f.Tag.Get("path") == "file" {
			out = append(out, path)
		} else if f.Type.Kind() == reflect.Struct {
			out = append(out, allFileFields(f.Type, path)...)
		}
	}
	return out
}

// TestCredentialMarkDrivesEveryGuard sets every marked field, through the
// mark itself, to a world-readable file: validate refuses each one by its
// field, Protected lists each one, and CredentialValues hands the value
// inside each to the log masking.
func TestCredentialMarkDrivesEveryGuard(t *testing.T) {
	cfg, err := Parse("testdata/good/three-plus-two.yaml", mustRead(t, "testdata/good/three-plus-two.yaml"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	fields := credentialFields(reflect.TypeOf(Config{}), "")
	values := map[string]string{}
	for i, f := range fields {
		file := filepath.Join(dir, "cred"+string(rune('a'+i)))
		marker := "marker-" + strings.ReplaceAll(f.path, ".", "-")
		values[f.path] = marker
		if err := os.WriteFile(file, []byte("# comment\nkey = "+marker+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		v := reflect.ValueOf(cfg).Elem()
		for _, i := range f.index {
			v = v.Field(i)
		}
		v.SetString(file)
	}
	files := cfg.CredentialFiles()
	if len(files) != len(fields) {
		t.Fatalf("CredentialFiles() = %v, want one per marked field (%d)", files, len(fields))
	}
	protected := cfg.Protected()
	masked := cfg.CredentialValues()
	for _, f := range files {
		if !slices.Contains(protected, f.Path) {
			t.Errorf("Protected() lacks %s (%s)", f.Path, f.Field)
		}
		if !slices.Contains(masked, values[f.Field]) {
			t.Errorf("CredentialValues() lacks the value in %s", f.Field)
		}
	}
	err = cfg.validate()
	var errs *Errors
	if !errors.As(err, &errs) {
		t.Fatalf("validate: %v, want field errors", err)
	}
	for _, f := range files {
		found := false
		for _, e := range errs.Items {
			found = found || (e.Path == f.Field && strings.Contains(e.Msg, "readable by others"))
		}
		if !found {
			t.Errorf("validate did not refuse the world-readable %s", f.Field)
		}
	}
}

// TestNewcomerWarnings: what validates but would surprise a first run is
// named, field by field: the example's placeholders left in place, a user
// name without a token (an anonymous clone), Cilium values while Cilium is
// not installed, recipients nothing on this machine opens.
func TestNewcomerWarnings(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	dir := t.TempDir()
	p := filepath.Join(dir, DefaultFile)
	if err := os.WriteFile(p, Example, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(p, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	warned := func(cfg *Config, path, text string) {
		t.Helper()
		for _, w := range cfg.Warnings() {
			if w.Path == path && strings.Contains(w.Msg, text) {
				return
			}
		}
		t.Errorf("no warning on %s saying %q: %v", path, text, cfg.Warnings())
	}
	warned(cfg, "flux.repo", "https://github.com/example/homelab.git is a placeholder")
	warned(cfg, "proxmox.tlsFingerprint", "is the example's placeholder")

	base := string(mustRead(t, "testdata/good/three-plus-two.yaml"))
	if err := os.WriteFile(filepath.Join(dir, "cilium.yaml"), []byte("hubble: {enabled: true}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, rec, err := sops.GenerateIdentity()
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Replace(base, "repo: https://git.example.com/homelab.git", "repo: https://git.lan/homelab.git\n  auth:\n    username: homelab", 1) +
		"cni:\n  cilium:\n    valuesFile: cilium.yaml\nsecrets:\n  age:\n    recipients: [" + rec + "]\n"
	for _, sub := range []string{"patches"} {
		if err := os.CopyFS(filepath.Join(dir, sub), os.DirFS("testdata/good/"+sub)); err != nil {
			t.Fatal(err)
		}
	}
	q := filepath.Join(dir, "other.yaml")
	if err := os.WriteFile(q, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err = Load(q, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	warned(cfg, "flux.auth.username", "the clone goes without credentials")
	warned(cfg, "cni.cilium.valuesFile", `cni.name is "flannel": Cilium is not installed and the file is ignored`)
	warned(cfg, "secrets.age.recipients", "no age identity here opens them")
	for _, w := range cfg.Warnings() {
		if w.Path == "flux.repo" {
			t.Errorf("a real repository reads as a placeholder: %v", w)
		}
	}
}
