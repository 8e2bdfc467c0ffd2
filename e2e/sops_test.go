package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/sops"
	"github.com/homelab/bootstrap/talos"
)

// TestSOPSEndToEnd: a SOPS-encrypted Secret in the demo tree is decrypted
// by the real kustomize-controller with the age identity the flux stage
// hands it (Secret sops-age, key identity.agekey), after the precheck
// proved that identity on the same file; the plaintext appears in no file
// bootstrap writes. Then the cluster's plaintext secrets bundle is moved to
// SOPS with `bootstrap secrets encrypt` (a backup kept, no secret minted:
// a re-run applies nothing to Talos), and a wrong key fails the precheck
// naming the file.
func TestSOPSEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 6*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1})
	// Everything the lab and bootstrap write: the config, .talos/, ai/state/,
	// the demo tree and each run's captured output.
	dir := filepath.Dir(filepath.Dir(h.ConfigPath()))
	identity, recipient, err := sops.GenerateIdentity()
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "age.agekey")
	writeSecretFile(t, keyFile, identity+"\n")
	if err := h.EditConfig(func(s string) (string, error) {
		s = strings.Replace(s, "\nflux:\n", "\nflux:\n  decryption: {enabled: true}\n", 1)
		return s + "secrets:\n  age:\n    keyFile: " + keyFile + "\n", nil
	}); err != nil {
		t.Fatal(err)
	}

	// The user's encrypted Secret, as `sops encrypt` writes it, under the
	// name common Flux layouts give it: the snapshot serves an encrypted
	// secrets.yaml (it left any secrets.yaml out by name before).
	const password = "sops-e2e-plaintext-4d1f9c"
	manifest := "apiVersion: v1\nkind: Secret\nmetadata:\n  name: demo\n  namespace: homelab\ntype: Opaque\nstringData:\n  password: " + password + "\n"
	enc, err := sops.Encrypt([]byte(manifest), sops.EncryptOptions{Recipients: []string{recipient}, EncryptedRegex: "^(data|stringData)$"})
	if err != nil {
		t.Fatal(err)
	}
	infraDir := filepath.Join(h.Lab.GitDir(), "infra")
	writeFile(t, filepath.Join(infraDir, "secrets.yaml"), enc)
	kust, err := os.ReadFile(filepath.Join(infraDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(infraDir, "kustomization.yaml"), append(kust, "  - secrets.yaml\n"...))

	first := run(t, ctx, h, "run", "--stage", "all")
	if first.ExitCode != 0 {
		t.Fatalf("run with a SOPS Secret failed:\n%s", first.Tail(40))
	}
	if err := h.PostcheckGreen(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(first.Stdout+first.Stderr, "infra/secrets.yaml decrypts with "+keyFile) {
		t.Errorf("the precheck did not prove the identity on the repository's SOPS file:\n%s", first.Tail(40))
	}
	kc, err := h.Lab.Kube.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	sec, err := kc.Client().CoreV1().Secrets("homelab").Get(ctx, "demo", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the SOPS Secret is not in the cluster: %v", err)
	}
	if got := string(sec.Data["password"]); got != password {
		t.Fatalf("Secret homelab/demo password = %q: kustomize-controller did not decrypt it", got)
	}
	dec, err := kc.Client().CoreV1().Secrets("flux-system").Get(ctx, "sops-age", metav1.GetOptions{})
	if err != nil || strings.TrimSpace(string(dec.Data["identity.agekey"])) != identity {
		t.Fatalf("the decryption Secret flux-system/sops-age: %v (keys %v)", err, keysOf(dec.Data))
	}
	noPlaintextUnder(t, dir, password, keyFile)
	noPlaintextUnder(t, dir, identity, keyFile)

	// Another identity: the precheck fails on the repository's file, naming
	// it, before anything is installed.
	other, _, _ := sops.GenerateIdentity()
	writeSecretFile(t, keyFile, other+"\n")
	pre := run(t, ctx, h, "run", "--stage", "precheck")
	if pre.ExitCode == 0 || !strings.Contains(pre.Stdout+pre.Stderr, "infra/secrets.yaml") {
		t.Fatalf("precheck with the wrong identity (exit %d) does not name the file:\n%s", pre.ExitCode, pre.Tail(30))
	}
	// A key file holding other keys too (keys.txt gathers every project's):
	// the cluster gets only the identity that opens the repository's files.
	writeSecretFile(t, keyFile, "# other project\n"+other+"\n# this cluster\n"+identity+"\n")
	if r := run(t, ctx, h, "run", "--stage", "flux"); r.ExitCode != 0 {
		t.Fatalf("flux stage with two identities: exit %d\n%s", r.ExitCode, r.Tail(30))
	}
	dec, err = kc.Client().CoreV1().Secrets("flux-system").Get(ctx, "sops-age", metav1.GetOptions{})
	if err != nil || strings.TrimSpace(string(dec.Data["identity.agekey"])) != identity {
		t.Errorf("sops-age holds %d bytes (%v), want exactly the identity that opens infra/secrets.yaml", len(dec.Data["identity.agekey"]), err)
	}
	if strings.Contains(string(dec.Data["identity.agekey"]), other) {
		t.Error("sops-age holds the other project's identity")
	}
	writeSecretFile(t, keyFile, identity+"\n")

	// The bundle is plaintext so far; with recipients the talos stage says so.
	secretsPath := h.Paths().Secrets
	plain, err := os.ReadFile(secretsPath)
	if err != nil || sops.IsEncrypted(plain) {
		t.Fatalf("bundle before the migration: encrypted %v, %v", sops.IsEncrypted(plain), err)
	}
	if err := h.EditConfig(func(s string) (string, error) {
		return strings.Replace(s, "secrets:\n  age:\n", "secrets:\n  age:\n    recipients: ["+recipient+"]\n", 1), nil
	}); err != nil {
		t.Fatal(err)
	}
	tal := run(t, ctx, h, "run", "--stage", "talos")
	if tal.ExitCode != 0 || !strings.Contains(tal.Stdout+tal.Stderr, "bootstrap secrets encrypt") {
		t.Fatalf("talos stage with recipients and a plaintext bundle (exit %d) does not point at the migration:\n%s", tal.ExitCode, tal.Tail(20))
	}
	before := counters(t, ctx, h)
	mig := run(t, ctx, h, "secrets", "encrypt")
	if mig.ExitCode != 0 {
		t.Fatalf("bootstrap secrets encrypt:\n%s\n%s", mig.Stdout, mig.Stderr)
	}
	stored, err := os.ReadFile(secretsPath)
	if err != nil || !sops.IsEncrypted(stored) {
		t.Fatalf("bundle after the migration is not encrypted (%v)", err)
	}
	backups, _ := filepath.Glob(secretsPath + ".bak-*")
	if len(backups) != 1 {
		t.Fatalf("backups %v, want the one plaintext copy", backups)
	}
	if b, _ := os.ReadFile(backups[0]); !bytes.Equal(b, plain) {
		t.Fatal("the backup is not the plaintext bundle as it was")
	}
	bundle, err := talos.LoadSecrets(secretsPath, &sops.FileSealer{KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range talos.SecretValues(bundle) {
		if strings.Contains(string(stored), v) {
			t.Fatal("a secret of the bundle is stored in plaintext after the migration")
		}
	}
	// The sops CLI opens what `bootstrap secrets encrypt` wrote, to the
	// bundle as it was.
	cliPlain, err := tool(t, ctx, []string{sops.KeyFileEnv + "=" + keyFile}, "sops", "decrypt", secretsPath)
	if err != nil {
		t.Fatal(err)
	}
	var gotTree, wantTree any
	if err := yaml.Unmarshal([]byte(cliPlain), &gotTree); err != nil || yaml.Unmarshal(plain, &wantTree) != nil || !reflect.DeepEqual(gotTree, wantTree) {
		t.Errorf("sops decrypt of the migrated bundle is not the plaintext bundle (%v):\n%.300s", err, cliPlain)
	}
	// The files derived from the bundle were age-encrypted by the talos
	// run once recipients were set: no key is left in plaintext beside
	// the encrypted bundle but the backup the user was told to delete.
	for _, f := range []string{"controlplane.yaml.age", "nodes/cp-1.yaml.age", "talosconfig.age", "kubeconfig.age"} {
		if !strings.Contains(tal.Stdout+tal.Stderr, f) {
			t.Errorf("the talos stage with recipients did not write %s:\n%s", f, tal.Tail(30))
		}
	}
	sealedAtRest(t, ctx, h, keyFile, backups[0])

	again := run(t, ctx, h, "secrets", "encrypt")
	if again.ExitCode != 0 || !strings.Contains(again.Stdout, "already SOPS-encrypted") {
		t.Errorf("second migration: exit %d\n%s", again.ExitCode, again.Stdout)
	}
	// The same secrets: the cluster takes nothing new.
	after := run(t, ctx, h, "run", "--stage", "all")
	if after.ExitCode != 0 {
		t.Fatalf("run after the migration failed:\n%s", after.Tail(40))
	}
	if err := h.PostcheckGreen(); err != nil {
		t.Fatal(err)
	}
	if n := counters(t, ctx, h).TalosApplies - before.TalosApplies; n != 0 {
		t.Errorf("the run after the migration applied %d Talos configs: the bundle changed", n)
	}
	if strings.Contains(after.Stdout+after.Stderr, "bootstrap secrets encrypt") {
		t.Error("the talos stage still calls the encrypted bundle plaintext")
	}
	if !strings.Contains(after.Stdout, "is SOPS-encrypted and opens with "+keyFile) {
		t.Errorf("the precheck did not open the encrypted bundle:\n%s", after.Tail(40))
	}
	// The whole pipeline ran on the sealed files and left nothing in
	// plaintext.
	sealedAtRest(t, ctx, h, keyFile, backups[0])

	// A key file that opens none of the recipients: config validate refuses
	// it (exit 2, the field named) before any call.
	writeSecretFile(t, keyFile, other+"\n")
	bad := run(t, ctx, h, "run", "--stage", "precheck")
	if bad.ExitCode != 2 || !strings.Contains(bad.Stdout+bad.Stderr, "secrets.age.keyFile") {
		t.Fatalf("a key file for none of the recipients (exit %d):\n%s", bad.ExitCode, bad.Tail(20))
	}
}

// sealedAtRest checks that the cluster's directory holds no key in
// plaintext (PEM, as is or base64-encoded as configs embed it) but in the
// allowed files, that every kept file is a .age the age CLI opens with the
// identity, and that kubectl reaches the cluster with the kubeconfig
// `bootstrap kubeconfig` prints, never written out.
func sealedAtRest(t *testing.T, ctx context.Context, h *e2e.Harness, keyFile string, allowed ...string) {
	t.Helper()
	dir := h.Paths().TalosDir
	for _, needle := range []string{"PRIVATE KEY", "LS0tLS1CRUdJ" /* base64 of "-----BEGI" */} {
		noPlaintextUnder(t, dir, needle, allowed...)
	}
	for _, rel := range []string{"controlplane.yaml", "worker.yaml", "nodes/cp-1.yaml", "talosconfig", "kubeconfig"} {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is kept in plaintext (%v)", p, err)
		}
		out, err := tool(t, ctx, nil, "age", "-d", "-i", keyFile, p+".age")
		if err != nil || !strings.Contains(out, "machine:") && !strings.Contains(out, "contexts:") {
			t.Errorf("age -d %s.age: %v\n%.200s", rel, err, out)
		}
	}
	tc := run(t, ctx, h, "talosconfig")
	if cfg, err := clientconfig.FromBytes([]byte(tc.Stdout)); err != nil || cfg.Context != "lab" || cfg.Contexts["lab"] == nil || cfg.Contexts["lab"].Key == "" {
		t.Errorf("bootstrap talosconfig printed no talosconfig for lab (%v):\n%.200s", err, tc.Stdout)
	}
	script := fmt.Sprintf("%q kubeconfig --config %q | %q --kubeconfig /dev/stdin get nodes -o name", h.Binary(), h.ConfigPath(), toolBin(t, "kubectl"))
	out, err := exec.CommandContext(ctx, "bash", "-c", "set -o pipefail; "+script).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "node/cp-1") {
		t.Errorf("kubectl with the printed kubeconfig: %v\n%s", err, out)
	}
}

func writeSecretFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func keysOf(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// noPlaintextUnder fails when any file under dir but allowed holds s.
func noPlaintextUnder(t *testing.T, dir, s string, allowed ...string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		for _, a := range allowed {
			if p == a {
				return nil
			}
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil // a socket or a file removed meanwhile
		}
		if bytes.Contains(b, []byte(s)) {
			t.Errorf("%s holds a plaintext secret", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
