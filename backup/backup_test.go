package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"filippo.io/age/armor"

	"github.com/homelab/bootstrap/backup/backuptest"
)

func source(data []byte) []Source {
	return []Source{func(_ context.Context, w io.Writer) (int64, error) {
		n, err := io.Copy(w, bytes.NewReader(data))
		return n, err
	}}
}

// TestTakeVerifyPrune: a good snapshot is kept 0600 under its time with
// its revision and key count; a corrupted or truncated one is refused and
// leaves nothing behind; pruning keeps the newest.
func TestTakeVerifyPrune(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etcd")
	// A run killed while taking one left its temp file behind.
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, ".taking-123"), []byte("half"), 0o600)
	good := backuptest.Snapshot(t, 42)
	t0 := time.Date(2026, 11, 23, 3, 0, 0, 0, time.UTC)
	info, err := Take(context.Background(), source(good), dir, t0)
	if err != nil {
		t.Fatal(err)
	}
	if info.Revision != 42 || info.Keys != 42 || filepath.Base(info.Path) != "20261123T030000Z.snapshot" {
		t.Fatalf("info %+v", info)
	}
	if fi, err := os.Stat(info.Path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode: %v %v", fi, err)
	}

	bad := bytes.Clone(good)
	bad[len(bad)/2] ^= 0xff
	for name, data := range map[string][]byte{"flipped byte": bad, "truncated": good[:len(good)-100], "no digest": good[:len(good)-32], "empty": nil} {
		if _, err := Take(context.Background(), source(data), dir, t0.Add(time.Hour)); err == nil {
			t.Errorf("%s: kept", name)
		}
	}
	all, _ := List(dir)
	entries, _ := os.ReadDir(dir)
	if len(all) != 1 || len(entries) != 1 {
		t.Fatalf("after refused snapshots: %v, dir %v", all, entries)
	}
	if _, err := Verify(writeTemp(t, bad)); err == nil || !strings.Contains(err.Error(), "corrupted") {
		t.Fatalf("verify flipped: %v", err)
	}

	for i := 1; i <= 4; i++ {
		if _, err := Take(context.Background(), source(good), dir, t0.Add(time.Duration(i)*24*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	// Other files kept beside the snapshots (a sealed bundle per snapshot)
	// are pruned only by their own suffix.
	for i := 0; i <= 4; i++ {
		name := t0.Add(time.Duration(i)*24*time.Hour).Format(timeLayout) + ".bundle.age"
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := Prune(dir, 2)
	if err != nil || len(removed) != 3 || strings.Contains(strings.Join(removed, " "), "bundle") {
		t.Fatalf("prune: %v %v", removed, err)
	}
	if removed, err := Prune(dir, 1, ".bundle.age"); err != nil || len(removed) != 4 || !strings.HasSuffix(removed[0], "20261126T030000Z.bundle.age") {
		t.Fatalf("prune bundles: %v %v", removed, err)
	}
	if left, _ := List(dir, ".bundle.age", Suffix); len(left) != 3 {
		t.Fatalf("left: %v", left)
	}
	newest, at, err := Newest(dir)
	if err != nil || !at.Equal(t0.Add(96*time.Hour)) || filepath.Base(newest) != "20261127T030000Z.snapshot" {
		t.Fatalf("newest %s %s %v", newest, at, err)
	}
}

func writeTemp(t *testing.T, b []byte) string {
	p := filepath.Join(t.TempDir(), "x.snapshot")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCopyEncrypted: a copy to another directory is encrypted to the age
// recipients; the identity decrypts it to the kept snapshot, which still
// verifies; without recipients the copy is the snapshot itself.
func TestCopyEncrypted(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etcd")
	info, err := Take(context.Background(), source(backuptest.Snapshot(t, 3)), dir, time.Date(2026, 11, 23, 3, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	recipients, err := ParseRecipients([]string{id.Recipient().String()})
	if err != nil {
		t.Fatal(err)
	}
	copyDir := filepath.Join(t.TempDir(), "nas")
	dst, err := Copy(info.Path, copyDir, recipients)
	if err != nil || !strings.HasSuffix(dst, ".snapshot.age") {
		t.Fatalf("copy %s %v", dst, err)
	}
	enc, _ := os.ReadFile(dst)
	orig, _ := os.ReadFile(info.Path)
	if bytes.Contains(enc, orig[:64]) {
		t.Fatal("the copy is not encrypted")
	}
	r, err := age.Decrypt(bytes.NewReader(enc), id)
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := io.ReadAll(r)
	if !bytes.Equal(plain, orig) {
		t.Fatal("decrypted copy differs from the snapshot")
	}
	if _, err := Verify(writeTemp(t, plain)); err != nil {
		t.Fatalf("decrypted copy does not verify: %v", err)
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o600 {
		t.Fatalf("copy mode %v", fi.Mode())
	}
	if kept, _ := List(copyDir); len(kept) != 1 {
		t.Fatalf("copies listed: %v", kept)
	}
	if _, at, err := Newest(copyDir); err != nil || at.IsZero() {
		t.Fatalf("newest copy: %v %v", at, err)
	}
	plainCopy, err := Copy(info.Path, filepath.Join(t.TempDir(), "usb"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(plainCopy); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseRecipients([]string{"age1notakey"}); err == nil {
		t.Fatal("parsed a bad recipient")
	}
}

// TestTakeFallsBackToTheNextSource: a control plane whose stream breaks
// midway leaves nothing of its bytes in the snapshot taken from the next.
func TestTakeFallsBackToTheNextSource(t *testing.T) {
	good := backuptest.Snapshot(t, 5)
	broken := func(_ context.Context, w io.Writer) (int64, error) {
		n, _ := w.Write(good[:len(good)/2])
		return int64(n), errors.New("stream broke")
	}
	dir := filepath.Join(t.TempDir(), "etcd")
	info, err := Take(context.Background(), append([]Source{broken}, source(good)...), dir, time.Now())
	if err != nil || info.Revision != 5 {
		t.Fatalf("fallback: %+v %v", info, err)
	}
	if b, _ := os.ReadFile(info.Path); !bytes.Equal(b, good) {
		t.Fatal("the kept snapshot is not the second source's")
	}
	if _, err := Take(context.Background(), []Source{broken, broken}, dir, time.Now()); err == nil || !strings.Contains(err.Error(), "none of 2 source(s)") || !strings.Contains(err.Error(), "stream broke") {
		t.Fatalf("all sources broken: %v", err)
	}
}

// TestDecryptReadsBothAgeForms: Decrypt reads a binary copy and one
// re-encrypted ASCII-armored (`age -a`, as README's own `age` commands
// may leave it), as the age CLI does.
func TestDecryptReadsBothAgeForms(t *testing.T) {
	orig := backuptest.Snapshot(t, 4)
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key.txt")
	os.WriteFile(keyFile, []byte(id.String()+"\n"), 0o600)
	for _, armored := range []bool{false, true} {
		var buf bytes.Buffer
		var sink io.WriteCloser = nopCloser{&buf}
		if armored {
			buf.WriteString("\n")
			sink = armor.NewWriter(&buf)
		}
		w, err := age.Encrypt(sink, id.Recipient())
		if err != nil {
			t.Fatal(err)
		}
		w.Write(orig)
		w.Close()
		sink.Close()
		src := filepath.Join(dir, fmt.Sprintf("etcd-armored-%v.snapshot.age", armored))
		os.WriteFile(src, buf.Bytes(), 0o600)
		out, err := Decrypt(src, keyFile, dir)
		if err != nil {
			t.Fatalf("armored %v: %v", armored, err)
		}
		got, _ := os.ReadFile(out)
		if !bytes.Equal(got, orig) {
			t.Errorf("armored %v: the decrypted copy differs", armored)
		}
	}
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// TestVerifyDecryptedNamesTheCopy: a snapshot decrypted from an age copy
// is named by the copy and taken when the copy's name says (or at the
// copy's modification time when renamed), not when it was decrypted.
func TestVerifyDecryptedNamesTheCopy(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etcd")
	taken := time.Date(2026, 11, 23, 3, 0, 0, 0, time.UTC)
	info, err := Take(context.Background(), source(backuptest.Snapshot(t, 3)), dir, taken)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := age.GenerateX25519Identity()
	keyFile := filepath.Join(t.TempDir(), "key.txt")
	os.WriteFile(keyFile, []byte(id.String()+"\n"), 0o600)
	recipients, _ := ParseRecipients([]string{id.Recipient().String()})
	copyPath, err := Copy(info.Path, filepath.Join(t.TempDir(), "nas"), recipients)
	if err != nil {
		t.Fatal(err)
	}
	renamed := filepath.Join(filepath.Dir(copyPath), "cluster-backup.age")
	if err := os.Link(copyPath, renamed); err != nil {
		t.Fatal(err)
	}
	mtime := time.Date(2026, 11, 24, 5, 6, 7, 0, time.UTC)
	os.Chtimes(renamed, mtime, mtime)
	for copyFile, want := range map[string]time.Time{copyPath: taken, renamed: mtime} {
		plain, err := Decrypt(copyFile, keyFile, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		got, err := VerifyDecrypted(plain, copyFile)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Taken.Equal(want) || got.Source() != copyFile || got.Path != plain || !strings.Contains(got.String(), filepath.Base(copyFile)) {
			t.Errorf("%s: taken %s (want %s), source %s, %s", filepath.Base(copyFile), got.Taken, want, got.Source(), got)
		}
	}
}
