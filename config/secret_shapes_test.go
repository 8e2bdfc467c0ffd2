package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// withValue returns the YAML document base with the value at the dotted
// path set (mappings created on the way), or removed when value is nil.
func withValue(t testing.TB, base []byte, path string, value any) []byte {
	t.Helper()
	var doc map[string]any
	if err := yaml.Unmarshal(base, &doc); err != nil {
		t.Fatal(err)
	}
	steps := strings.Split(path, ".")
	m := doc
	for _, s := range steps[:len(steps)-1] {
		next, ok := m[s].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[s] = next
		}
		m = next
	}
	if value == nil {
		delete(m, steps[len(steps)-1])
	} else {
		m[steps[len(steps)-1]] = value
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// loadAt writes data as bootstrap.yaml in dir (beside the good corpus's
// patches) and loads it as `config validate` does.
func loadAt(t *testing.T, dir string, data []byte) error {
	t.Helper()
	p := filepath.Join(dir, "bootstrap.yaml")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(p, noEnv)
	return err
}

func shapesDir(t *testing.T) string {
	dir := t.TempDir()
	if err := os.CopyFS(filepath.Join(dir, "patches"), os.DirFS("testdata/good/patches")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	return dir
}

// Secrets pasted where a name, a path, a mapping or a recipient belongs:
// each is refused as a user error, and the message names the field
// without quoting the secret.
func TestNoMessageQuotesASecret(t *testing.T) {
	const (
		uuid    = "0b9d1c2e-3f4a-4b5c-8d6e-7f8091a2b3c4"
		glpat   = "glpat-Mk0x5eedAbCdEfGhIj12"
		s3      = "wJalrXUtnFEMI0K7MDENGbPxRfiCY0x5eedKEY"
		ageID   = "AGE-SECRET-KEY-1QYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQ"
		ageLow  = "age-secret-key-1qyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszq"
		agePQ   = "AGE-SECRET-KEY-PQ-1QYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQQYQSZQGPQYQSZQGPQYQSZQGP"
		plain   = "marker-pw-0x5eed"
		ntfyURL = "ntfy://:" + plain + "@ntfy.sh/homelab"
	)
	good := mustRead(t, "testdata/good/three-plus-two.yaml")
	for _, c := range []struct {
		name, path string
		value      any
		secret     string
		want       string
	}{
		{"notify section as a string", "postcheck.notify", ntfyURL, plain, "postcheck.notify"},
		{"s3 section as a string", "backup.s3", "https://key:" + plain + "@minio.lan/bucket", plain, "backup.s3"},
		{"auth section as a token", "flux.auth", glpat, glpat, "flux.auth"},
		{"token secret file is the UUID", "proxmox.tokenSecretFile", uuid, uuid, "proxmox.tokenSecretFile"},
		{"token file is the token", "flux.auth.tokenFile", glpat, glpat, "flux.auth.tokenFile"},
		{"credentials file is the key", "backup.s3.credentialsFile", s3, s3, "backup.s3.credentialsFile"},
		{"age key file is the identity", "secrets.age.keyFile", ageID, "QYQSZQGPQYQSZQGPQYQSZQGP", "secrets.age.keyFile"},
		{"urls file is a URL", "postcheck.notify.urlsFile", ntfyURL, plain, "postcheck.notify.urlsFile"},
		{"patch path as a URL", "cluster.patches.all", []string{"https://me:" + plain + "@git.lan/patch.yaml"}, plain, "cluster.patches.all"},
		{"nfs server as a URL", "storage.nfs.server", "nfs://user:" + plain + "@nas.lan", plain, "storage.nfs.server"},
		{"installer with registry login", "cluster.installImage", "robot:" + plain + "@ghcr.io/me/installer:v1.13.3", plain, "cluster.installImage"},
		{"extension as a URL", "cluster.schematic.extensions", []string{"https://me:" + plain + "@ghcr.io/me/ext"}, plain, "cluster.schematic.extensions"},
		{"token ID in header form", "proxmox.tokenID", "bootstrap@pve!lab=" + uuid, uuid, "proxmox.tokenID"},
		{"backup recipient is an identity", "backup.ageRecipients", []string{ageID}, "QYQSZQGPQYQSZQGPQYQSZQGP", "identity"},
		{"backup recipient is a PQ identity", "backup.ageRecipients", []string{agePQ}, "QYQSZQGPQYQSZQGPQYQSZQGP", "identity"},
		{"bundle recipient is a lowercase identity", "secrets.age.recipients", []string{ageLow}, "qyqszqgpqyqszqgpqyqszqgp", "identity"},
		{"repo with ?pass=", "flux.repo", "https://git.lan/me/homelab.git?pass=" + plain, plain, "flux.repo"},
		{"repo with ?pwd=", "flux.repo", "https://git.lan/me/homelab.git?pwd=" + plain, plain, "flux.repo"},
		{"repo with #access_token=", "flux.repo", "https://git.lan/me/homelab.git#access_token=" + plain, plain, "flux.repo"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := shapesDir(t)
			if c.path == "backup.ageRecipients" {
				if err := os.Mkdir(filepath.Join(dir, "copies"), 0o700); err != nil {
					t.Fatal(err)
				}
				good := withValue(t, good, "backup.copyDir", "copies")
				c.value = []any{c.value.([]string)[0]}
				checkRefused(t, loadAt(t, dir, withValue(t, good, c.path, c.value)), c.secret, c.want)
				return
			}
			checkRefused(t, loadAt(t, dir, withValue(t, good, c.path, c.value)), c.secret, c.want)
		})
	}
}

// The same through extends: a section written as a token in a base file.
func TestNoMessageQuotesASecretFromABase(t *testing.T) {
	dir := shapesDir(t)
	const glpat = "glpat-Mk0x5eedAbCdEfGhIj12"
	base := withValue(t, mustRead(t, "testdata/good/three-plus-two.yaml"), "flux.auth", glpat)
	if err := os.WriteFile(filepath.Join(dir, "base.yaml"), base, 0o600); err != nil {
		t.Fatal(err)
	}
	checkRefused(t, loadAt(t, dir, []byte("extends: base.yaml\ncluster:\n  name: lab2\n")), glpat, "flux.auth")
	// An extends given as a URL with user information.
	checkRefused(t, loadAt(t, dir, []byte("extends: https://me:marker-pw-0x5eed@git.lan/base.yaml\n")), "marker-pw-0x5eed", "extends")
}

// S3 values every server refuses at the first nightly copy, refused at
// validate: a prefix with a "." or ".." component, an endpoint with a
// query or a fragment.
func TestS3PrefixAndEndpointShapes(t *testing.T) {
	// Without patches: a valid config then generates no secrets bundle.
	good := withValue(t, mustRead(t, "testdata/good/three-plus-two.yaml"), "cluster.patches", nil)
	for _, c := range []struct{ path, value, want string }{
		{"backup.s3.prefix", "lab/../etcd/", "backup.s3.prefix"},
		{"backup.s3.prefix", "./lab/etcd", "backup.s3.prefix"},
		{"backup.s3.prefix", "lab/./etcd/", "backup.s3.prefix"},
		{"backup.s3.endpoint", "https://minio.lan:9000/?region=eu", "backup.s3.endpoint"},
		{"backup.s3.endpoint", "https://minio.lan:9000#x", "backup.s3.endpoint"},
	} {
		dir := shapesDir(t)
		creds := filepath.Join(dir, "s3-credentials")
		if err := os.WriteFile(creds, []byte("[default]\naws_access_key_id = AKIDEXAMPLE\naws_secret_access_key = x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		data := withValue(t, good, "backup.s3.bucket", "etcd")
		data = withValue(t, data, "backup.s3.endpoint", "https://minio.lan:9000")
		data = withValue(t, data, "backup.s3.credentialsFile", creds)
		// The same config with a plain prefix validates: the refusal
		// is the value's.
		if err := loadAt(t, dir, withValue(t, data, "backup.s3.prefix", "lab/etcd/")); err != nil {
			t.Fatalf("the base S3 config is refused: %v", err)
		}
		data = withValue(t, data, c.path, c.value)
		err := loadAt(t, dir, data)
		if err == nil || !IsUserError(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %q: %v, want a user error naming %s", c.path, c.value, err, c.want)
		}
	}
}

func checkRefused(t *testing.T, err error, secret, want string) {
	t.Helper()
	if err == nil {
		t.Fatal("accepted")
	}
	if !IsUserError(err) {
		t.Fatalf("not a user error: %v", err)
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("the message quotes the secret %q:\n%v", secret, err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("the message does not name %q:\n%v", want, err)
	}
}
