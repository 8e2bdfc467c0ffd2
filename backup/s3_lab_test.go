package backup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/minio/minio-go/v7"

	"github.com/homelab/bootstrap/backup/backuptest"
	"github.com/homelab/bootstrap/lab/s3server"
	"github.com/homelab/bootstrap/lab/s3server/s3test"
)

func bucket(t *testing.T, srv *s3server.Server, name, secret string) *S3 {
	t.Helper()
	return bucketAt(t, srv, name, "lab/etcd/", secret, nil)
}

// bucketAt is bucket under prefix, with the clock now (time.Now when nil).
func bucketAt(t *testing.T, srv *s3server.Server, name, prefix, secret string, now func() time.Time) *S3 {
	t.Helper()
	s, err := NewS3(S3Options{Endpoint: srv.Endpoint, Bucket: name, Prefix: prefix, Region: srv.Region, PathStyle: true,
		AccessKey: srv.AccessKey, SecretKey: secret, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// keptSnapshot writes a verified snapshot taken at t into dir.
func keptSnapshot(t *testing.T, dir string, at time.Time) string {
	t.Helper()
	p := filepath.Join(dir, at.UTC().Format(timeLayout)+Suffix)
	if err := os.WriteFile(p, backuptest.Snapshot(t, 5), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestS3CopiesAgainstARealServer: an encrypted copy is uploaded, read back
// and compared before it counts, listed newest first, pruned to keep and
// downloaded to the same bytes, which the age identity opens into the
// verified snapshot.
func TestS3CopiesAgainstARealServer(t *testing.T) {
	srv := s3test.Start(t, "backups")
	s := bucket(t, srv, "backups", srv.SecretKey)
	ctx := context.Background()
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	dir, copies := t.TempDir(), t.TempDir()
	base := time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC)
	var last Remote
	for i := range 3 {
		snap := keptSnapshot(t, dir, base.Add(time.Duration(i)*time.Hour))
		enc, err := Copy(snap, copies, []age.Recipient{id.Recipient()})
		if err != nil {
			t.Fatal(err)
		}
		if last, err = s.Upload(ctx, enc, filepath.Base(enc)); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.HasSuffix(last.Key, Suffix+AgeSuffix) || last.SHA256 == "" || !last.Taken.Equal(base.Add(2*time.Hour)) {
		t.Errorf("upload: %+v", last)
	}
	removed, _, err := s.Prune(ctx, 2, SnapshotSuffixes...)
	if err != nil || len(removed) != 1 || !strings.Contains(removed[0], "20261127T030000Z") {
		t.Fatalf("prune removed %v (%v), want the oldest", removed, err)
	}
	newest, ok, _, err := s.Newest(ctx, SnapshotSuffixes...)
	if err != nil || !ok || newest.Key != last.Key || newest.SHA256 != last.SHA256 {
		t.Fatalf("newest %+v %v %v, want %+v", newest, ok, err, last)
	}
	got, err := s.Download(ctx, newest.Key, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(t.TempDir(), "key.txt")
	if err := os.WriteFile(keyFile, []byte(id.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	plain, err := Decrypt(got, keyFile, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := VerifyDecrypted(plain, got); err != nil {
		t.Fatalf("the downloaded copy does not open into a verified snapshot: %v", err)
	}
}

// TestS3Refusals: a wrong key, a missing bucket and an upload cut short
// each fail with what to do, and leave no object behind.
func TestS3Refusals(t *testing.T) {
	srv := s3test.Start(t, "backups")
	ctx := context.Background()
	snap := keptSnapshot(t, t.TempDir(), time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC))

	_, err := bucket(t, srv, "backups", "wrong-secret").Upload(ctx, snap, filepath.Base(snap))
	if err == nil || !strings.Contains(err.Error(), "refused the credentials") || !strings.Contains(err.Error(), "SignatureDoesNotMatch") {
		t.Errorf("wrong secret: %v", err)
	}
	if err := bucket(t, srv, "backups", "wrong-secret").Check(ctx); err == nil {
		t.Error("the check passed with a wrong secret")
	}
	missing := bucket(t, srv, "nobucket", srv.SecretKey)
	if _, err := missing.Upload(ctx, snap, filepath.Base(snap)); err == nil || !strings.Contains(err.Error(), "bucket nobucket does not exist") {
		t.Errorf("missing bucket: %v", err)
	}
	if err := missing.Check(ctx); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("check of a missing bucket: %v", err)
	}

	s := bucket(t, srv, "backups", srv.SecretKey)
	data, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	// The connection drops halfway through the body.
	cut := io.MultiReader(strings.NewReader(string(data[:len(data)/2])), errReader{errors.New("connection reset")})
	_, err = s.put(ctx, cut, int64(len(data)), hex.EncodeToString(sum[:]), filepath.Base(snap))
	if err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("an upload cut short: %v", err)
	}
	if all, _, err := s.List(ctx, SnapshotSuffixes...); err != nil || len(all) != 0 {
		t.Errorf("an upload cut short left %v (%v)", all, err)
	}
	for u := range s.c.ListIncompleteUploads(ctx, s.bucket, s.prefix, true) {
		if u.Err == nil {
			t.Errorf("an upload cut short left the multipart upload %s", u.Key)
		}
	}
	// The listing of incomplete uploads sees one that was left open
	// (else the checks of it below could not fail).
	core := minio.Core{Client: s.c}
	open, err := core.NewMultipartUpload(ctx, s.bucket, s.prefix+"open", minio.PutObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	seen := false
	for u := range s.c.ListIncompleteUploads(ctx, s.bucket, s.prefix, true) {
		seen = seen || u.UploadID == open
	}
	if err := core.AbortMultipartUpload(ctx, s.bucket, s.prefix+"open", open); err != nil || !seen {
		t.Fatalf("an open multipart upload is not listed (%v, abort: %v)", seen, err)
	}
	// The same for an upload in parts (a snapshot larger than a part):
	// two 5 MiB parts go up, the third never comes.
	big := make([]byte, 12<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	bigSum := sha256.Sum256(big)
	s.partSize = 5 << 20
	cut = io.MultiReader(strings.NewReader(string(big[:11<<20])), errReader{errors.New("connection reset")})
	_, err = s.put(ctx, cut, int64(len(big)), hex.EncodeToString(bigSum[:]), "20261127T040000Z"+Suffix)
	if err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("a multipart upload cut short: %v", err)
	}
	s.partSize = 0
	if all, _, err := s.List(ctx, SnapshotSuffixes...); err != nil || len(all) != 0 {
		t.Errorf("a multipart upload cut short left %v (%v)", all, err)
	}
	for u := range s.c.ListIncompleteUploads(ctx, s.bucket, s.prefix, true) {
		if u.Err == nil {
			t.Errorf("a multipart upload cut short left its parts under %s", u.Key)
		}
	}
	// The next backup's upload goes through.
	if _, err := s.Upload(ctx, snap, filepath.Base(snap)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.StatObject(ctx, s.bucket, s.prefix+filepath.Base(snap), minio.StatObjectOptions{}); err != nil {
		t.Fatal(err)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// TestS3RetentionTrustsOnlyItsOwnCopies: under a prefix without a trailing
// / the copies are listed, kept and pruned all the same (their names read
// relative to the prefix); a copy named after now (a clock that was wrong
// when it was written) neither counts toward keep nor is pruned nor is the
// newest, and is reported; an object this tool did not upload (no digest
// recorded) is never pruned; the older of its own are removed oldest first.
func TestS3RetentionTrustsOnlyItsOwnCopies(t *testing.T) {
	srv := s3test.Start(t, "backups")
	ctx := context.Background()
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	s := bucketAt(t, srv, "backups", "homelab/etcd", srv.SecretKey, func() time.Time { return now })
	dir := t.TempDir()
	var ours []string
	for i := range 3 {
		snap := keptSnapshot(t, dir, now.Add(time.Duration(i-3)*time.Hour))
		r, err := s.Upload(ctx, snap, filepath.Base(snap))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(r.Key, "homelab/etcd2026") {
			t.Fatalf("uploaded as %s", r.Key)
		}
		ours = append(ours, r.Key)
	}
	// Written on a day the clock ran 11h37m ahead, by this tool; and an
	// object someone else put there, older than all.
	future := keptSnapshot(t, dir, now.Add(11*time.Hour+37*time.Minute))
	if _, err := s.Upload(ctx, future, filepath.Base(future)); err != nil {
		t.Fatal(err)
	}
	foreign := "homelab/etcd" + now.Add(-48*time.Hour).Format(timeLayout) + Suffix
	if _, err := s.c.PutObject(ctx, s.bucket, foreign, strings.NewReader("not ours"), 8, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}

	copies, ahead, err := s.List(ctx, SnapshotSuffixes...)
	if err != nil || len(copies) != 4 || len(ahead) != 1 || !strings.Contains(ahead[0].Key, "20261128T233700Z") {
		t.Fatalf("listed %v and ahead %v (%v)", copies, ahead, err)
	}
	newest, ok, ahead, err := s.Newest(ctx, SnapshotSuffixes...)
	if err != nil || !ok || newest.Key != ours[2] || len(ahead) != 1 {
		t.Fatalf("newest %+v %v, ahead %v (%v), want %s", newest, ok, ahead, err, ours[2])
	}
	removed, ahead, err := s.Prune(ctx, 2, SnapshotSuffixes...)
	if err != nil || len(removed) != 1 || removed[0] != ours[0] || len(ahead) != 1 {
		t.Fatalf("prune to 2 removed %v, ahead %v (%v), want only %s", removed, ahead, err, ours[0])
	}
	for _, key := range []string{ours[1], ours[2], foreign, ahead[0].Key} {
		if _, err := s.c.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{}); err != nil {
			t.Errorf("%s is gone: %v", key, err)
		}
	}
	// Oldest first: pruning to none removes its own oldest first and
	// leaves the others' and the future one.
	removed, _, err = s.Prune(ctx, 0, SnapshotSuffixes...)
	if err != nil || len(removed) != 2 || removed[0] != ours[1] || removed[1] != ours[2] {
		t.Fatalf("prune to 0 removed %v (%v)", removed, err)
	}
}
