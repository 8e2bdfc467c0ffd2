package proxmox

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// ticketAuth keeps a login ticket fresh. PVE tickets are valid for two
// hours ($ticket_lifetime in pve-access-control src/PVE/AccessControl.pm at
// 9.1.1); a run longer than that (a slow ISO download, a long wait) would
// start failing with 401. The transport puts the current ticket on every
// request, logging in again once it is renewAfter old, so no request ever
// carries an expired one and Telmate's own session is never written to
// concurrently.
type ticketAuth struct {
	user, password string
	loginURL       string
	base           http.RoundTripper
	renewAfter     time.Duration

	mu     sync.Mutex
	ticket string
	csrf   string
	issued time.Time
}

// current returns a ticket younger than renewAfter, logging in when needed.
func (a *ticketAuth) current(ctx context.Context) (ticket, csrf string, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ticket != "" && time.Since(a.issued) < a.renewAfter {
		return a.ticket, a.csrf, nil
	}
	form := url.Values{"username": {a.user}, "password": {a.password}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.loginURL, strings.NewReader(form.Encode()))
	if err != nil {
		return "", "", err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := a.base.RoundTrip(req)
	if err != nil {
		return "", "", fmt.Errorf("logging in as %s: %w", a.user, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", "", &APIError{Method: http.MethodPost, Path: "/access/ticket", Status: resp.StatusCode, Message: strings.TrimSpace(strings.TrimPrefix(resp.Status, fmt.Sprint(resp.StatusCode)))}
	}
	var out struct {
		Data struct {
			Ticket string `json:"ticket"`
			CSRF   string `json:"CSRFPreventionToken"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &out); err != nil || out.Data.Ticket == "" {
		return "", "", fmt.Errorf("logging in as %s: unreadable answer", a.user)
	}
	a.ticket, a.csrf, a.issued = out.Data.Ticket, out.Data.CSRF, time.Now()
	return a.ticket, a.csrf, nil
}

// authorize puts the current ticket on req (a clone), for every call but
// the login itself.
func (a *ticketAuth) authorize(req *http.Request) (*http.Request, error) {
	if a == nil || strings.HasSuffix(req.URL.Path, "/access/ticket") {
		return req, nil
	}
	ticket, csrf, err := a.current(req.Context())
	if err != nil {
		return nil, err
	}
	req = req.Clone(req.Context())
	req.Header.Set("Cookie", "PVEAuthCookie="+ticket)
	if req.Method != http.MethodGet {
		req.Header.Set("CSRFPreventionToken", csrf)
	}
	return req, nil
}
