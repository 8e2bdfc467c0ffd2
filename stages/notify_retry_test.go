package stages

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/lab/notifysink"
	"github.com/homelab/bootstrap/postcheck"
)

// A failing night whose notification could not be sent is sent on the
// next run, though that run's result did not change; once it went through
// nothing is sent again until the result changes.
func TestFailedNotificationIsSentNextRun(t *testing.T) {
	sink, err := notifysink.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sink.Stop)
	url := fmt.Sprintf("ntfy://:%s@%s/homelab-nightly?scheme=http", sink.Token, strings.TrimPrefix(sink.HTTP, "http://"))
	t.Setenv("BOOTSTRAP_TEST_NOTIFY_URLS", url)
	env := prepEnv(t)
	env.Config = &config.Config{Postcheck: config.Postcheck{Notify: config.Notify{URLsEnv: "BOOTSTRAP_TEST_NOTIFY_URLS"}}}
	fail := postcheck.Report{Cluster: "lab", Overall: check.Fail, Started: time.Now(),
		Checks: []postcheck.CheckReport{{Name: "nodes-ready", Status: check.Fail, Reason: "NotReady: wk-1"}}}

	// Night 1: pass → fail is due, the receiver is down.
	sink.SetDown(true)
	sent, unsent := notifyNight(env, check.Pass, nil, fail, "", "")
	if len(unsent) != 1 || len(sent) != 0 || len(sink.Messages()) != 0 {
		t.Fatalf("night 1: unsent %q, %d received", unsent, len(sink.Messages()))
	}
	// Night 2: still failing (no change), the receiver is back: sent.
	sink.SetDown(false)
	sent, unsent = notifyNight(env, check.Fail, unsent, fail, "", "")
	if len(unsent) != 0 || len(sent) != 1 || len(sink.Messages()) != 1 || !strings.Contains(sink.Messages()[0].Title, "FAILED") {
		t.Fatalf("night 2: unsent %q, received %+v", unsent, sink.Messages())
	}
	// Night 3: unchanged and nothing pending: nothing sent.
	if sent, unsent = notifyNight(env, check.Fail, unsent, fail, "", ""); len(unsent) != 0 || len(sent) != 0 || len(sink.Messages()) != 1 {
		t.Fatalf("night 3: unsent %q, %d received", unsent, len(sink.Messages()))
	}
}
