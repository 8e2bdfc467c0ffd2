package config

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestKnownHostsLookup checks the known_hosts lookup against files written
// by OpenSSH's own tools where they are installed (plain and hashed
// entries, a non-default port), else by hand.
func TestKnownHostsLookup(t *testing.T) {
	key, err := os.ReadFile("testdata/bad/files/known_hosts")
	if err != nil {
		t.Fatal(err)
	}
	pub := strings.Join(strings.Fields(string(key))[1:], " ")
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	plain := write("plain", "# comment\ngit.example.com,10.0.20.7 "+pub+"\n[git.example.com]:2222 "+pub+"\n")
	cases := []struct {
		file, addr string
		want       bool
	}{
		{plain, "git.example.com:22", true},
		{plain, "10.0.20.7:22", true},
		{plain, "git.example.com:2222", true},
		{plain, "git.example.com:2200", false},
		{plain, "other.example.com:22", false},
	}
	if _, err := exec.LookPath("ssh-keygen"); err == nil {
		hashed := write("hashed", "git.example.com "+pub+"\n[git.example.com]:2222 "+pub+"\n")
		if out, err := exec.Command("ssh-keygen", "-H", "-f", hashed).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen -H: %v %s", err, out)
		}
		if b, _ := os.ReadFile(hashed); !strings.HasPrefix(string(b), "|1|") {
			t.Fatalf("ssh-keygen -H did not hash: %s", b)
		}
		cases = append(cases, struct {
			file, addr string
			want       bool
		}{hashed, "git.example.com:22", true}, struct {
			file, addr string
			want       bool
		}{hashed, "git.example.com:2222", true}, struct {
			file, addr string
			want       bool
		}{hashed, "other.example.com:22", false})
	}
	for _, c := range cases {
		got, err := knownHostsHas(c.file, c.addr)
		if err != nil || got != c.want {
			t.Errorf("%s in %s: %v %v, want %v", c.addr, filepath.Base(c.file), got, err, c.want)
		}
	}
}

// TestCiliumCompatibilityWarning: a Cilium chart whose compatibility page
// does not cover the cluster's Kubernetes version is a warning, the
// default pair is not.
func TestCiliumCompatibilityWarning(t *testing.T) {
	base, err := os.ReadFile("testdata/bad/54-cilium-operator-replicas-over-nodes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	noValues := strings.Replace(string(base), "    valuesFile: files/cilium-values.yaml\n", "", 1)
	for _, c := range []struct{ version, want string }{
		{DefaultCiliumVersion, ""},
		{"1.18.4", "Cilium 1.18 is tested with Kubernetes 1.30 to 1.33, not " + DefaultKubernetesVersion},
		{"1.16.0", "does not know which Kubernetes versions Cilium 1.16 is tested with"},
	} {
		p := filepath.Join(t.TempDir(), "bootstrap.yaml")
		cfg := strings.Replace(noValues, "  cilium:\n", "  cilium:\n    chartVersion: "+c.version+"\n", 1)
		if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		loaded, err := Load(p, noEnv)
		if err != nil {
			t.Fatalf("%s: %v", c.version, err)
		}
		var got []string
		for _, w := range loaded.Warnings() {
			if w.Path == "cni.cilium.chartVersion" {
				got = append(got, w.Msg)
			}
		}
		switch {
		case c.want == "" && len(got) != 0:
			t.Errorf("%s: unexpected warning %q", c.version, got)
		case c.want != "" && (len(got) != 1 || !strings.Contains(got[0], c.want)):
			t.Errorf("%s: warnings %q, want one containing %q", c.version, got, c.want)
		}
	}
}
