package notify_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/lab/notifysink"
	"github.com/homelab/bootstrap/notify"
)

// sinkURLs are shoutrrr URLs for the lab's receivers: ntfy with a token,
// a generic JSON webhook, and email with a PLAIN login.
func sinkURLs(s *notifysink.Sink) []string {
	host := strings.TrimPrefix(s.HTTP, "http://")
	return []string{
		fmt.Sprintf("ntfy://:%s@%s/homelab-nightly?scheme=http", s.Token, host),
		fmt.Sprintf("generic+http://%s/hook?template=json", host),
		fmt.Sprintf("smtp://%s:%s@%s/?from=bootstrap@lab.local&to=admin@lab.local&auth=Plain&encryption=None&usestarttls=No", s.User, s.Password, s.SMTP),
	}
}

// Through shoutrrr, each of the lab's receivers on 127.0.0.1 takes the
// title and the message, with the URL's credential; a receiver that
// refuses is an error that names the URL by position and service and
// quotes none of its secrets.
func TestSendReachesRealReceivers(t *testing.T) {
	s, err := notifysink.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	urls := sinkURLs(s)
	if err := notify.Check(urls); err != nil {
		t.Fatal(err)
	}
	for _, r := range notify.Send(urls, "postcheck of lab FAILED", "nodes-ready: NotReady: wk-1\nArchive: /x/postcheck.tar.gz") {
		if r.Err != nil {
			t.Errorf("%s: %v", r.Label, r.Err)
		}
	}
	got := map[string]notifysink.Message{}
	for _, m := range s.Messages() {
		got[m.Via] = m
	}
	for _, via := range []string{"ntfy", "webhook", "smtp"} {
		m, ok := got[via]
		if !ok || !strings.Contains(m.Title, "postcheck of lab FAILED") || !strings.Contains(m.Body, "NotReady: wk-1") || !strings.Contains(m.Body, "/x/postcheck.tar.gz") {
			t.Errorf("%s received %+v", via, m)
		}
	}
	if got["ntfy"].Topic != "homelab-nightly" || got["ntfy"].Auth != s.Token || got["smtp"].Auth != s.User+":"+s.Password || got["smtp"].Topic != "admin@lab.local" {
		t.Errorf("credentials or recipients lost on the way: ntfy %+v smtp %+v", got["ntfy"], got["smtp"])
	}

	// Refused: an error per URL, no secret in it.
	s.SetDown(true)
	bad := strings.Replace(urls[0], s.Token, "tk_wrongwrongwrong", 1)
	res := notify.Send(append(urls, bad), "t", "m")
	for i, r := range res {
		if r.Err == nil {
			t.Errorf("%s: no error from a refusing receiver", r.Label)
			continue
		}
		for _, secret := range []string{s.Token, s.Password, "tk_wrongwrongwrong", urls[0]} {
			if strings.Contains(r.Err.Error(), secret) {
				t.Errorf("%s: the error quotes a secret: %v", r.Label, r.Err)
			}
		}
		if want := fmt.Sprintf("notification %d (", i+1); r.Label[:len(want)] != want {
			t.Errorf("label %q", r.Label)
		}
	}
	if len(s.Messages()) != 3 {
		t.Errorf("%d messages after the refusals", len(s.Messages()))
	}
}

// Every part of a URL that may hold a token is listed for masking; a URL
// of an unknown service is refused naming it by position only.
func TestSecretsAndCheck(t *testing.T) {
	sec := notify.Secrets("gotify://push.example.com/Aabcdefgh12345?priority=5&title=x")
	for _, want := range []string{"Aabcdefgh12345", "push.example.com", "gotify://push.example.com/Aabcdefgh12345?priority=5&title=x"} {
		if !strings.Contains(strings.Join(sec, "\n"), want) {
			t.Errorf("secrets %q lack %q", sec, want)
		}
	}
	err := notify.Check([]string{"ntfy://ntfy.sh/topic", "pager://tok3nsecret@x"})
	if err == nil || !strings.Contains(err.Error(), "notification 2 (pager)") || strings.Contains(err.Error(), "tok3nsecret") {
		t.Errorf("check: %v", err)
	}
	if got := notify.Parse("# comment\nntfy://a/b\n\n generic://c/d  discord://e@f\n"); len(got) != 3 {
		t.Errorf("parse: %q", got)
	}
}
