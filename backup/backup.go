// Package backup takes etcd snapshots through Talos, verifies each one
// with etcd's own file format before keeping it, and keeps the newest N.
//
// A snapshot as etcd's Maintenance.Snapshot streams it (and Talos's
// EtcdSnapshot passes on) is the bbolt database followed by the sha256 of
// the database (server/etcdserver/api/v3rpc/maintenance.go at etcd
// v3.6.5). Verify checks that digest, opens the database read-only and
// reads its key bucket: the number of key revisions and the newest
// revision (storage/mvcc/revision.go: 8-byte big-endian main revision,
// '_', 8-byte sub revision).
package backup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"filippo.io/age"
	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"

	"github.com/homelab/bootstrap/internal/sealed"
)

// Suffix ends every kept snapshot's file name: <UTC timestamp>.snapshot.
const Suffix = ".snapshot"

// timeLayout names snapshots so that names sort by time.
const timeLayout = "20060102T150405Z"

// Info describes a verified snapshot.
type Info struct {
	// Path is the snapshot file read; Origin, when set, the age-encrypted
	// copy it was decrypted from (Path is then a temporary file).
	Path   string
	Origin string
	Taken  time.Time
	// Size is the database's size (without the digest).
	Size   int64
	SHA256 string
	// Revision is the newest etcd revision in the snapshot; Keys the number
	// of key revisions it holds; LiveKeys the keys that exist at Revision
	// (what `etcdutl snapshot status` calls totalKey).
	Revision int64
	Keys     int
	LiveKeys int
}

// String is one line for the user.
func (i Info) String() string {
	return fmt.Sprintf("%s: revision %d, %d keys (%d key revisions), %.1f MiB, sha256 %s… verified", filepath.Base(i.Source()), i.Revision, i.LiveKeys, i.Keys, float64(i.Size)/(1<<20), i.SHA256[:12])
}

// Source is the file the user has: the encrypted copy when the snapshot
// was decrypted from one, else the snapshot itself.
func (i Info) Source() string {
	if i.Origin != "" {
		return i.Origin
	}
	return i.Path
}

// VerifyDecrypted is Verify for plain, the plaintext Decrypt wrote from
// the copy origin: the snapshot is named by its copy, and taken when the
// copy's name says (or, failing that, at the copy's modification time),
// not when it was decrypted.
func VerifyDecrypted(plain, origin string) (Info, error) {
	info, err := Verify(plain)
	if err != nil {
		return Info{}, err
	}
	info.Origin = origin
	base := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(origin), AgeSuffix), Suffix)
	if t, err := time.Parse(timeLayout, base); err == nil {
		info.Taken = t
	} else if st, err := os.Stat(origin); err == nil {
		info.Taken = st.ModTime().UTC()
	}
	return info, nil
}

// Source streams one snapshot into w (talos.Ops.EtcdSnapshot).
type Source func(ctx context.Context, w io.Writer) (int64, error)

// Take streams a snapshot from the first of srcs that gives one (a
// source that fails midway is truncated away and the next is tried) into
// dir (created 0700), verifies it, and only then gives it its final name,
// so dir never holds a partial or unverified snapshot under a snapshot's
// name. Files are 0600: a snapshot holds every Secret of the cluster.
func Take(ctx context.Context, srcs []Source, dir string, now time.Time) (Info, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Info{}, err
	}
	// What a killed run left half-written (callers hold the cluster lock:
	// no other snapshot is being taken).
	if stale, err := filepath.Glob(filepath.Join(dir, ".taking-*")); err == nil {
		for _, p := range stale {
			_ = os.Remove(p)
		}
	}
	tmp, err := os.CreateTemp(dir, ".taking-*")
	if err != nil {
		return Info{}, err
	}
	tmpPath := tmp.Name()
	defer os.Remove(tmpPath)
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return Info{}, err
	}
	var errs []error
	taken := false
	for _, src := range srcs {
		if err := rewind(tmp); err != nil {
			tmp.Close()
			return Info{}, err
		}
		if _, err := src(ctx, tmp); err != nil {
			errs = append(errs, err)
			continue
		}
		taken = true
		break
	}
	if !taken {
		tmp.Close()
		return Info{}, fmt.Errorf("none of %d source(s) gave an etcd snapshot: %w", len(srcs), errors.Join(errs...))
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return Info{}, err
	}
	if err := tmp.Close(); err != nil {
		return Info{}, err
	}
	info, err := Verify(tmpPath)
	if err != nil {
		return Info{}, fmt.Errorf("the snapshot just taken does not verify, not kept: %w", err)
	}
	final := filepath.Join(dir, now.UTC().Format(timeLayout)+Suffix)
	if err := os.Rename(tmpPath, final); err != nil {
		return Info{}, err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	info.Path, info.Taken = final, now.UTC()
	return info, nil
}

