package fsutil

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestWriteAtomicReplacesAndKeepsMode(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sub", "f")
	if err := WriteAtomic(p, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteAtomic(p, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	fi, _ := os.Stat(p)
	if string(b) != "two" || fi.Mode().Perm() != 0o600 {
		t.Fatalf("got %q mode %v", b, fi.Mode())
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(p), ".f.tmp-*"))
	if len(left) != 0 {
		t.Fatalf("temp files left behind: %v", left)
	}
}

func TestWriteIfChangedLeavesMtime(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if changed, err := WriteIfChanged(p, []byte("x"), 0o644); err != nil || !changed {
		t.Fatalf("first write: changed=%v err=%v", changed, err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	if changed, err := WriteIfChanged(p, []byte("x"), 0o644); err != nil || changed {
		t.Fatalf("same content: changed=%v err=%v", changed, err)
	}
	fi, _ := os.Stat(p)
	if !fi.ModTime().Equal(old) {
		t.Fatalf("mtime changed on identical write")
	}
	if changed, _ := WriteIfChanged(p, []byte("x"), 0o600); !changed {
		t.Fatalf("mode change must rewrite")
	}
	if changed, _ := WriteIfChanged(p, []byte("y"), 0o600); !changed {
		t.Fatalf("content change must rewrite")
	}
}

func TestWriteNewNeverOverwrites(t *testing.T) {
	p := filepath.Join(t.TempDir(), "secrets.yaml")
	if err := WriteNew(p, []byte("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := WriteNew(p, []byte("second"), 0o600)
	if !errors.Is(err, ErrExists) {
		t.Fatalf("want ErrExists, got %v", err)
	}
	b, _ := os.ReadFile(p)
	if string(b) != "first" {
		t.Fatalf("overwritten: %q", b)
	}
}

func TestBackup(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "config")
	if got, err := Backup(p, time.Now()); err != nil || got != "" {
		t.Fatalf("missing source: %q %v", got, err)
	}
	os.WriteFile(p, []byte("ctx"), 0o600)
	got, err := Backup(p, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(got)
	fi, _ := os.Stat(got)
	if string(b) != "ctx" || fi.Mode().Perm() != 0o600 || filepath.Dir(got) != dir {
		t.Fatalf("backup %s: %q %v", got, b, fi.Mode())
	}
}

// Directories made for an owner-only file are owner-only.
func TestDirectoriesForSecretsAreOwnerOnly(t *testing.T) {
	root := t.TempDir()
	secret := filepath.Join(root, "talos", "nodes", "cp-1.yaml")
	if err := WriteAtomic(secret, []byte("key"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Join(root, "talos"), filepath.Join(root, "talos", "nodes")} {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v, want 0700", d, fi.Mode().Perm(), err)
		}
	}
}
