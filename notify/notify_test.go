package notify_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
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

// Exactly the parts of a URL that hold a service's credential are masked;
// hosts, ports, topics, rooms and options stay readable. A URL of an
// unknown service is refused naming it by position only.
func TestSecretsAndCheck(t *testing.T) {
	for in, want := range map[string]string{
		"ntfy://:tk_abcdefghijklmnopqrstuvwxyz012@10.0.20.2:8418/topic?scheme=http": "ntfy://:[REDACTED]@10.0.20.2:8418/topic?scheme=http",
		"ntfy://10.0.20.2:8418/topic":                                                            "ntfy://10.0.20.2:8418/topic",
		"gotify://push.example.com/Aabcdefgh12345?priority=5&title=x":                            "gotify://push.example.com/[REDACTED]?priority=5&title=x",
		"discord://webhooktokenvalue@123456789012345678":                                         "discord://[REDACTED]@123456789012345678",
		"slack://bot@T0123ABCD/B0456EFGH/XXXXXXXXXXXXXXXXXXXXXXXX":                               "slack://bot@[REDACTED]/[REDACTED]/[REDACTED]",
		"smtp://bootstrap:mailpassword@mail.lan:587/?from=b@lab.local&to=a@lab.local&auth=Plain": "smtp://bootstrap:[REDACTED]@mail.lan:587/?from=b@lab.local&to=a@lab.local&auth=Plain",
		"matrix://bot:matrixpassword@matrix.lan/?rooms=!room:lan":                                "matrix://bot:[REDACTED]@matrix.lan/?rooms=!room:lan",
		"telegram://123456789:AAbbccddeeffgg@telegram?chats=@homelab":                            "telegram://123456789:[REDACTED]@telegram?chats=@homelab",
		"googlechat://chat.googleapis.com/v1/spaces/FOO/messages?key=keyvalue&token=tokvalue":    "googlechat://chat.googleapis.com/v1/spaces/FOO/messages?key=[REDACTED]&token=[REDACTED]",
		"generic+https://hooks.lan/api/webhook/Zq9rTp2LmX8vKw4NbC7d?template=json":               "generic+https://hooks.lan/api/webhook/[REDACTED]?template=json",
	} {
		if got := notify.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
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

// A Matrix homeserver that takes the login and then drops the connection:
// the send fails after shoutrrr holds the bot's access token, and the
// error must not quote it. shoutrrr v0.13.2 put the token in every API
// URL's query (matrix_api.go, access_token=) and Go's *url.Error quotes
// the whole URL; v0.14.3 sends it as an Authorization header
// (matrix_client.go setAuthorizationHeader). The server answers the r0
// paths of the old release and the v3 paths of the new one alike
// (matrix_api.go apiLogin, apiRoomJoin).
func TestMatrixSendFailureQuotesNoToken(t *testing.T) {
	const token = "MatrixSessionToken0x5eedABCDEFGHIJ"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/login") && r.Method == http.MethodGet:
			fmt.Fprint(w, `{"flows":[{"type":"m.login.password"}]}`)
		case strings.HasSuffix(r.URL.Path, "/login"):
			fmt.Fprintf(w, `{"access_token":%q,"home_server":"lab","user_id":"@bot:lab","device_id":"D1"}`, token)
		default:
			// Joining the room: the connection drops (a restarting
			// homeserver, a proxy timing out).
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	raw := "matrix://bot:botpassword0x5eed@" + host + "/?rooms=!room:lab&disableTLS=yes"
	res := notify.Send([]string{raw}, "t", "m")
	if res[0].Err == nil {
		t.Fatal("no error from a homeserver that drops the connection")
	}
	for _, secret := range []string{token, "botpassword0x5eed"} {
		if strings.Contains(res[0].Err.Error(), secret) {
			t.Errorf("the error quotes a secret: %v", res[0].Err)
		}
	}
	if !strings.Contains(res[0].Err.Error(), "join") {
		t.Errorf("the failure is not the room join after the login: %v", res[0].Err)
	}
}