// rewind empties f for the next attempt.
func rewind(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.Seek(0, io.SeekStart)
	return err
}

// Verify checks a snapshot file: its trailing sha256 against the database
// before it, then the database itself (bbolt opens it, the key bucket is
// there). A file without a digest is refused: etcdutl accepts one only
// with --skip-hash-check, and this tool never writes one.
func Verify(path string) (Info, error) {
	f, err := os.Open(path)
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Info{}, err
	}
	size := st.Size() - sha256.Size
	// etcdutl's rule (etcdutl/snapshot/v3_snapshot.go hasChecksum at
	// v3.6.5): a snapshot with a digest is whole 512-byte blocks plus it.
	if size <= 0 || size%512 != 0 {
		return Info{}, fmt.Errorf("%s is %d bytes: not an etcd snapshot with its sha256 (want n×512 + 32)", filepath.Base(path), st.Size())
	}
	h := sha256.New()
	if _, err := io.CopyN(h, f, size); err != nil {
		return Info{}, err
	}
	want := make([]byte, sha256.Size)
	if _, err := io.ReadFull(f, want); err != nil {
		return Info{}, err
	}
	if got := h.Sum(nil); !bytes.Equal(got, want) {
		return Info{}, fmt.Errorf("%s: sha256 of the database is %x, the snapshot says %x: corrupted", filepath.Base(path), got[:8], want[:8])
	}
	info := Info{Path: path, Size: size, SHA256: hex.EncodeToString(want), Taken: st.ModTime().UTC()}
	if t, err := time.Parse(timeLayout, strings.TrimSuffix(filepath.Base(path), Suffix)); err == nil {
		info.Taken = t
	}
	if info.Revision, info.Keys, info.LiveKeys, err = readDatabase(f, size); err != nil {
		return Info{}, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return info, nil
}

// readDatabase opens the first size bytes of f (the database without its
// digest) with bbolt, read-only, from a private copy: bbolt maps the whole
// file, and the digest is not part of the database.
func readDatabase(f *os.File, size int64) (rev int64, keys, live int, err error) {
	tmp, err := os.CreateTemp("", "bootstrap-etcd-verify-*")
	if err != nil {
		return 0, 0, 0, err
	}
	defer os.Remove(tmp.Name())
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		tmp.Close()
		return 0, 0, 0, err
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return 0, 0, 0, err
	}
	if _, err := io.CopyN(tmp, f, size); err != nil {
		tmp.Close()
		return 0, 0, 0, err
	}
	if err := tmp.Close(); err != nil {
		return 0, 0, 0, err
	}
	db, err := bolt.Open(tmp.Name(), 0o400, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return 0, 0, 0, fmt.Errorf("not a database bbolt can open: %w", err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("key"))
		if b == nil {
			return errors.New("no key bucket: not an etcd database")
		}
		// Each entry is one revision of one key, its value the KeyValue;
		// a deletion is a tombstone: the revision key marked 't'
		// (storage/mvcc/revision.go at etcd v3.6.5). The keys alive at
		// the last revision are counted as etcdutl's snapshot status does
		// (etcdutl/snapshot/v3_snapshot.go Status).
		seen := map[string]struct{}{}
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			keys++
			var kv mvccpb.KeyValue
			if err := proto.Unmarshal(v, &kv); err != nil {
				return fmt.Errorf("revision %x: not an etcd key value: %w", k, err)
			}
			if len(k) == tombstoneLen && k[tombstoneLen-1] == 't' {
				delete(seen, string(kv.Key))
			} else {
				seen[string(kv.Key)] = struct{}{}
			}
		}
		live = len(seen)
		if k, _ := c.Last(); len(k) >= 8 {
			rev = int64(binary.BigEndian.Uint64(k[:8]))
		}
		return nil
	})
	return rev, keys, live, err
}

