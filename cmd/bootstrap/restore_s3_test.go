package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"

	"github.com/homelab/bootstrap/backup"
	"github.com/homelab/bootstrap/backup/backuptest"
	"github.com/homelab/bootstrap/lab/s3server/s3test"
)

// TestRestoreFromS3NamesTheURL: a copy fetched from s3:// that the given
// identity does not open fails before anything is touched, naming the
// s3:// URL the user gave, not the download (deleted by then).
func TestRestoreFromS3NamesTheURL(t *testing.T) {
	srv := s3test.Start(t, "backups")
	h := newHarness(t)
	creds := filepath.Join(h.dir, "s3-credentials")
	if err := os.WriteFile(creds, []byte("[default]\naws_access_key_id = "+srv.AccessKey+"\naws_secret_access_key = "+srv.SecretKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(cfg), `    endpoint: ""                # https://nas.lan:9000; empty: no S3 copies
    bucket: ""`, "    endpoint: "+srv.Endpoint+"\n    bucket: backups", 1)
	edited = strings.Replace(edited, `    pathStyle: false`, `    pathStyle: true`, 1)
	edited = strings.Replace(edited, `    credentialsFile: ""`, `    credentialsFile: s3-credentials`, 1)
	if edited == string(cfg) {
		t.Fatal("the example config's backup.s3 section changed: edit the test")
	}
	if err := os.WriteFile(h.cfg, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}

	// A copy encrypted to someone else's key, uploaded as bootstrap would.
	theirs, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	snap := filepath.Join(dir, time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC).Format("20060102T150405Z")+backup.Suffix)
	if err := os.WriteFile(snap, backuptest.Snapshot(t, 3), 0o600); err != nil {
		t.Fatal(err)
	}
	enc, err := backup.Copy(snap, dir, []age.Recipient{theirs.Recipient()})
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := backup.NewS3(backup.S3Options{Endpoint: srv.Endpoint, Bucket: "backups", Prefix: "homelab/etcd/", Region: srv.Region, PathStyle: true, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	r, err := bucket.Upload(context.Background(), enc, filepath.Base(enc))
	if err != nil {
		t.Fatal(err)
	}
	mine, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	idFile := filepath.Join(h.dir, "mine.agekey")
	if err := os.WriteFile(idFile, []byte(mine.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	url := bucket.URL(r.Key)
	code := h.run(context.Background(), "restore", "--from", url, "--age-identity", idFile)
	out := h.stdout.String() + h.stderr.String()
	if code != 2 || !strings.Contains(out, "--from "+url+": ") || strings.Contains(out, ".download-") {
		t.Fatalf("restore with the wrong identity: exit %d\n%s", code, out)
	}

	// Temporary credentials from the environment (they win over the
	// file, as in the AWS SDK): the session token is signed and sent.
	// The lab's server (versitygw v1.8.0) runs without its IAM API, so
	// it refuses any session token with a root key (auth/
	// signing_key_provider.go ResolveDerivedKey): the refusal proves the
	// token reached it; dropped, the request would pass.
	h.env = map[string]string{"AWS_ACCESS_KEY_ID": srv.AccessKey, "AWS_SECRET_ACCESS_KEY": srv.SecretKey, "AWS_SESSION_TOKEN": "lab-session-token"}
	code = h.run(context.Background(), "restore", "--from", url, "--age-identity", idFile)
	out = h.stdout.String() + h.stderr.String()
	if code != 2 || !strings.Contains(out, "InvalidToken") || !strings.Contains(out, "$AWS_SESSION_TOKEN") || strings.Contains(out, "decrypting") || strings.Contains(out, srv.SecretKey) || strings.Contains(out, "lab-session-token") {
		t.Fatalf("restore with a session token the server does not know: exit %d\n%s", code, out)
	}
}
