package e2e_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/client-go/tools/clientcmd"
	certutil "k8s.io/client-go/util/cert"

	"github.com/homelab/bootstrap/backup"
	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/gitsnap"
	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/sops"
)

// tool runs one of the users' own CLIs (built by make lab-bins from its
// pinned module) with extra environment and returns its stdout; failure
// is returned with stderr, for the negative checks.
func tool(t *testing.T, ctx context.Context, env []string, name string, args ...string) (string, error) {
	t.Helper()
	bin := toolBin(t, name)
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s is not built (make lab-bins): %v", name, err)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), &toolError{name: name, args: args, err: err, stderr: stderr.String()}
	}
	return stdout.String(), nil
}

// startTool starts one of the lab's binaries as a server for the rest of
// the test (its output in a log under the test's temp dir), stopped at
// cleanup.
func startTool(t *testing.T, ctx context.Context, name string, args ...string) {
	t.Helper()
	bin := toolBin(t, name)
	log, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s (make lab-bins): %v", name, err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		log.Close()
	})
}

// toolBin is the path of a built lab tool. It does not ask for a lab slot
// (kubetest.Binaries does): the tools run in subtests of a test that
// already holds one, and a second slot per subtest would wait for the
// other tests' labs to end.
func toolBin(t *testing.T, name string) string {
	t.Helper()
	b, err := kube.LoadBinaries("")
	if err != nil {
		t.Fatalf("lab binaries (make lab-bins): %v", err)
	}
	return filepath.Join(b.Dir, name)
}

type toolError struct {
	name   string
	args   []string
	err    error
	stderr string
}

func (e *toolError) Error() string {
	return e.name + " " + strings.Join(e.args, " ") + ": " + e.err.Error() + ": " + strings.TrimSpace(e.stderr)
}

