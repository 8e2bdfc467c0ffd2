// Package notifysink runs the lab's notification receivers on loopback,
// what postcheck.notify's URLs reach in tests: an ntfy-compatible publish
// endpoint, a generic webhook and an SMTP sink. Each records what it was
// sent; each can refuse (SetDown) to show that a notification that cannot
// be sent is only a warning.
package notifysink

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// Message is one notification a receiver took.
type Message struct {
	// Via is "ntfy", "webhook" or "smtp".
	Via   string
	Topic string
	Title string
	Body  string
	// Auth is the credential the sender presented (ntfy: the token; smtp:
	// user:password), for tests that prove the URL's secret reached the
	// service.
	Auth string
	At   time.Time
}

// Sink is the running receivers.
type Sink struct {
	// HTTP is http://127.0.0.1:<port>: ntfy topics at /<topic>, the
	// webhook at /hook.
	HTTP string
	// SMTP is 127.0.0.1:<port>.
	SMTP string
	// Token is the ntfy access token publishing needs, User and Password
	// the SMTP login.
	Token, User, Password string

	mu   sync.Mutex
	msgs []Message
	down bool

	httpSrv *http.Server
	smtpSrv *smtp.Server
}

func token(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Start listens on loopback and serves until Stop.
func Start() (*Sink, error) {
	s := &Sink{Token: "tk_" + token(14), User: "bootstrap", Password: token(10)}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	sl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		hl.Close()
		return nil, err
	}
	s.HTTP, s.SMTP = "http://"+hl.Addr().String(), sl.Addr().String()
	s.httpSrv = &http.Server{Handler: http.HandlerFunc(s.serveHTTP), ReadHeaderTimeout: 10 * time.Second}
	s.smtpSrv = smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) { return &session{sink: s}, nil }))
	s.smtpSrv.Domain = "localhost"
	// Plain authentication over a loopback connection without TLS: the
	// lab has no certificate for it, and Go's SMTP client allows PLAIN to
	// localhost in the clear (net/smtp PlainAuth).
	s.smtpSrv.AllowInsecureAuth = true
	s.smtpSrv.ReadTimeout, s.smtpSrv.WriteTimeout = 10*time.Second, 10*time.Second
	go func() { _ = s.httpSrv.Serve(hl) }()
	go func() { _ = s.smtpSrv.Serve(sl) }()
	return s, nil
}

// Stop closes both listeners.
func (s *Sink) Stop() {
	_ = s.httpSrv.Close()
	_ = s.smtpSrv.Close()
}

// SetDown makes every receiver refuse (HTTP 503, SMTP 451) while down.
func (s *Sink) SetDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

// Messages returns what was received so far, oldest first.
func (s *Sink) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.msgs...)
}

func (s *Sink) record(m Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return errDown
	}
	m.At = time.Now()
	s.msgs = append(s.msgs, m)
	return nil
}

var errDown = errors.New("the receiver is down (lab)")

func (s *Sink) serveHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil || r.Method != http.MethodPost && r.Method != http.MethodPut {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if r.URL.Path == "/hook" {
		m := Message{Via: "webhook", Body: string(body)}
		// shoutrrr's generic service with template=json sends
		// {"title": …, "message": …}.
		var js struct{ Title, Message string }
		if json.Unmarshal(body, &js) == nil && js.Message != "" {
			m.Title, m.Body = js.Title, js.Message
		}
		if err := s.record(m); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	s.publish(w, r, body)
}

// publish is ntfy's publish endpoint (POST/PUT /<topic>) as ntfy v2.13.0
// serves it (server/server.go handlePublish, parsePublishParams,
// authenticate): the body is the message, the title comes from the
// X-Title, Title or t header; a protected topic takes Basic credentials
// whose empty user name makes the password a token, or a Bearer token,
// else answers 401 with {"code":40101,"http":401,"error":"unauthorized"}
// (server/errors.go errHTTPUnauthorized); success answers the message as
// JSON (server/types.go message). Only what shoutrrr's ntfy service sends
// is read; attachments, actions, delays, caching, Firebase and the
// subscribe side are not served.
func (s *Sink) publish(w http.ResponseWriter, r *http.Request, body []byte) {
	topic := strings.Trim(r.URL.Path, "/")
	if topic == "" || strings.Contains(topic, "/") {
		http.NotFound(w, r)
		return
	}
	tok := ""
	switch h := r.Header.Get("Authorization"); {
	case strings.HasPrefix(h, "Bearer "):
		tok = strings.TrimSpace(strings.TrimPrefix(h, "Bearer"))
	case h != "":
		if u, p, ok := r.BasicAuth(); ok && u == "" {
			tok = p
		}
	}
	w.Header().Set("Content-Type", "application/json")
	if tok != s.Token {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"code":40101,"http":401,"error":"unauthorized","link":"https://ntfy.sh/docs/publish/#authentication"}`+"\n")
		return
	}
	title := r.Header.Get("X-Title")
	for _, k := range []string{"Title", "t"} {
		if title == "" {
			title = r.Header.Get(k)
		}
	}
	if err := s.record(Message{Via: "ntfy", Topic: topic, Title: title, Body: string(body), Auth: tok}); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, `{"code":50301,"http":503,"error":%q}`+"\n", err.Error())
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"id": token(6), "time": time.Now().Unix(), "event": "message", "topic": topic, "title": title, "message": string(body)})
}

// session is one SMTP conversation: PLAIN login with User and Password,
// then the message.
type session struct {
	sink *Sink
	auth string
	to   []string
}

var _ smtp.AuthSession = (*session)(nil)

func (c *session) AuthMechanisms() []string { return []string{sasl.Plain} }

func (c *session) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, pass string) error {
		if user != c.sink.User || pass != c.sink.Password {
			return errors.New("invalid credentials")
		}
		c.auth = user + ":" + pass
		return nil
	}), nil
}

func (c *session) Mail(string, *smtp.MailOptions) error {
	if c.auth == "" {
		return smtp.ErrAuthRequired
	}
	return nil
}

func (c *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	c.to = append(c.to, to)
	return nil
}

func (c *session) Data(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	head, body, _ := strings.Cut(strings.ReplaceAll(string(b), "\r\n", "\n"), "\n\n")
	title := ""
	for _, l := range strings.Split(head, "\n") {
		if v, ok := strings.CutPrefix(l, "Subject: "); ok {
			title = v
		}
	}
	if err := c.sink.record(Message{Via: "smtp", Topic: strings.Join(c.to, ","), Title: title, Body: body, Auth: c.auth}); err != nil {
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: err.Error()}
	}
	return nil
}

func (c *session) Reset()        { c.to = nil }
func (c *session) Logout() error { return nil }
