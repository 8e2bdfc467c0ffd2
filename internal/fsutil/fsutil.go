// Package fsutil holds the file operations that keep the runner's outputs
// safe: atomic replacement, write-once files for secrets, no-churn rewrites
// and backups before a merge.
package fsutil

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// ErrExists is returned by WriteNew when the target already exists.
var ErrExists = fs.ErrExist

// WriteAtomic replaces path with data so that a reader (or a crash) sees either
// the old content or the new one, never a torn file: the data goes to a
// temporary file in the same directory, is fsynced, renamed over the target,
// and the directory is fsynced so the rename itself is durable.
func WriteAtomic(path string, data []byte, perm fs.FileMode) error {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("replacing %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

// WriteIfChanged writes data atomically unless path already holds exactly
// these bytes with this mode. It reports whether it wrote, so unchanged
// inputs leave files (and their mtimes) untouched.
func WriteIfChanged(path string, data []byte, perm fs.FileMode) (bool, error) {
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm() == perm.Perm() {
		old, err := os.ReadFile(path)
		if err == nil && bytes.Equal(old, data) {
			return false, nil
		}
	}
	if err := WriteAtomic(path, data, perm); err != nil {
		return false, err
	}
	return true, nil
}

// WriteNew creates path with data only if it does not exist yet; otherwise it
// returns an error matching ErrExists and leaves the existing file alone. The
// content appears complete or not at all (hard link of a synced temp file),
// which is what write-once secrets need.
func WriteNew(path string, data []byte, perm fs.FileMode) error {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s already exists: %w", path, ErrExists)
		}
		return fmt.Errorf("creating %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

// Backup copies path to "<path>.bak-<UTC timestamp>" keeping its mode and
// returns the backup's path. A missing source is not an error: it returns "".
func Backup(path string, now time.Time) (string, error) {
	src, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return "", err
	}
	data, err := io.ReadAll(src)
	if err != nil {
		return "", err
	}
	dst := fmt.Sprintf("%s.bak-%s", path, now.UTC().Format("20060102T150405.000000000Z"))
	if err := WriteNew(dst, data, fi.Mode().Perm()); err != nil {
		return "", err
	}
	return dst, nil
}

func writeTemp(path string, data []byte, perm fs.FileMode) (string, error) {
	dir := filepath.Dir(path)
	// A directory made to hold an owner-only file is owner-only too
	// (.talos/<cluster>/nodes/ holds the machine configs' keys).
	dirPerm := fs.FileMode(0o755)
	if perm.Perm()&0o077 == 0 {
		dirPerm = 0o700
	}
	if err := os.MkdirAll(dir, dirPerm); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return "", err
	}
	name := f.Name()
	fail := func(err error) (string, error) {
		f.Close()
		os.Remove(name)
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	// Chmod before writing so secret content never sits in a wider-mode file.
	if err := f.Chmod(perm); err != nil {
		return fail(err)
	}
	if _, err := f.Write(data); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(name)
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	return name, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	// Some filesystems refuse fsync on directories; the rename already happened.
	_ = d.Sync()
	return nil
}
