package talos

import (
	"encoding/base64"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/homelab/bootstrap/internal/sealed"
	"github.com/homelab/bootstrap/sops"
)

// sealedCP is oneCP with the bundle SOPS-encrypted to the test identity,
// and that identity.
func sealedCP(t *testing.T, dir string) (GenerateOptions, sops.Identities) {
	t.Helper()
	sealer := &sops.FileSealer{KeyFile: "../sops/testdata/test-identity.agekey"}
	ids, err := sealer.Identities()
	if err != nil {
		t.Fatal(err)
	}
	sealer.Recipients = ids.Recipients
	opts := oneCP(dir)
	opts.Sealer = sealer
	return opts, ids
}

// With a Sealer the bundle is minted once and stored SOPS-encrypted: no
// secret of it is on disk in plaintext, the next Generate opens it and
// renders byte-identical configs, and without the identity it is refused
// instead of replaced.
func TestSealedBundleIsEncryptedAtRestAndKept(t *testing.T) {
	dir := filepath.Join(t.TempDir(), ".talos", "lab")
	opts, _ := sealedCP(t, dir)
	first, err := Generate(opts)
	if err != nil {
		t.Fatal(err)
	}
	if !first.SecretsCreated {
		t.Fatal("no bundle created")
	}
	stored, err := os.ReadFile(filepath.Join(dir, SecretsFile))
	if err != nil {
		t.Fatal(err)
	}
	if !sops.IsEncrypted(stored) {
		t.Fatalf("the bundle is stored in plaintext:\n%s", stored)
	}
	for _, v := range SecretValues(first.Bundle) {
		if strings.Contains(string(stored), v) {
			t.Fatalf("a secret of the bundle is in the stored file in plaintext")
		}
	}
	if first.Bundle.Secrets.BootstrapToken == "" || strings.Contains(string(stored), first.Bundle.Secrets.BootstrapToken) {
		t.Fatal("the bootstrap token is in the stored file")
	}
	cpPath := NodeConfigPath(dir, "cp-1")
	cp1, err := os.ReadFile(cpPath)
	if err != nil {
		t.Fatal(err)
	}

	again, err := Generate(opts)
	if err != nil {
		t.Fatal(err)
	}
	if again.SecretsCreated || len(again.Changes) != 0 {
		t.Fatalf("second Generate: created %v, changes %v", again.SecretsCreated, again.Changes)
	}
	if cp1Again, _ := os.ReadFile(cpPath); string(cp1Again) != string(cp1) {
		t.Fatal("the config rendered from the opened bundle differs")
	}
	if now, _ := os.ReadFile(filepath.Join(dir, SecretsFile)); string(now) != string(stored) {
		t.Fatal("the stored bundle was rewritten")
	}

	// Without an identity: refused, the file kept.
	opts.Sealer = nil
	if _, err := Generate(opts); err == nil || !strings.Contains(err.Error(), "SOPS-encrypted") {
		t.Fatalf("Generate without a sealer: %v", err)
	}
	opts.Sealer = &sops.FileSealer{KeyFile: filepath.Join(t.TempDir(), "missing.agekey")}
	if _, err := Plan(opts); err == nil || !strings.Contains(err.Error(), "missing.agekey") {
		t.Fatalf("Plan with a missing identity file: %v", err)
	}
	if now, _ := os.ReadFile(filepath.Join(dir, SecretsFile)); string(now) != string(stored) {
		t.Fatal("a failed open replaced the stored bundle")
	}
}

// With Files sealing, nothing Generate keeps holds a key in plaintext:
// every rendered config and the talosconfig are age-encrypted (<name>.age)
// beside the SOPS-encrypted bundle, plaintext ones from before are
// replaced, and what reads them (Plan, DNSDomain, KubePrismPort, the next
// Generate) opens them in memory and finds nothing to change.
func TestSealedFilesKeepNoKeyInPlaintext(t *testing.T) {
	dir := filepath.Join(t.TempDir(), ".talos", "lab")
	opts, ids := sealedCP(t, dir)
	// First plaintext, as before encryption was switched on.
	if _, err := Generate(opts); err != nil {
		t.Fatal(err)
	}
	plainCP := mustRead(t, NodeConfigPath(dir, "cp-1"))

	files := &sealed.Files{Identities: func() ([]age.Identity, error) { return ids.Age(), nil }}
	for _, r := range ids.Recipients {
		rec, err := age.ParseX25519Recipient(r)
		if err != nil {
			t.Fatal(err)
		}
		files.Recipients = append(files.Recipients, rec)
	}
	opts.Files = files
	plan, err := Plan(opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Changes) != 4 || !strings.HasSuffix(plan.Changes[0].Path, ".yaml.age") || plan.Changes[0].Diff != "" {
		t.Fatalf("plan of the switch: %+v", plan.Changes)
	}
	res, err := Generate(opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Changes) != 4 || res.TalosconfigPath != filepath.Join(dir, TalosconfigFile+sealed.Suffix) {
		t.Fatalf("generate: %+v %s", res.Changes, res.TalosconfigPath)
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data := mustRead(t, p)
		// Private keys are PEM, base64-encoded once more in machine configs
		// and the talosconfig.
		for _, needle := range append(SecretValues(res.Bundle), "PRIVATE KEY", base64.StdEncoding.EncodeToString([]byte("-----BEGI"))) {
			if strings.Contains(string(data), needle) {
				t.Errorf("%s holds a secret in plaintext", p)
				break
			}
		}
		if rel, _ := filepath.Rel(dir, p); rel != SecretsFile && !strings.HasSuffix(p, sealed.Suffix) {
			t.Errorf("%s is kept unsealed", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := files.Read(NodeConfigPath(dir, "cp-1")); err != nil || string(got) != string(plainCP) {
		t.Fatalf("the sealed config opens to something else: %v", err)
	}
	if listed, err := RenderedFiles(dir); err != nil || len(listed) != 4 || slices.ContainsFunc(listed, func(p string) bool { return strings.HasSuffix(p, sealed.Suffix) }) {
		t.Fatalf("rendered files: %v %v", listed, err)
	}

	before := snapshot(t, dir)
	if again, err := Generate(opts); err != nil || len(again.Changes) != 0 {
		t.Fatalf("second sealed Generate: %v %+v", err, again.Changes)
	}
	if !snapshotEqual(t, dir, before) {
		t.Fatal("an unchanged sealed file was rewritten")
	}
	if plan, err := Plan(opts); err != nil || len(plan.Changes) != 0 {
		t.Fatalf("plan after sealing: %v %+v", err, plan.Changes)
	}
	if d, err := DNSDomain(files, dir, "cp-1"); err != nil || d != DefaultDNSDomain {
		t.Fatalf("dns domain from the sealed config: %q %v", d, err)
	}
	if p, err := KubePrismPort(files, dir, []string{"cp-1"}); err != nil || p != 7445 {
		t.Fatalf("KubePrism port from the sealed config: %d %v", p, err)
	}
	// Without the identity a sealed config is an error, never "no config".
	blind := &sealed.Files{Recipients: files.Recipients}
	if _, err := DNSDomain(blind, dir, "cp-1"); err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("dns domain without the identity: %v", err)
	}
}
