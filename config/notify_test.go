package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// postcheck.notify: URLs from a 0600 file or a named variable, each a
// service shoutrrr knows; a variable name that is a URL, a readable file,
// an unknown service or both sources are refused, and no refusal quotes a
// URL's secret.
func TestNotifyURLs(t *testing.T) {
	const secret = "tk_notsosecret1234"
	dir := t.TempDir()
	file := filepath.Join(dir, "notify-urls")
	if err := os.WriteFile(file, []byte("# ntfy\nntfy://:"+secret+"@ntfy.example.com/homelab\n\ngeneric+https://hooks.example.com/x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	load := func(env map[string]string, edit func(*Notify)) (*Config, error) {
		cfg, err := Parse("testdata/good/three-plus-two.yaml", mustRead(t, "testdata/good/three-plus-two.yaml"), envMap(env))
		if err != nil {
			t.Fatal(err)
		}
		edit(&cfg.Postcheck.Notify)
		return cfg, cfg.Validate()
	}
	cfg, err := load(nil, func(n *Notify) { n.URLsFile = file })
	if err != nil {
		t.Fatal(err)
	}
	if urls, err := cfg.NotifyURLs(); err != nil || len(urls) != 2 {
		t.Errorf("from the file: %q %v", urls, err)
	}
	cfg, err = load(map[string]string{"NOTIFY": "ntfy://ntfy.example.com/a discord://tok@123"}, func(n *Notify) { n.URLsEnv = "NOTIFY" })
	if err != nil {
		t.Fatal(err)
	}
	if urls, _ := cfg.NotifyURLs(); len(urls) != 2 {
		t.Errorf("from the environment: %q", urls)
	}
	for _, tc := range []struct {
		what  string
		edit  func(*Notify)
		field string
	}{
		{"a URL where the variable's name goes", func(n *Notify) { n.URLsEnv = "ntfy://:" + secret + "@ntfy.sh/x" }, "postcheck.notify.urlsEnv"},
		{"both sources", func(n *Notify) { n.URLsFile, n.URLsEnv = file, "NOTIFY" }, "postcheck.notify"},
		{"a file others may read", func(n *Notify) { os.Chmod(file, 0o644); n.URLsFile = file }, "postcheck.notify.urlsFile"},
	} {
		_, err := load(nil, tc.edit)
		if err == nil || !strings.Contains(err.Error(), tc.field) || strings.Contains(err.Error(), secret) {
			t.Errorf("%s: %v", tc.what, err)
		}
		os.Chmod(file, 0o600)
	}
	if err := os.WriteFile(file, []byte("pager://"+secret+"@x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := load(nil, func(n *Notify) { n.URLsFile = file }); err == nil || !strings.Contains(err.Error(), "notification 1 (pager)") || strings.Contains(err.Error(), secret) {
		t.Errorf("an unknown service: %v", err)
	}
	// The file is a credential file: masked in every log and never served.
	found := false
	for _, f := range cfg.CredentialFiles() {
		found = found || f.Field == "postcheck.notify.urlsFile"
	}
	cfg.Postcheck.Notify.URLsFile = file
	for _, f := range cfg.CredentialFiles() {
		found = found || f.Field == "postcheck.notify.urlsFile"
	}
	if !found {
		t.Error("postcheck.notify.urlsFile is not a credential file")
	}
}
