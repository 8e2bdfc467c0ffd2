package notify

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// gotifyEnhanced reports whether raw is a gotify:// URL holding one of
// Gotify 3's application tokens ("gtfy<ident>.<key>", gotify/server v3.0.0
// auth/token.go EnhancedToken), which shoutrrr does not send: its Gotify
// service takes only the 15-character "A…" tokens of Gotify 2
// (shoutrrr v0.14.3 and v0.15.1 pkg/services/push/gotify
// gotify_validation.go ValidateToken), so every send would fail.
func gotifyEnhanced(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "gotify" {
		return false
	}
	return strings.HasPrefix(gotifyToken(u), "gtfy")
}

// gotifyToken is the URL's last path segment, where shoutrrr's gotify://
// form keeps the token (gotify://host[:port][/subpath]/token).
func gotifyToken(u *url.URL) string {
	p := strings.TrimSuffix(u.Path, "/")
	return p[strings.LastIndex(p, "/")+1:]
}

// gotifyEndpoint is where a message goes and how, from shoutrrr's URL form:
// https unless disabletls=yes, the subpath before the token, the
// priority query option (0 by default, -2 to 10).
func gotifyEndpoint(raw string) (endpoint, token string, priority int, insecure bool, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", 0, false, err
	}
	q := u.Query()
	yes := func(k string) bool {
		switch strings.ToLower(q.Get(k)) {
		case "yes", "true", "1":
			return true
		}
		return false
	}
	scheme := "https"
	if yes("disabletls") {
		scheme = "http"
	}
	if p := q.Get("priority"); p != "" {
		if priority, err = strconv.Atoi(p); err != nil || priority < -2 || priority > 10 {
			return "", "", 0, false, fmt.Errorf("priority %q is not a number from -2 to 10", p)
		}
	}
	token = gotifyToken(u)
	sub := strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), token)
	endpoint = (&url.URL{Scheme: scheme, Host: u.Host, Path: strings.TrimSuffix(sub, "/") + "/message"}).String()
	return endpoint, token, priority, yes("insecureskipverify"), nil
}

// sendGotify posts a message as Gotify's REST API takes it (POST
// /message, the application token in X-Gotify-Key, a JSON title, message
// and priority), which Gotify 3 reads for its enhanced tokens as for the
// legacy ones (gotify/server v3.0.0 auth/authentication.go
// readTokenFromRequest, handleApplication: a token in its private form is
// parsed and looked up by its public form).
func sendGotify(ctx context.Context, raw, title, message string) error {
	endpoint, token, priority, insecure, err := gotifyEndpoint(raw)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(map[string]any{"title": title, "message": message, "priority": priority})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Gotify-Key", token)
	client := &http.Client{Timeout: Timeout}
	if insecure {
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // the user's insecureskipverify=yes, as shoutrrr takes it
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("gotify answered %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}
