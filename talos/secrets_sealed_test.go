package talos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/sops"
)

// With a Sealer the bundle is minted once and stored SOPS-encrypted: no
// secret of it is on disk in plaintext, the next Generate opens it and
// renders byte-identical configs, and without the identity it is refused
// instead of replaced.
func TestSealedBundleIsEncryptedAtRestAndKept(t *testing.T) {
	dir := filepath.Join(t.TempDir(), ".talos", "lab")
	sealer := &sops.FileSealer{KeyFile: "../sops/testdata/test-identity.agekey"}
	ids, err := sealer.Identities()
	if err != nil {
		t.Fatal(err)
	}
	sealer.Recipients = ids.Recipients
	opts := oneCP(dir)
	opts.Sealer = sealer
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
