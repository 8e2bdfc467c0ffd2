package sealed

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
)

func sealing(t *testing.T) (*Files, *age.X25519Identity) {
	t.Helper()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	return &Files{Recipients: []age.Recipient{id.Recipient()}, Identities: func() ([]age.Identity, error) { return []age.Identity{id}, nil }, Source: "test key"}, id
}

func mtime(t *testing.T, p string) time.Time {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s mode %v", p, fi.Mode())
	}
	return fi.ModTime()
}

// TestSealedFilesHoldNoPlaintext: with recipients a file is kept only as
// path.age, opens with the identity, is rewritten only when its plaintext
// changes, and a plaintext copy from before is replaced.
func TestSealedFilesHoldNoPlaintext(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "talosconfig")
	secret := []byte("key: c2VjcmV0LWtleQ==\n")
	if err := os.WriteFile(p, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	f, id := sealing(t)

	wrote, err := f.WriteIfChanged(p, secret)
	if err != nil || !wrote {
		t.Fatalf("migrating the plaintext: %v %v", wrote, err)
	}
	if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the plaintext is still there: %v", err)
	}
	stored, _ := os.ReadFile(p + Suffix)
	if bytes.Contains(stored, []byte("c2VjcmV0")) || !bytes.HasPrefix(stored, []byte("-----BEGIN AGE ENCRYPTED FILE-----")) {
		t.Fatalf("sealed file:\n%s", stored)
	}
	if plain, err := Open(stored, []age.Identity{id}); err != nil || !bytes.Equal(plain, secret) {
		t.Fatalf("open: %q %v", plain, err)
	}
	if got, err := f.Read(p); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("read: %q %v", got, err)
	}
	if where, isSealed, err := Stored(p); err != nil || !isSealed || where != p+Suffix {
		t.Fatalf("stored: %s %v %v", where, isSealed, err)
	}

	before := mtime(t, p+Suffix)
	time.Sleep(10 * time.Millisecond)
	if wrote, err := f.WriteIfChanged(p, secret); err != nil || wrote {
		t.Fatalf("unchanged plaintext was written again: %v %v", wrote, err)
	}
	if !mtime(t, p+Suffix).Equal(before) {
		t.Fatal("unchanged plaintext touched the file")
	}
	if wrote, err := f.WriteIfChanged(p, []byte("other\n")); err != nil || !wrote {
		t.Fatalf("changed plaintext: %v %v", wrote, err)
	}
	if got, _ := f.Read(p); string(got) != "other\n" {
		t.Fatalf("read after change: %q", got)
	}

	// Without an identity a sealed file is refused by name, never taken as
	// missing.
	blind := &Files{Recipients: f.Recipients}
	if _, err := blind.Read(p); err == nil || errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "secrets.age.keyFile") {
		t.Fatalf("read without identity: %v", err)
	}
	// Encryption switched off: the file goes back to plaintext.
	plain := &Files{Identities: f.Identities}
	if wrote, err := plain.WriteIfChanged(p, []byte("other\n")); err != nil || !wrote {
		t.Fatalf("unsealing: %v %v", wrote, err)
	}
	if _, err := os.Stat(p + Suffix); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the sealed copy is still there: %v", err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Read(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("read after remove: %v", err)
	}
}

// TestPlaintextFiles: a nil *Files writes plaintext 0600 and leaves an
// unchanged file alone.
func TestPlaintextFiles(t *testing.T) {
	var f *Files
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if wrote, err := f.WriteIfChanged(p, []byte("a")); err != nil || !wrote {
		t.Fatal(wrote, err)
	}
	before := mtime(t, p)
	time.Sleep(10 * time.Millisecond)
	if wrote, err := f.WriteIfChanged(p, []byte("a")); err != nil || wrote || !mtime(t, p).Equal(before) {
		t.Fatal("rewrote an unchanged file", wrote, err)
	}
	if got, err := f.Read(p); err != nil || string(got) != "a" || f.Path(p) != p {
		t.Fatal(string(got), err)
	}
}
