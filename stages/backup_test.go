package stages

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"

	"github.com/homelab/bootstrap/backup"
	"github.com/homelab/bootstrap/backup/backuptest"
	"github.com/homelab/bootstrap/config"
)

// TestCopyToDirSealsTheBundle: each copy into backup.copyDir takes the
// secrets bundle with it, age-encrypted and named after the snapshot; the
// bundle copies are pruned to keep like the snapshots, and the age identity
// opens the newest into the bundle's bytes.
func TestCopyToDirSealsTheBundle(t *testing.T) {
	dir := t.TempDir()
	copies := filepath.Join(dir, "nas")
	env := prepEnv(t)
	env.Config = &config.Config{Backup: config.Backup{CopyDir: copies}}
	env.Paths = config.Paths{Secrets: filepath.Join(dir, "secrets.yaml"), StateDir: dir}
	bundle := []byte("cluster:\n  id: example\n")
	if err := os.WriteFile(env.Paths.Secrets, bundle, 0o600); err != nil {
		t.Fatal(err)
	}
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	var last backup.Info
	for i := range 3 {
		at := time.Date(2026, 11, 27, i, 0, 0, 0, time.UTC)
		p := filepath.Join(dir, at.Format("20060102T150405Z")+backup.Suffix)
		if err := os.WriteFile(p, backuptest.Snapshot(t, 3), 0o600); err != nil {
			t.Fatal(err)
		}
		if last, err = backup.Verify(p); err != nil {
			t.Fatal(err)
		}
		if err := copyToDir(env, last, []age.Recipient{id.Recipient()}, 2); err != nil {
			t.Fatal(err)
		}
	}
	sealed, _ := filepath.Glob(filepath.Join(copies, "*"+BundleCopySuffix))
	if len(sealed) != 2 || !strings.HasPrefix(filepath.Base(sealed[1]), "20261127T020000Z") {
		t.Fatalf("bundle copies %v, want the newest 2", sealed)
	}
	key := filepath.Join(dir, "key.txt")
	if err := os.WriteFile(key, []byte(id.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	plain, err := backup.Decrypt(sealed[1], key, dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(plain); !bytes.Equal(got, bundle) {
		t.Error("the bundle copy does not open into the bundle")
	}
	raw, _ := os.ReadFile(sealed[1])
	if bytes.Contains(raw, []byte("example")) {
		t.Error("the bundle copy is readable without the identity")
	}

	// Without recipients the bundle is never copied.
	if got, err := sealedBundle(env, last, nil, t.TempDir()); got != "" || err != nil {
		t.Errorf("a bundle copy without recipients: %q %v", got, err)
	}
}
