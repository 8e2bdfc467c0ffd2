package postcheck

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/check"
)

// The etcd-backup row judges the newest local snapshot against
// backup.maxAge, and the newest verified remote copy against both the age
// limit and the newest local snapshot: a copy that failed tonight leaves
// an older one in the bucket, which the row names.
func TestEtcdBackupRowJudgesLocalAndRemote(t *testing.T) {
	now := time.Date(2026, 11, 25, 3, 30, 0, 0, time.UTC)
	dir := t.TempDir()
	snap := func(at time.Time) string {
		name := at.UTC().Format("20060102T150405Z") + ".snapshot"
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return name
	}
	tonight := now.Add(-time.Minute)
	snap(now.Add(-50 * time.Hour))
	name := snap(tonight)
	copyErr := errors.New("s3: AccessDenied")
	remoteAt := func(url string, at time.Time, err error) func(context.Context) (RemoteCopies, error) {
		return func(context.Context) (RemoteCopies, error) {
			return RemoteCopies{URL: url, Taken: at}, err
		}
	}
	cases := []struct {
		what    string
		takeErr error
		remote  func(context.Context) (RemoteCopies, error)
		want    check.Status
		reason  string
	}{
		{"no remote configured", nil, nil, check.Pass, "took " + name},
		{"the copy of tonight's", nil, remoteAt("s3://b/"+name, tonight, nil), check.Pass, "newest verified remote copy s3://b/" + name},
		{"no remote copy", copyErr, remoteAt("", time.Time{}, nil), check.Warn, "no verified remote copy (s3: AccessDenied)"},
		{"an older remote copy", copyErr, remoteAt("s3://b/old", now.Add(-50*time.Hour), nil), check.Warn, "the newest verified remote copy, s3://b/old, is 50h0m0s old (limit 26h0m0s)"},
		{"older than local, within the limit", copyErr, remoteAt("s3://b/prev", tonight.Add(-2*time.Hour), nil), check.Warn, "is older than the newest local snapshot " + name + " (by 2h0m0s)"},
		{"listing fails", nil, remoteAt("", time.Time{}, errors.New("connection refused")), check.Warn, "the remote copies cannot be listed: connection refused"},
	}
	for _, tc := range cases {
		c := &checker{o: Options{BackupDir: dir, BackupMaxAge: 26 * time.Hour, Now: func() time.Time { return now }, NewestRemote: tc.remote,
			TakeBackup: func(context.Context) (string, error) { return "took " + name, tc.takeErr }}}
		st, reason := c.etcdBackup(context.Background())
		if st != tc.want || !strings.Contains(reason, tc.reason) {
			t.Errorf("%s: got %s %q, want %s containing %q", tc.what, st, reason, tc.want, tc.reason)
		}
	}

	// Taking fails and the newest is older than the limit: the cluster has
	// no recent way back.
	if err := os.Remove(filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
	c := &checker{o: Options{BackupDir: dir, BackupMaxAge: 26 * time.Hour, Now: func() time.Time { return now },
		TakeBackup: func(context.Context) (string, error) { return "", errors.New("cp-1: etcd snapshot failed") }}}
	if st, reason := c.etcdBackup(context.Background()); st != check.Fail || !strings.Contains(reason, "is 50h0m0s old (limit 26h0m0s)") {
		t.Errorf("stale: %s %q", st, reason)
	}
}
