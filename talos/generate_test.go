package talos

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"

	"github.com/homelab/bootstrap/lab/talossim"
)

var update = flag.Bool("update", false, "rewrite golden files")

var fixedNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// clusterDir returns a fresh cluster directory holding the fixture bundle.
func clusterDir(t *testing.T, bundleFixture string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), ".talos", "lab")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join("testdata", bundleFixture))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, SecretsFile), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func oneCP(dir string) GenerateOptions {
	return GenerateOptions{
		Dir:         dir,
		ClusterName: "lab",
		Network:     Network{Gateway: "10.10.0.1", Nameservers: []string{"1.1.1.1", "9.9.9.9"}},
		Nodes:       []Node{{Name: "cp-1", Role: RoleControlPlane, IP: "10.10.0.11", DiskBus: "scsi"}},
		Now:         func() time.Time { return fixedNow },
	}
}

func haCluster(dir string) GenerateOptions {
	return GenerateOptions{
		Dir:          dir,
		ClusterName:  "lab",
		InstallImage: "factory.talos.dev/installer/ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515:v1.13.3",
		VIP:          "10.10.0.10",
		CNI:          CNICilium,
		Network:      Network{Gateway: "10.10.0.1", Nameservers: []string{"10.10.0.1"}, PrefixLen: 24},
		Nodes: []Node{
			{Name: "cp-1", Role: RoleControlPlane, IP: "10.10.0.11", DiskBus: "scsi", MAC: "BC:24:11:00:00:01"},
			{Name: "cp-2", Role: RoleControlPlane, IP: "10.10.0.12", DiskBus: "scsi", MAC: "BC:24:11:00:00:02"},
			{Name: "cp-3", Role: RoleControlPlane, IP: "10.10.0.13/24", DiskBus: "virtio"},
			{Name: "wk-1", Role: RoleWorker, IP: "10.10.0.21", DiskBus: "virtio", MAC: "bc:24:11:00:00:21"},
			{Name: "wk-2", Role: RoleWorker, IP: "10.10.0.22", UserVolumes: []UserVolume{{Name: "data", Serial: "bs-0123456789abcdef", Bus: "scsi"}}},
		},
		Now: func() time.Time { return fixedNow },
	}
}