// TestRealClients reads what one pipeline wrote with the tools its users
// read it with: kubectl with the written kubeconfig (and the merged
// ~/.kube/config), helm on the releases, flux on the installed Flux,
// node_exporter on the Prometheus file, a JUnit consumer and the shipped
// JSON Schema on the postcheck's reports,
// sops on the encrypted secrets bundle (and the product on a bundle the
// CLI rewrote), age on the encrypted backup copy, etcdutl on the kept
// snapshots, git on the snapshot server. Each tool also gets a broken
// artifact and must refuse it, so a check that cannot fail is not one.
func TestRealClients(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 6*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1, Workers: 1})
	dir := t.TempDir()
	identity, recipient, err := sops.GenerateIdentity()
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "age.agekey")
	writeSecretFile(t, keyFile, identity+"\n")
	copyDir := filepath.Join(dir, "nas")
	if err := os.Mkdir(copyDir, 0o700); err != nil {
		t.Fatal(err)
	}
	promFile := filepath.Join(dir, "textfile", "bootstrap.prom")
	if err := h.EditConfig(func(s string) (string, error) {
		s = strings.Replace(s, "\npostcheck:\n", "\npostcheck:\n  prometheusFile: "+promFile+"\n", 1)
		return s + "secrets:\n  age:\n    recipients: [" + recipient + "]\n    keyFile: " + keyFile + "\n" +
			"backup:\n  copyDir: " + copyDir + "\n  ageRecipients: [" + recipient + "]\n", nil
	}); err != nil {
		t.Fatal(err)
	}
	if r := run(t, ctx, h, "run", "--stage", "all"); r.ExitCode != 0 {
		t.Fatalf("pipeline:\n%s", r.Tail(40))
	}
	paths := h.Paths()
	// With secrets.age.recipients the kubeconfig is kept age-encrypted:
	// the tools get it as a user does, from `bootstrap kubeconfig`.
	kc := run(t, ctx, h, "kubeconfig")
	if kc.ExitCode != 0 {
		t.Fatalf("bootstrap kubeconfig:\n%s", kc.Tail(10))
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	writeSecretFile(t, kubeconfig, kc.Stdout)
	kubeEnv := []string{"KUBECONFIG=" + kubeconfig}
	helmEnv := append([]string{"HELM_CACHE_HOME=" + filepath.Join(dir, "helm-cache"), "HELM_CONFIG_HOME=" + filepath.Join(dir, "helm-config"),
		"HELM_DATA_HOME=" + filepath.Join(dir, "helm-data")}, kubeEnv...)
	sopsEnv := []string{sops.KeyFileEnv + "=" + keyFile}

	t.Run("kubectl", func(t *testing.T) {
		out, err := tool(t, ctx, kubeEnv, "kubectl", "get", "nodes", "-o", "name")
		if err != nil || strings.Fields(out)[0] != "node/cp-1" || !strings.Contains(out, "node/wk-1") {
			t.Fatalf("kubectl get nodes: %q %v", out, err)
		}
		out, err = tool(t, ctx, kubeEnv, "kubectl", "get", "sc")
		if err != nil || strings.Count(out, "(default)") != 1 || !strings.Contains(out, h.Config().Storage.NFS.StorageClass+" (default)") {
			t.Fatalf("kubectl get sc: want one default class, %s:\n%s %v", h.Config().Storage.NFS.StorageClass, out, err)
		}
		// A kubeconfig for another cluster's CA is refused.
		// (Another CA, not a mangled one: a PEM decoder skips junk before
		// "\n-----BEGIN", so a prefix could leave a bundle's later
		// certificate standing and prove nothing.)
		other := filepath.Join(dir, "other.kubeconfig")
		writeSecretFile(t, other, string(withOtherCA(t, kubeconfig)))
		if _, err := tool(t, ctx, []string{"KUBECONFIG=" + other}, "kubectl", "get", "nodes", "--request-timeout=5s"); err == nil {
			t.Error("kubectl accepted a kubeconfig with a broken CA")
		}

		// --merge-configs into a ~/.kube/config that holds another
		// cluster: kubectl's default file then reaches this cluster by
		// the current context and keeps the other one.
		home := filepath.Join(dir, "home")
		homeEnv := []string{"HOME=" + home, "KUBECONFIG="}
		if _, err := tool(t, ctx, homeEnv, "kubectl", "config", "set-cluster", "elsewhere", "--server=https://127.0.0.1:1"); err != nil {
			t.Fatal(err)
		}
		tool(t, ctx, homeEnv, "kubectl", "config", "set-context", "elsewhere", "--cluster=elsewhere", "--user=elsewhere")
		tool(t, ctx, homeEnv, "kubectl", "config", "use-context", "elsewhere")
		r, err := h.RunWith(ctx, e2e.RunOptions{Env: homeEnv}, "run", "--stage", "talos", "--merge-configs")
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("talos stage with --merge-configs: %v\n%s", err, r.Tail(20))
		}
		contexts, err := tool(t, ctx, homeEnv, "kubectl", "config", "get-contexts", "-o", "name")
		current, _ := tool(t, ctx, homeEnv, "kubectl", "config", "current-context")
		if err != nil || !slices.Contains(strings.Fields(contexts), "elsewhere") || strings.TrimSpace(current) == "elsewhere" {
			t.Errorf("merged ~/.kube/config: contexts %q, current %q, %v", contexts, current, err)
		}
		out, err = tool(t, ctx, homeEnv, "kubectl", "get", "sc")
		if err != nil || strings.Count(out, "(default)") != 1 {
			t.Errorf("kubectl get sc with the merged ~/.kube/config: %v\n%s", err, out)
		}
		if _, err := tool(t, ctx, homeEnv, "kubectl", "--context", "elsewhere", "get", "nodes", "--request-timeout=3s"); err == nil {
			t.Error("the other cluster's context reaches this cluster")
		}
	})

	t.Run("helm", func(t *testing.T) {
		type rel struct {
			Name, Namespace, Revision, Status, Chart string
		}
		list := func() []rel {
			t.Helper()
			out, err := tool(t, ctx, helmEnv, "helm", "list", "-A", "-o", "json")
			if err != nil {
				t.Fatal(err)
			}
			var rels []rel
			if err := json.Unmarshal([]byte(out), &rels); err != nil {
				t.Fatalf("helm list: %v\n%s", err, out)
			}
			return rels
		}
		want := rel{Name: "nfs-provisioner", Namespace: "nfs-provisioner", Revision: "1", Status: "deployed",
			Chart: "nfs-subdir-external-provisioner-" + h.Config().Storage.NFS.ChartVersion}
		if rels := list(); len(rels) != 1 || rels[0] != want {
			t.Fatalf("helm list -A: %+v, want only %+v", rels, want)
		}
		out, err := tool(t, ctx, helmEnv, "helm", "get", "values", "nfs-provisioner", "-n", "nfs-provisioner", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var values struct {
			NFS          struct{ Server, Path string }
			StorageClass struct {
				Name         string
				DefaultClass bool
			}
		}
		json.Unmarshal([]byte(out), &values)
		nfs := h.Config().Storage.NFS
		if values.NFS.Server != nfs.Server || values.NFS.Path != nfs.Path || values.StorageClass.Name != nfs.StorageClass || !values.StorageClass.DefaultClass {
			t.Errorf("helm get values: %s", out)
		}
		// A converged infra stage writes no revision.
		if r := run(t, ctx, h, "run", "--stage", "infra"); r.ExitCode != 0 {
			t.Fatalf("infra re-run:\n%s", r.Tail(20))
		}
		if rels := list(); len(rels) != 1 || rels[0].Revision != "1" {
			t.Errorf("after a converged infra stage: %+v", rels)
		}
		hist, err := tool(t, ctx, helmEnv, "helm", "history", "nfs-provisioner", "-n", "nfs-provisioner", "-o", "json")
		var revs []struct{ Revision int }
		if err != nil || json.Unmarshal([]byte(hist), &revs) != nil || len(revs) != 1 || revs[0].Revision != 1 {
			t.Errorf("helm history: %v\n%s", err, hist)
		}
		if _, err := tool(t, ctx, helmEnv, "helm", "history", "nfs-provisioner", "-n", "default"); err == nil {
			t.Error("helm found the release in the wrong namespace")
		}
	})

	t.Run("sops", func(t *testing.T) {
		stored, err := os.ReadFile(paths.Secrets)
		if err != nil {
			t.Fatal(err)
		}
		plain, err := tool(t, ctx, sopsEnv, "sops", "decrypt", paths.Secrets)
		if err != nil || !strings.Contains(plain, "trustdinfo:") || !strings.Contains(plain, "certs:") {
			t.Fatalf("sops decrypt of the bundle: %v\n%.200s", err, plain)
		}
		// A bundle the CLI encrypted itself (every value, its own
		// defaults) is read by the product as the same secrets.
		plainFile := filepath.Join(dir, "plain-secrets.yaml")
		writeSecretFile(t, plainFile, plain)
		if _, err := tool(t, ctx, sopsEnv, "sops", "encrypt", "--age", recipient, "--output", paths.Secrets, plainFile); err != nil {
			t.Fatal(err)
		}
		os.Remove(plainFile)
		if r := run(t, ctx, h, "run", "--stage", "talos"); r.ExitCode != 0 || !strings.Contains(r.Stderr, "no changes") {
			t.Fatalf("talos stage on the bundle the sops CLI encrypted:\n%s", r.Tail(20))
		}
		stored, _ = os.ReadFile(paths.Secrets)
		// The CLI rotates the data key in place; the product reads it and
		// finds nothing to change.
		if _, err := tool(t, ctx, sopsEnv, "sops", "rotate", "-i", paths.Secrets); err != nil {
			t.Fatal(err)
		}
		rotated, _ := os.ReadFile(paths.Secrets)
		if bytes.Equal(rotated, stored) {
			t.Fatal("sops rotate left the bundle as it was")
		}
		if r := run(t, ctx, h, "run", "--stage", "talos"); r.ExitCode != 0 || !strings.Contains(r.Stderr, "no changes") {
			t.Fatalf("talos stage on the bundle the sops CLI rotated:\n%s", r.Tail(20))
		}
		// A .sops.yaml rule adds a second recipient; `sops updatekeys`
		// re-wraps the data key for it: the product still reads the
		// bundle, and the new identity opens it with the CLI.
		second, secondRec, _ := sops.GenerateIdentity()
		secondFile := filepath.Join(dir, "second.agekey")
		writeSecretFile(t, secondFile, second+"\n")
		rules := filepath.Join(filepath.Dir(h.ConfigPath()), ".sops.yaml")
		writeFile(t, rules, []byte("creation_rules:\n  - path_regex: secrets\\.yaml$\n    age: "+recipient+","+secondRec+"\n"))
		defer os.Remove(rules)
		if _, err := tool(t, ctx, sopsEnv, "sops", "--config", rules, "updatekeys", "-y", paths.Secrets); err != nil {
			t.Fatal(err)
		}
		if _, err := tool(t, ctx, []string{sops.KeyFileEnv + "=" + secondFile}, "sops", "decrypt", paths.Secrets); err != nil {
			t.Errorf("the recipient updatekeys added cannot decrypt: %v", err)
		}
		if r := run(t, ctx, h, "run", "--stage", "talos"); r.ExitCode != 0 || !strings.Contains(r.Stderr, "no changes") {
			t.Fatalf("talos stage on the bundle after sops updatekeys:\n%s", r.Tail(20))
		}
		rotated, _ = os.ReadFile(paths.Secrets)
		// A value changed without its key: the CLI refuses the MAC.
		broken := filepath.Join(dir, "broken.yaml")
		i := bytes.Index(rotated, []byte("ENC[AES256_GCM,data:")) + len("ENC[AES256_GCM,data:")
		tampered := bytes.Clone(rotated)
		tampered[i] ^= 'A' ^ 'B'
		if tampered[i] == rotated[i] {
			tampered[i] = 'C'
		}
		os.WriteFile(broken, tampered, 0o600)
		if _, err := tool(t, ctx, sopsEnv, "sops", "decrypt", broken); err == nil {
			t.Error("sops decrypted a tampered bundle")
		}
	})

	kept, err := backup.List(filepath.Join(paths.StateDir, "etcd"))
	if err != nil || len(kept) == 0 {
		t.Fatalf("kept snapshots: %v %v", kept, err)
	}

	t.Run("age", func(t *testing.T) {
		copies, err := filepath.Glob(filepath.Join(copyDir, "*"+backup.Suffix+backup.AgeSuffix))
		if err != nil || len(copies) == 0 {
			t.Fatalf("encrypted copies in %s: %v %v", copyDir, copies, err)
		}
		for _, c := range copies {
			out := filepath.Join(dir, filepath.Base(c)+".plain")
			if _, err := tool(t, ctx, nil, "age", "-d", "-i", keyFile, "-o", out, c); err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(out)
			orig, err := os.ReadFile(filepath.Join(paths.StateDir, "etcd", strings.TrimSuffix(filepath.Base(c), backup.AgeSuffix)))
			if err != nil || !bytes.Equal(got, orig) {
				t.Errorf("age -d %s: not the kept snapshot (%v)", filepath.Base(c), err)
			}
		}
		other, _, _ := sops.GenerateIdentity()
		otherFile := filepath.Join(dir, "other.agekey")
		writeSecretFile(t, otherFile, other+"\n")
		if _, err := tool(t, ctx, nil, "age", "-d", "-i", otherFile, "-o", filepath.Join(dir, "x"), copies[0]); err == nil {
			t.Error("age decrypted a copy with another identity")
		}
	})

	t.Run("etcdutl", func(t *testing.T) {
		for _, k := range kept {
			info, err := backup.Verify(k)
			if err != nil {
				t.Fatal(err)
			}
			out, err := tool(t, ctx, nil, "etcdutl", "snapshot", "status", k, "-w", "json")
			if err != nil {
				t.Fatal(err)
			}
			var st struct {
				Revision  int64 `json:"revision"`
				TotalKey  int   `json:"totalKey"`
				TotalSize int64 `json:"totalSize"`
			}
			if err := json.Unmarshal([]byte(out), &st); err != nil || st.Revision != info.Revision || st.TotalKey != info.LiveKeys {
				t.Errorf("etcdutl snapshot status %s: %s (%v), the product says revision %d, %d keys", filepath.Base(k), out, err, info.Revision, info.LiveKeys)
			}
		}
		restoredEtcdHasTheKeys(t, ctx, dir, kept[len(kept)-1])
		b, _ := os.ReadFile(kept[0])
		b[4096+17] ^= 0x01
		bad := filepath.Join(dir, "corrupt.snapshot")
		os.WriteFile(bad, b, 0o600)
		if out, err := tool(t, ctx, nil, "etcdutl", "snapshot", "restore", bad, "--data-dir", filepath.Join(dir, "restored")); err == nil {
			t.Errorf("etcdutl restored a corrupted snapshot: %s", out)
		}
	})

	t.Run("flux", func(t *testing.T) {
		out, err := exec.CommandContext(ctx, "git", "ls-remote", snapshotURL(t, h), "refs/heads/"+h.Config().Flux.Branch).Output()
		if err != nil || len(strings.Fields(string(out))) != 2 {
			t.Fatalf("git ls-remote of the snapshot: %v %s", err, out)
		}
		checkFlux(t, ctx, h, kubeEnv, strings.Fields(string(out))[0], dir)
	})

	t.Run("node_exporter", func(t *testing.T) { checkNodeExporter(t, ctx, promFile) })

	t.Run("reports", func(t *testing.T) {
		st, err := h.State()
		if err != nil || st.Outputs.Postcheck == nil {
			t.Fatalf("no postcheck recorded: %v", err)
		}
		checkReports(t, st.Outputs.Postcheck.Archive)
	})

	t.Run("git", func(t *testing.T) {
		snap := h.Config().Flux.LocalSnapshot.URL
		anon := exec.CommandContext(ctx, "git", "ls-remote", snap)
		anon.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0")
		if out, err := anon.CombinedOutput(); err == nil || !strings.Contains(string(out), "401") && !strings.Contains(string(out), "Authentication failed") && !strings.Contains(string(out), "terminal prompts disabled") {
			t.Errorf("git without the credential: %v\n%s", err, out)
		}
		clone := filepath.Join(dir, "clone")
		if out, err := exec.CommandContext(ctx, "git", "clone", "-q", snapshotURL(t, h), clone).CombinedOutput(); err != nil {
			t.Fatalf("git clone with the credential: %v %s", err, out)
		}
		if _, err := os.Stat(filepath.Join(clone, "infra", "kustomization.yaml")); err != nil {
			t.Errorf("the clone lacks ./infra: %v", err)
		}
	})
}