// tombstoneLen is a marked revision key's length: main and sub revision
// (8 + 1 + 8 bytes) and the mark.
const tombstoneLen = 8 + 1 + 8 + 1

// List returns the kept files in dir whose names end in one of suffixes
// (default SnapshotSuffixes: snapshots and their age-encrypted copies),
// newest first: names start with the snapshot time. Names only; they are
// verified when taken.
func List(dir string, suffixes ...string) ([]string, error) {
	if len(suffixes) == 0 {
		suffixes = SnapshotSuffixes
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		// A leading dot marks a temp file still being written.
		if e.Type().IsRegular() && hasSuffix(e.Name(), suffixes) && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(out)))
	return out, nil
}

// SnapshotSuffixes end the names of snapshot copies: plain or encrypted.
var SnapshotSuffixes = []string{Suffix, Suffix + AgeSuffix}

// hasSuffix reports whether name ends in one of suffixes.
func hasSuffix(name string, suffixes []string) bool {
	for _, s := range suffixes {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// Prune removes all but the newest keep files that List(dir, suffixes...)
// gives and returns what it removed.
func Prune(dir string, keep int, suffixes ...string) ([]string, error) {
	all, err := List(dir, suffixes...)
	if err != nil || len(all) <= keep {
		return nil, err
	}
	var removed []string
	for _, p := range all[keep:] {
		if err := os.Remove(p); err != nil {
			return removed, err
		}
		removed = append(removed, p)
	}
	return removed, nil
}

// Newest returns when the newest kept snapshot was taken (zero without one).
func Newest(dir string) (string, time.Time, error) {
	all, err := List(dir)
	if err != nil || len(all) == 0 {
		return "", time.Time{}, err
	}
	t, err := time.Parse(timeLayout, strings.TrimSuffix(strings.TrimSuffix(filepath.Base(all[0]), AgeSuffix), Suffix))
	return all[0], t, err
}

// AgeSuffix ends a copy encrypted with age.
const AgeSuffix = ".age"

// Copy writes the kept snapshot src into dir (created 0700) under the same
// name, through a temp file and a rename, 0600. With recipients the copy
// is encrypted with age to all of them (name + ".age"), so a copy off the
// host (an NFS share, a USB disk) holds no readable Secret.
func Copy(src, dir string, recipients []age.Recipient) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	name := filepath.Base(src)
	if len(recipients) > 0 {
		name += AgeSuffix
	}
	tmp, err := os.CreateTemp(dir, ".copying-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return "", err
	}
	var w io.WriteCloser = nopWriteCloser{tmp}
	if len(recipients) > 0 {
		if w, err = age.Encrypt(tmp, recipients...); err != nil {
			tmp.Close()
			return "", err
		}
	}
	if _, err := io.Copy(w, in); err != nil {
		tmp.Close()
		return "", err
	}
	if err := w.Close(); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	dst := filepath.Join(dir, name)
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", err
	}
	return dst, nil
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// ParseRecipients parses age recipients: X25519 (age1…) or post-quantum
// (age1pq1…), not both kinds (sealed.ParseRecipients).
func ParseRecipients(keys []string) ([]age.Recipient, error) {
	return sealed.ParseRecipients(keys)
}

// Decrypt writes the plaintext of an age-encrypted copy (src, name ending
// in .age) into dir as a 0600 temp file and returns its path; the caller
// removes it. identityFile holds age identities (AGE-SECRET-KEY-1… or
// AGE-SECRET-KEY-PQ-1… lines, as age-keygen and age-keygen -pq write them).
func Decrypt(src, identityFile, dir string) (string, error) {
	kf, err := os.Open(identityFile)
	if err != nil {
		return "", err
	}
	ids, err := age.ParseIdentities(kf)
	kf.Close()
	if err != nil {
		return "", fmt.Errorf("%s: %w", identityFile, err)
	}
	f, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer f.Close()
	r, err := sealed.Decrypter(f, ids)
	if err != nil {
		return "", fmt.Errorf("decrypting %s with %s: %w", filepath.Base(src), identityFile, err)
	}
	out, err := os.CreateTemp(dir, ".decrypted-*"+Suffix)
	if err != nil {
		return "", err
	}
	_, err = io.Copy(out, r)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out.Name())
		return "", fmt.Errorf("decrypting %s: %w", filepath.Base(src), err)
	}
	return out.Name(), nil
}