// outputs lists the generated files (relative path → content) except the
// bundle and the talosconfig, whose client key is minted on first run.
func outputs(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == SecretsFile || rel == TalosconfigFile {
			return nil
		}
		b, err := os.ReadFile(p)
		out[rel] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// atVersion renders opts for another Talos version; v1.14 needs an
// installer image (its UnattendedInstallConfig warns without one, and the
// validation is strict), which a real run always has.
func atVersion(opts func(string) GenerateOptions, version string) func(string) GenerateOptions {
	return func(dir string) GenerateOptions {
		o := opts(dir)
		o.TalosVersion = version
		if o.InstallImage == "" || strings.HasPrefix(version, "v1.14") {
			o.InstallImage = "factory.talos.dev/nocloud-installer/ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515:" + version
		}
		return o
	}
}

// TestGoldenConfigs pins the rendered configs per Talos minor: the v1.13
// ones (the default) and the v1.12 ones were written by the machinery
// v1.13.3 build and must not change under a newer machinery; the v1.14
// ones use the typed documents.
func TestGoldenConfigs(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts func(string) GenerateOptions
	}{
		{"1cp", oneCP},
		{"3cp-2w-vip", haCluster},
		{"1cp-v1.12", atVersion(oneCP, "v1.12.6")},
		{"3cp-2w-vip-v1.12", atVersion(haCluster, "v1.12.6")},
		{"1cp-v1.14", atVersion(oneCP, "v1.14.1")},
		{"3cp-2w-vip-v1.14", atVersion(haCluster, "v1.14.1")},
		{"1cp-secureboot-v1.12", atVersion(secureBootCP, "v1.12.6")},
		{"1cp-secureboot", secureBootCP},
		{"1cp-secureboot-v1.14", atVersion(secureBootCP, "v1.14.1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := clusterDir(t, "secrets.yaml")
			res, err := Generate(tc.opts(dir))
			if err != nil {
				t.Fatal(err)
			}
			if res.SecretsCreated {
				t.Fatal("fixture bundle was replaced")
			}
			got := outputs(t, dir)
			goldenDir := filepath.Join("testdata", "golden", tc.name)
			if *update {
				os.RemoveAll(goldenDir)
				for rel, b := range got {
					p := filepath.Join(goldenDir, rel)
					if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(p, b, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			want := outputs(t, goldenDir)
			if len(want) == 0 {
				t.Fatalf("no golden files in %s (run with -update)", goldenDir)
			}
			var names []string
			for rel := range want {
				names = append(names, rel)
			}
			for rel := range got {
				if _, ok := want[rel]; !ok {
					t.Errorf("unexpected output %s", rel)
				}
			}
			sort.Strings(names)
			for _, rel := range names {
				if !bytes.Equal(got[rel], want[rel]) && !sameConfig(t, got[rel], want[rel]) {
					t.Errorf("%s differs from golden (run with -update to accept)", rel)
				}
				// Every file on disk must load with the real loader and pass
				// the metal checks a node performs.
				cfg, err := configloader.NewFromBytes(got[rel])
				if err != nil {
					t.Fatalf("%s does not load: %v", rel, err)
				}
				if _, errs := ValidateMetal(cfg); len(errs) > 0 {
					t.Errorf("%s fails metal validation: %v", rel, errs)
				}
			}
		})
	}
}

// sameConfig reports whether want, re-encoded by this build's encoder,
// is got: the v1.12 and v1.13 goldens were written by the machinery v1.13.3
// build, whose YAML encoder quoted some strings differently ("off" became
// 'off' with go.yaml.in/yaml/v4 rc.6); the documents and their values are
// what must not change.
func sameConfig(t *testing.T, got, want []byte) bool {
	t.Helper()
	cfg, err := configloader.NewFromBytes(want)
	if err != nil {
		return false
	}
	reencoded, err := encode(cfg)
	if err != nil {
		return false
	}
	return bytes.Equal(got, reencoded)
}

func TestRenderedNodeContents(t *testing.T) {
	dir := clusterDir(t, "secrets.yaml")
	res, err := Generate(haCluster(dir))
	if err != nil {
		t.Fatal(err)
	}
	if res.Endpoint != "https://10.10.0.10:6443" {
		t.Errorf("endpoint = %s, want the VIP", res.Endpoint)
	}
	checks := map[string]struct {
		disk   string
		link   string
		hasVIP bool
	}{
		"cp-1": {"/dev/sda", LinkAliasName, true},
		"cp-3": {"/dev/vda", DefaultInterface, true},
		"wk-1": {"/dev/vda", LinkAliasName, false},
		"wk-2": {"/dev/sda", DefaultInterface, false},
	}
	for name, want := range checks {
		n, ok := res.Node(name)
		if !ok {
			t.Fatalf("node %s not rendered", name)
		}
		cfg, err := configloader.NewFromBytes(n.Config)
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Machine().Install().Disk(); got != want.disk {
			t.Errorf("%s install disk = %s, want %s", name, got, want.disk)
		}
		if n.InstallDisk != want.disk {
			t.Errorf("%s recorded install disk = %s, want %s", name, n.InstallDisk, want.disk)
		}
		if got := cfg.Machine().Install().Image(); !strings.HasPrefix(got, "factory.talos.dev/installer/") {
			t.Errorf("%s install image = %q", name, got)
		}
		if got := cfg.NetworkHostnameConfig().Hostname(); got != name {
			t.Errorf("%s hostname = %q", name, got)
		}
		text := string(n.Config)
		if !strings.Contains(text, "kind: LinkConfig\nname: "+want.link+"\n") {
			t.Errorf("%s: no LinkConfig for %s", name, want.link)
		}
		if got := strings.Contains(text, "kind: Layer2VIPConfig\nname: 10.10.0.10\nlink: "+want.link); got != want.hasVIP {
			t.Errorf("%s: Layer2VIPConfig present = %v, want %v", name, got, want.hasVIP)
		}
		if strings.Contains(text, "\n    network:\n        hostname") || strings.Contains(text, "interfaces:") {
			t.Errorf("%s uses the deprecated machine.network", name)
		}
		if cfg.K8sFlannelCNIConfig() != nil {
			t.Errorf("%s: flannel deployed, want no CNI for cilium", name)
		}
		if cfg.K8sProxyConfig().Enabled() {
			t.Errorf("%s: kube-proxy enabled with cilium", name)
		}
	}
	// The 1-CP flannel cluster keeps Talos' CNI and kube-proxy.
	dir1 := clusterDir(t, "secrets.yaml")
	res1, err := Generate(oneCP(dir1))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := configloader.NewFromBytes(res1.Nodes[0].Config)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.K8sFlannelCNIConfig() == nil || !cfg.K8sProxyConfig().Enabled() {
		t.Errorf("1cp: flannel %v, proxy %v; want flannel with kube-proxy", cfg.K8sFlannelCNIConfig() != nil, cfg.K8sProxyConfig().Enabled())
	}
	if _, tainted := cfg.K8sNodeConfig().Taints()["node-role.kubernetes.io/control-plane"]; tainted {
		t.Error("1cp without workers must allow scheduling on the control plane")
	}
}

func TestTalosconfig(t *testing.T) {
	dir := clusterDir(t, "secrets.yaml")
	res, err := Generate(haCluster(dir))
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(res.TalosconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("talosconfig mode %v, want 0600", fi.Mode().Perm())
	}
	cfg, err := clientconfig.Open(res.TalosconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	ctx := cfg.Contexts["lab"]
	if cfg.Context != "lab" || ctx == nil {
		t.Fatalf("context = %q, contexts %v", cfg.Context, cfg.Contexts)
	}
	if strings.Join(ctx.Endpoints, ",") != "10.10.0.11,10.10.0.12,10.10.0.13" {
		t.Errorf("endpoints = %v, want the control plane IPs", ctx.Endpoints)
	}
	crt, _ := base64.StdEncoding.DecodeString(ctx.Crt)
	key, _ := base64.StdEncoding.DecodeString(ctx.Key)
	if err := checkClientCert(crt, key, res.Bundle.Certs.OS.Crt, fixedNow); err != nil {
		t.Errorf("client certificate does not chain to the bundle's OS CA: %v", err)
	}

	// With another cluster's bundle in place the old certificate must not be reused.
	other := clusterDir(t, "other-secrets.yaml")
	if err := os.WriteFile(filepath.Join(other, TalosconfigFile), mustRead(t, res.TalosconfigPath), 0o600); err != nil {
		t.Fatal(err)
	}
	res2, err := Generate(haCluster(other))
	if err != nil {
		t.Fatal(err)
	}
	cfg2, _ := clientconfig.FromBytes(res2.Talosconfig)
	if cfg2.Contexts["lab"].Crt == ctx.Crt {
		t.Error("client certificate of another CA was reused")
	}
	crt2, _ := base64.StdEncoding.DecodeString(cfg2.Contexts["lab"].Crt)
	key2, _ := base64.StdEncoding.DecodeString(cfg2.Contexts["lab"].Key)
	if err := checkClientCert(crt2, key2, res2.Bundle.Certs.OS.Crt, fixedNow); err != nil {
		t.Errorf("reissued certificate does not chain: %v", err)
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

func writePatch(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPatchOrder(t *testing.T) {
	dir := clusterDir(t, "secrets.yaml")
	pd := t.TempDir()
	opts := haCluster(dir)
	// Each level sets the keys of all the levels after it, so the final
	// value of a key tells which level was applied last.
	opts.Patches.Global = []string{
		writePatch(t, pd, "g1.yaml", "machine:\n  sysctls:\n    k.global: g1\n    k.role: g1\n    k.node: g1\n    k.order: g1\n"),
		writePatch(t, pd, "g2.yaml", "machine:\n  sysctls:\n    k.order: g2\n"),
	}
	opts.Patches.ControlPlane = []string{writePatch(t, pd, "cp.yaml", "machine:\n  sysctls:\n    k.role: cp\n    k.node: cp\n")}
	opts.Patches.Worker = []string{writePatch(t, pd, "wk.yaml", "machine:\n  sysctls:\n    k.role: wk\n    k.node: wk\n")}
	// A node file that also tries to set the hostname and disk: the
	// generated node patch comes last and wins.
	opts.Nodes[0].Patches = []string{writePatch(t, pd, "cp-1.yaml",
		"machine:\n  sysctls:\n    k.node: cp-1\n  install:\n    disk: /dev/nvme0n1\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nauto: \"off\"\nhostname: wrong\n")}
	// Built-in patch (cilium) comes first: a global patch can re-enable kube-proxy.
	opts.Patches.Global = append(opts.Patches.Global, writePatch(t, pd, "proxy.yaml", "cluster:\n  proxy:\n    disabled: false\n"))

	res, err := Generate(opts)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]string{
		"cp-1": {"k.global": "g1", "k.order": "g2", "k.role": "cp", "k.node": "cp-1"},
		"cp-2": {"k.global": "g1", "k.order": "g2", "k.role": "cp", "k.node": "cp"},
		"wk-1": {"k.global": "g1", "k.order": "g2", "k.role": "wk", "k.node": "wk"},
	}
	for name, sysctls := range want {
		n, _ := res.Node(name)
		cfg, err := configloader.NewFromBytes(n.Config)
		if err != nil {
			t.Fatal(err)
		}
		got := cfg.Machine().Sysctls()
		for k, v := range sysctls {
			if got[k] != v {
				t.Errorf("%s: sysctl %s = %q, want %q", name, k, got[k], v)
			}
		}
		if !cfg.K8sProxyConfig().Enabled() {
			t.Errorf("%s: global patch did not override the built-in one", name)
		}
		if cfg.NetworkHostnameConfig().Hostname() != name {
			t.Errorf("%s: hostname %q, generated node patch must win", name, cfg.NetworkHostnameConfig().Hostname())
		}
		if name == "cp-1" && cfg.Machine().Install().Disk() != "/dev/sda" {
			t.Errorf("cp-1: install disk %s, generated node patch must win", cfg.Machine().Install().Disk())
		}
	}
	// Role templates carry role patches but no node patch.
	tmpl, err := configloader.NewFromBytes(res.Worker)
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.Machine().Sysctls()["k.role"] != "wk" || tmpl.Machine().Sysctls()["k.node"] != "wk" {
		t.Errorf("worker.yaml sysctls %v", tmpl.Machine().Sysctls())
	}
}

func TestBadPatchNamesFile(t *testing.T) {
	pd := t.TempDir()
	for _, tc := range []struct {
		name  string
		text  string
		scope string
	}{
		{"unparseable.yaml", "machine: [this is: not valid\n", "global"},
		{"unknown-kind.yaml", "apiVersion: v1alpha1\nkind: NoSuchConfig\nfoo: bar\n", "controlplane"},
		// JSON 6902 cannot apply to a multi-document 1.13 config.
		{"json6902.yaml", "- op: add\n  path: /machine/sysctls\n  value: {a: b}\n", "node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := clusterDir(t, "secrets.yaml")
			opts := oneCP(dir)
			p := writePatch(t, pd, tc.name, tc.text)
			switch tc.scope {
			case "global":
				opts.Patches.Global = []string{p}
			case "controlplane":
				opts.Patches.ControlPlane = []string{p}
			case "node":
				opts.Nodes[0].Patches = []string{p}
			}
			_, err := Generate(opts)
			if err == nil {
				t.Fatal("bad patch accepted")
			}
			if !strings.Contains(err.Error(), p) {
				t.Errorf("error does not name %s: %v", p, err)
			}
			if _, err := os.Stat(filepath.Join(dir, ControlPlaneFile)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("configs written despite the bad patch (%v)", err)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		opts := oneCP(clusterDir(t, "secrets.yaml"))
		opts.Patches.Worker = []string{filepath.Join(pd, "absent.yaml")}
		if _, err := Generate(opts); err == nil || !strings.Contains(err.Error(), "absent.yaml") {
			t.Errorf("err = %v, want it to name absent.yaml", err)
		}
	})
}

func TestValidationErrorsNameEveryNode(t *testing.T) {
	dir := clusterDir(t, "secrets.yaml")
	pd := t.TempDir()
	opts := haCluster(dir)
	// Extra kernel args conflict with grubUseUKICmdline on 1.13 configs.
	bad := writePatch(t, pd, "kargs.yaml", "machine:\n  install:\n    extraKernelArgs: [console=ttyS0]\n")
	opts.Nodes[1].Patches = []string{bad}
	opts.Nodes[4].Patches = []string{bad}
	_, err := Generate(opts)
	var verrs ValidationErrors
	if !errors.As(err, &verrs) {
		t.Fatalf("err = %v, want ValidationErrors", err)
	}
	msg := err.Error()
	for _, name := range []string{"node cp-2", "node wk-2"} {
		if !strings.Contains(msg, name+": ") {
			t.Errorf("validation error does not name %s:\n%s", name, msg)
		}
	}
	for _, name := range []string{"node cp-1", "node wk-1"} {
		if strings.Contains(msg, name+": ") {
			t.Errorf("valid %s reported:\n%s", name, msg)
		}
	}
}

func TestGenerateIsDeterministic(t *testing.T) {
	dir := clusterDir(t, "secrets.yaml")
	opts := haCluster(dir)
	first, err := Generate(opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Changes) != 8 { // 2 templates + 5 nodes + talosconfig
		t.Errorf("first run wrote %d files, want 8: %v", len(first.Changes), first.Changes)
	}
	before := snapshot(t, dir)
	// Push mtimes into the past so a rewrite would be visible even within
	// the filesystem's timestamp granularity.
	past := time.Now().Add(-time.Hour).Truncate(time.Second)
	for p := range before {
		if err := os.Chtimes(p, past, past); err != nil {
			t.Fatal(err)
		}
	}
	// A later clock must not matter: nothing is re-minted.
	opts.Now = func() time.Time { return fixedNow.Add(48 * time.Hour) }
	second, err := Generate(opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(second.Changes) != 0 {
		t.Errorf("unchanged inputs rewrote %v", second.Changes)
	}
	after := snapshot(t, dir)
	for p, b := range before {
		if !bytes.Equal(after[p].data, b.data) {
			t.Errorf("%s changed", p)
		}
		if !after[p].mtime.Equal(past) {
			t.Errorf("%s mtime changed", p)
		}
	}
	// Plan agrees: nothing to do.
	plan, err := Plan(opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Changes) != 0 {
		t.Errorf("plan reports changes on unchanged inputs: %v", plan.Changes)
	}

	// One changed input rewrites exactly the files it affects.
	opts.Network.Nameservers = []string{"10.10.0.53"}
	plan, err = Plan(opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Changes) != 5 || plan.Changes[0].Diff == "" || !strings.Contains(plan.Changes[0].Diff, "+    - address: 10.10.0.53") {
		t.Errorf("plan after a nameserver change: %+v", plan.Changes)
	}
	if !snapshotEqual(t, dir, after) {
		t.Error("Plan wrote files")
	}
	third, err := Generate(opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(third.Changes) != 5 {
		t.Errorf("nameserver change rewrote %d files, want the 5 node configs: %v", len(third.Changes), third.Changes)
	}
}

type fileSnap struct {
	data  []byte
	mtime time.Time
}

func snapshot(t *testing.T, dir string) map[string]fileSnap {
	t.Helper()
	out := map[string]fileSnap{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		out[p] = fileSnap{b, fi.ModTime()}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func snapshotEqual(t *testing.T, dir string, want map[string]fileSnap) bool {
	got := snapshot(t, dir)
	if len(got) != len(want) {
		return false
	}
	for p, w := range want {
		if !bytes.Equal(got[p].data, w.data) || !got[p].mtime.Equal(w.mtime) {
			return false
		}
	}
	return true
}

func TestSecretsWriteOnce(t *testing.T) {
	t.Run("created once, 0600, then reused", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "lab")
		opts := oneCP(dir)
		res, err := Generate(opts)
		if err != nil {
			t.Fatal(err)
		}
		if !res.SecretsCreated {
			t.Fatal("first run did not create the bundle")
		}
		fi, err := os.Stat(res.SecretsPath)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("secrets mode %v, want 0600", fi.Mode().Perm())
		}
		orig := mustRead(t, res.SecretsPath)
		res2, err := Generate(opts)
		if err != nil {
			t.Fatal(err)
		}
		if res2.SecretsCreated || !bytes.Equal(orig, mustRead(t, res.SecretsPath)) {
			t.Error("second run replaced the bundle")
		}
		// Configs are built from the stored bundle.
		if !bytes.Contains(res2.Nodes[0].Config, []byte(res2.Bundle.Cluster.Secret)) {
			t.Error("config does not carry the stored bundle's cluster secret")
		}
	})
	t.Run("corrupt bundle is an error, never replaced", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "lab")
		os.MkdirAll(dir, 0o700)
		p := filepath.Join(dir, SecretsFile)
		junk := []byte("cluster: [not a bundle\n")
		if err := os.WriteFile(p, junk, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Generate(oneCP(dir)); err == nil {
			t.Fatal("corrupt bundle accepted")
		}
		if !bytes.Equal(mustRead(t, p), junk) {
			t.Error("corrupt bundle was overwritten")
		}
	})
	t.Run("plan never creates it", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "lab")
		res, err := Plan(oneCP(dir))
		if err != nil {
			t.Fatal(err)
		}
		if !res.SecretsCreated {
			t.Error("plan should report the bundle as to be created")
		}
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("plan created %s", dir)
		}
	})
	t.Run("the plan's bundle is stored, not minted again; never over an existing one", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "lab")
		plan, err := Plan(oneCP(dir))
		if err != nil {
			t.Fatal(err)
		}
		opts := oneCP(dir)
		opts.NewBundle = plan.Bundle
		res, err := Generate(opts)
		if err != nil {
			t.Fatal(err)
		}
		if !res.SecretsCreated || res.Bundle.Cluster.Secret != plan.Bundle.Cluster.Secret || !bytes.Equal(res.Nodes[0].Config, plan.Nodes[0].Config) {
			t.Fatal("Generate did not store the planned bundle (or rendered other configs)")
		}
		stored := mustRead(t, res.SecretsPath)
		other, err := Plan(oneCP(filepath.Join(t.TempDir(), "other")))
		if err != nil {
			t.Fatal(err)
		}
		opts.NewBundle = other.Bundle
		if res, err = Generate(opts); err != nil || res.SecretsCreated || !bytes.Equal(stored, mustRead(t, res.SecretsPath)) {
			t.Fatalf("an existing bundle was replaced (%v)", err)
		}
	})
}

func TestOptionsRejected(t *testing.T) {
	dir := clusterDir(t, "secrets.yaml")
	opts := oneCP(dir)
	opts.Nodes = append(opts.Nodes, Node{Name: "wk-1", Role: "gpu", IP: "10.10.0.300", DiskBus: "nvme"})
	opts.CNI = "calico"
	_, err := Generate(opts)
	if err == nil {
		t.Fatal("bad options accepted")
	}
	for _, want := range []string{`role "gpu"`, "10.10.0.300", `disk bus "nvme"`, `cni "calico"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

// TestGenerateForTalos112 renders for the oldest Talos generated for
// (v1.12, whose contract has the multi-document network configs) with a
// Kubernetes it supports: the configs validate, and a node of that version
// takes them; with Kubernetes 1.36 the node's runtime validation refuses
// them, which is why `config validate` refuses that pair.
func TestGenerateForTalos112(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		k8s    string
		refuse string
	}{
		{k8s: "1.35.2"},
		{k8s: "1.36.1", refuse: "kubelet image is not valid: version of Kubernetes 1.36.1 is too new to be used with Talos 1.12.4"},
	} {
		t.Run(tc.k8s, func(t *testing.T) {
			t.Parallel()
			opts := oneCP(clusterDir(t, "secrets.yaml"))
			opts.TalosVersion, opts.KubernetesVersion = "v1.12.4", tc.k8s
			prefix, err := talossim.RandomLoopbackPrefix(50000)
			if err != nil {
				t.Fatal(err)
			}
			ip := talossim.HostAddr(prefix, 11)
			opts.Nodes[0].IP = ip
			res, err := Generate(opts)
			if err != nil {
				t.Fatal(err)
			}
			sim := talossim.New(talossim.Options{TalosVersion: "v1.12.4", Log: testLogger(t)})
			defer sim.Close()
			node, err := sim.BootNode(context.Background(), talossim.NodeSpec{IP: ip})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := node.WaitPhase(ctx, talossim.PhaseMaintenance); err != nil {
				t.Fatal(err)
			}
			ops, err := NewOps(OpsOptions{Talosconfig: res.Talosconfig, Log: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			err = ops.applyMaintenance(ctx, Target{Name: "cp-1", IP: ip, Config: res.Nodes[0].Config})
			switch {
			case tc.refuse == "" && err != nil:
				t.Fatalf("a v1.12.4 node refused its config: %v", err)
			case tc.refuse != "" && (err == nil || !strings.Contains(err.Error(), tc.refuse)):
				t.Fatalf("err = %v, want %q", err, tc.refuse)
			}
		})
	}
}

// TestConfigFormAcrossV114: while a node of a cluster heading for v1.14
// still runs v1.13 (or v1.12), the configs keep the v1alpha1 form of the
// oldest, which that node takes and v1.14 still reads; once every node
// runs v1.14, the typed documents. The installer stays the target's.
func TestConfigFormAcrossV114(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		target  string
		running []string
		want    string
	}{
		{"v1.14.1", []string{"v1.13.3", "v1.14.1"}, "v1.13.3"},
		{"v1.14.1", []string{"v1.14.1", "v1.12.6", "v1.13.3"}, "v1.12.6"},
		{"v1.14.1", []string{"v1.14.1", "", "v1.14.0"}, ""},
		{"v1.14.1", nil, ""},
		{"v1.13.3", []string{"v1.12.6"}, ""},
	} {
		got, err := ConfigVersionFor(tc.target, tc.running)
		if err != nil || got != tc.want {
			t.Errorf("ConfigVersionFor(%s, %v) = %q, %v; want %q", tc.target, tc.running, got, err, tc.want)
		}
	}
	opts := atVersion(oneCP, "v1.14.1")(clusterDir(t, "secrets.yaml"))
	opts.ConfigVersion = "v1.13.3"
	res, err := Generate(opts)
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(res.Nodes[0].Config)
	for _, want := range []string{"install:", "image: " + opts.InstallImage, "kubelet:"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("the v1.13 form for a v1.14 target lacks %q", want)
		}
	}
	for _, kind := range []string{"kind: UnattendedInstallConfig", "kind: KubeletConfig", "kind: SecurityProfileConfig"} {
		if strings.Contains(cfg, kind) {
			t.Errorf("the v1.13 form holds %s", kind)
		}
	}

	typed := atVersion(oneCP, "v1.14.1")(clusterDir(t, "secrets.yaml"))
	if res, err = Generate(typed); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(res.Nodes[0].Config), "kind: SecurityProfileConfig") {
		t.Fatal("a new v1.14 cluster gets no SecurityProfileConfig")
	}
	typed = atVersion(oneCP, "v1.14.1")(clusterDir(t, "secrets.yaml"))
	typed.WorkloadIsolationOff = true
	if res, err = Generate(typed); err != nil {
		t.Fatal(err)
	}
	if cfg := string(res.Nodes[0].Config); strings.Contains(cfg, "SecurityProfileConfig") || !strings.Contains(cfg, "kind: KubeletConfig") {
		t.Errorf("a cluster made before v1.14 gets workload isolation, or not the typed form:\n%s", cfg)
	}
}

// A patch written only for v1.14's typed documents cannot be rendered in
// the v1.13 form a cluster keeps until its last node runs v1.14: the
// failure names the patch file (the stage adds both ways out).
func TestTypedPatchRefusedInTheOlderForm(t *testing.T) {
	t.Parallel()
	dir := clusterDir(t, "secrets.yaml")
	patch := writePatch(t, t.TempDir(), "kubelet-typed.yaml", "apiVersion: v1alpha1\nkind: KubeletConfig\nextraArgs:\n  max-pods: \"150\"\n")
	opts := atVersion(oneCP, "v1.14.1")(dir)
	opts.Patches.Global = []string{patch}
	if _, err := Generate(opts); err != nil {
		t.Fatalf("the typed patch on the v1.14 form: %v", err)
	}
	opts = atVersion(oneCP, "v1.14.1")(clusterDir(t, "secrets.yaml"))
	opts.Patches.Global = []string{patch}
	opts.ConfigVersion = "v1.13.3"
	_, err := Generate(opts)
	if err == nil || !strings.Contains(err.Error(), "kubelet-typed.yaml") {
		t.Fatalf("the typed patch on the v1.13 form: %q, want a refusal naming the patch", err)
	}
	t.Logf("refused: %v", err)
}

// cluster.serviceAccountKey: ecdsa mints the bundle's service account key
// as ECDSA (machinery's WithECDSAServiceAccountKey), rsa as the version
// contract selects; a bundle that exists keeps its key whatever the
// setting says, and the run says that the setting did not take.
func TestServiceAccountKeyKind(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "lab")
	opts := oneCP(dir)
	opts.ECDSAServiceAccountKey = true
	var logged bytes.Buffer
	opts.Log = zerolog.New(&logged)
	res, err := Generate(opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := serviceAccountKeyKind(res.Bundle); got != "ecdsa" {
		t.Fatalf("service account key %q, want ecdsa", got)
	}
	orig := mustRead(t, res.SecretsPath)
	opts.ECDSAServiceAccountKey = false
	res, err = Generate(opts)
	if err != nil {
		t.Fatal(err)
	}
	if serviceAccountKeyKind(res.Bundle) != "ecdsa" || !bytes.Equal(orig, mustRead(t, res.SecretsPath)) {
		t.Fatal("the bundle was changed for the setting")
	}
	if !strings.Contains(logged.String(), "cluster.serviceAccountKey is rsa, but the cluster's secrets bundle holds an ECDSA service account key") {
		t.Errorf("no warning that the setting did not take:\n%s", logged.String())
	}
	rsaBundle, err := NewSecrets(DefaultTalosVersion, time.Now(), false)
	if err != nil {
		t.Fatal(err)
	}
	if got := serviceAccountKeyKind(rsaBundle); got != "rsa" {
		t.Fatalf("the version contract's key is %q, want rsa", got)
	}
}
