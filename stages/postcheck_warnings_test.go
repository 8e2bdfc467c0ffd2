package stages

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/backup"
	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/postcheck"
	"github.com/homelab/bootstrap/ui"
)

// A warning logged while a check runs is that check's row in report.json
// (WARN, with the text, masked); one no check owns is the run-warnings
// row; a check that logged nothing stays PASS.
func TestPostcheckWarningsAreRows(t *testing.T) {
	secrets := &redact.Set{}
	secrets.Add("s3cr3t-key")
	warnings := &ui.Warnings{}
	log, err := ui.NewLogger(ui.Options{Format: ui.FormatJSON, Out: io.Discard, Redact: secrets, Warnings: warnings})
	if err != nil {
		t.Fatal(err)
	}
	run := &Env{Log: log, UI: ui.NewReporter(log), Secrets: secrets, Warnings: warnings, Now: time.Now}
	env := run.forStage(Postcheck, log.With().Str("stage", Postcheck).Logger())
	// Another stage's warning at the same time is not the postcheck's.
	other := run.forStage(Flux, log.With().Str("stage", Flux).Logger())
	checks := []check.Check{
		{Name: postcheck.CheckEtcdBackup, Run: func(ctx context.Context) (check.Status, string) {
			env.inCheck(ctx).Log.Warn().Str("copy", "s3://b/20990101T000000Z.snapshot").Msg("a copy in the bucket is named after now, signed with s3cr3t-key")
			return check.Passf("took one")
		}},
		{Name: postcheck.CheckNodesReady, Run: func(ctx context.Context) (check.Status, string) {
			env.Log.Warn().Msg("the kubeconfig is read from a plaintext file")
			other.Log.Warn().Msg("not ours")
			return check.Passf("3 of 3 Ready")
		}},
		{Name: postcheck.CheckCerts, Run: func(context.Context) (check.Status, string) { return check.Passf("fine") }},
	}
	results := runPostchecks(context.Background(), env, checks)
	js, err := postcheck.NewReport("lab", time.Now(), time.Second, results).JSON()
	if err != nil {
		t.Fatal(err)
	}
	var report postcheck.Report
	if err := json.Unmarshal(js, &report); err != nil {
		t.Fatal(err)
	}
	rows := map[string]postcheck.CheckReport{}
	for _, r := range report.Checks {
		rows[r.Name] = r
	}
	if r := rows[postcheck.CheckEtcdBackup]; r.Status != check.Warn || !strings.Contains(r.Reason, "took one; warned: a copy in the bucket is named after now") || !strings.Contains(r.Reason, "copy=s3://b/20990101T000000Z.snapshot") {
		t.Errorf("etcd-backup row: %+v", r)
	}
	if r := rows[postcheck.CheckRunWarnings]; r.Status != check.Warn || !strings.Contains(r.Reason, "the kubeconfig is read from a plaintext file") || strings.Contains(r.Reason, "not ours") || r.Next == "" {
		t.Errorf("run-warnings row: %+v", r)
	}
	if r := rows[postcheck.CheckNodesReady]; r.Status != check.Pass {
		t.Errorf("a warning logged without the check's name is not the row's: %+v", r)
	}
	if r := rows[postcheck.CheckCerts]; r.Status != check.Pass || r.Reason != "fine" {
		t.Errorf("certs row: %+v", r)
	}
	if report.Overall != check.Warn {
		t.Errorf("overall %s", report.Overall)
	}
	if strings.Contains(string(js), "s3cr3t-key") {
		t.Errorf("a secret reached report.json:\n%s", js)
	}
}

// A copy named after now is warned about once a run, though pruning and
// the postcheck's look for the newest both see it: the row quotes it once
// and the console says it once.
func TestFutureCopyWarnedOnceARun(t *testing.T) {
	warnings := &ui.Warnings{}
	log, err := ui.NewLogger(ui.Options{Format: ui.FormatJSON, Out: io.Discard, Warnings: warnings})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 25, 3, 30, 0, 0, time.UTC)
	run := &Env{Log: log, UI: ui.NewReporter(log), Warnings: warnings, Now: func() time.Time { return now }}
	env := run.forStage(Postcheck, log.With().Str("stage", Postcheck).Logger())
	s3, err := backup.NewS3(backup.S3Options{Endpoint: "http://127.0.0.1:9", Bucket: "b", Prefix: "lab/etcd/", AccessKey: "a", SecretKey: "s", PathStyle: true})
	if err != nil {
		t.Fatal(err)
	}
	ahead := []backup.Remote{{Key: "lab/etcd/20990101T000000Z.snapshot", Taken: time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)}}
	WarnFutureCopies(env, s3, ahead)
	WarnFutureCopies(env.forStage(Postcheck, env.Log), s3, ahead)
	if got := warnings.Since(0); len(got) != 1 || !strings.Contains(got[0].Text, "20990101T000000Z.snapshot") {
		t.Errorf("warned %+v, want once", got)
	}
}
