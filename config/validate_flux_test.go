package config

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/Masterminds/semver/v3"
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

// TestFluxKubernetesFloors: each Flux minor needs the Kubernetes its
// `flux check --pre` needs (flux2 cmd/flux/check.go kubernetesConstraints
// per tag), one minor below passes, and the hint names a Flux that runs on
// that Kubernetes, not merely "an older" one with the same floor. The
// floor of the Flux the product installs is read from that flux2 module's
// own check.go.
func TestFluxKubernetesFloors(t *testing.T) {
	dir := t.TempDir()
	if err := os.CopyFS(filepath.Join(dir, "patches"), os.DirFS("testdata/good/patches")); err != nil {
		t.Fatal(err)
	}
	good := string(mustRead(t, "testdata/good/three-plus-two.yaml"))
	cases := []struct{ flux, floor, below, hint string }{
		{"v2.3.0", "1.28.0", "1.27.9", ""},
		{"v2.4.0", "1.28.0", "1.27.9", ""},
		{"v2.5.1", "1.30.0", "1.29.9", "v2.4.0"},
		{"v2.6.4", "1.31.0", "1.30.9", "v2.5.0"},
		{"v2.7.5", "1.32.0", "1.31.9", "v2.6.0"},
		{"v2.8.8", "1.33.0", "1.32.9", "v2.7.0"},
		{"v2.9.5", "1.33.0", "1.32.9", "v2.7.0"},
	}
	for _, tc := range cases {
		fv := semver.MustParse(tc.flux)
		floor, _ := fluxKubernetesFloor(fv, semver.MustParse(tc.floor))
		_, fits := fluxKubernetesFloor(fv, semver.MustParse(tc.below))
		if floor == nil || floor.String() != tc.floor || (fits == nil) != (tc.hint == "") || fits != nil && "v"+fits.String() != tc.hint {
			t.Errorf("Flux %s: floor %v, on %s fits %v; want %s and %q", tc.flux, floor, tc.below, fits, tc.floor, tc.hint)
		}
	}
	// What validate says, at a floor and below one.
	for _, tc := range []struct {
		flux, kubernetes string
		want             string
	}{
		{"v2.8.8", "1.32.9", "v2.8.8 needs Kubernetes 1.33.0 or later"},
		{"v2.5.1", "1.30.0", ""},
	} {
		yaml := strings.Replace(good, "\nflux:\n", "\nflux:\n  version: "+tc.flux+"\n", 1)
		yaml = strings.Replace(yaml, "\n  vip: 10.0.20.10\n", "\n  vip: 10.0.20.10\n  kubernetesVersion: "+tc.kubernetes+"\n", 1)
		cfg, err := Parse(filepath.Join(dir, "bootstrap.yaml"), []byte(yaml), noEnv)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Flux.Version != tc.flux || cfg.Cluster.KubernetesVersion != tc.kubernetes {
			t.Fatalf("the test config did not take flux %s and Kubernetes %s", tc.flux, tc.kubernetes)
		}
		err = cfg.Validate()
		refused := err != nil && strings.Contains(err.Error(), "needs Kubernetes")
		switch {
		case tc.want == "" && refused:
			t.Errorf("Flux %s on Kubernetes %s: %v", tc.flux, tc.kubernetes, err)
		case tc.want != "" && (!refused || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "pin Flux v2.7 (the newest minor that runs on 1.32.9)")):
			t.Errorf("Flux %s on Kubernetes %s: %v", tc.flux, tc.kubernetes, err)
		}
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}} {{.Version}}", "github.com/fluxcd/flux2/v2").Output()
	if err != nil {
		t.Skipf("the flux2 module's source: %v", err)
	}
	modDir, version, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	check, err := os.ReadFile(filepath.Join(modDir, "cmd", "flux", "check.go"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`kubernetesConstraints = \[\]string\{\s*">=([0-9.]+)-0"`).FindSubmatch(check)
	fv := semver.MustParse(strings.TrimPrefix(version, "v"))
	floor, _ := fluxKubernetesFloor(fv, semver.MustParse("1.0.0"))
	if m == nil || floor == nil || floor.String() != string(m[1]) {
		t.Errorf("flux2 %s check.go says >=%s, the table %v", version, m, floor)
	}
}