// snapshotURL is the local git snapshot's URL with the credential the
// flux stage gave Flux.
func snapshotURL(t *testing.T, h *e2e.Harness) string {
	t.Helper()
	auth, err := gitsnap.ReadAuth(filepath.Join(h.Paths().StateDir, gitsnap.AuthFileName))
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(h.Config().Flux.LocalSnapshot.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(auth.Username, auth.Password)
	return u.String()
}

// restoredEtcdHasTheKeys restores a kept snapshot with `etcdutl snapshot
// restore` as a one-member cluster, starts the lab's real etcd on it and
// reads it back: every live key the product counted in the snapshot, the
// API server's objects among them.
func restoredEtcdHasTheKeys(t *testing.T, ctx context.Context, dir, snapshot string) {
	t.Helper()
	info, err := backup.Verify(snapshot)
	if err != nil {
		t.Fatal(err)
	}
	var ports [2]int
	for i := range ports {
		if ports[i], err = kube.FreePort("127.0.0.1"); err != nil {
			t.Fatal(err)
		}
	}
	peer, client := fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	data := filepath.Join(dir, "restored-etcd")
	if _, err := tool(t, ctx, nil, "etcdutl", "snapshot", "restore", snapshot, "--data-dir", data,
		"--name", "restored", "--initial-cluster", "restored="+peer, "--initial-advertise-peer-urls", peer); err != nil {
		t.Fatal(err)
	}
	startTool(t, ctx, "etcd", "--name", "restored", "--data-dir", data, "--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer, "--listen-client-urls", client, "--advertise-client-urls", client)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	var resp *clientv3.GetResponse
	deadline := time.Now().Add(20 * time.Second)
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err = cli.Get(rctx, "", clientv3.WithFromKey(), clientv3.WithKeysOnly())
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting 20s for the etcd restored from %s: %v", filepath.Base(snapshot), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	found := false
	for _, kv := range resp.Kvs {
		found = found || string(kv.Key) == "/registry/namespaces/kube-system"
	}
	if int(resp.Count) != info.LiveKeys || !found {
		t.Errorf("the etcd restored from %s holds %d keys (kube-system namespace: %v), the product counted %d", filepath.Base(snapshot), resp.Count, found, info.LiveKeys)
	}
}

// withOtherCA returns the kubeconfig at path with every cluster's CA
// replaced by a fresh self-signed one: a kubeconfig for another cluster.
func withOtherCA(t *testing.T, path string) []byte {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := certutil.NewSelfSignedCACert(certutil.Config{CommonName: "another-cluster"}, key)
	if err != nil {
		t.Fatal(err)
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	for _, c := range cfg.Clusters {
		c.CertificateAuthorityData, c.CertificateAuthority = caPEM, ""
	}
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
