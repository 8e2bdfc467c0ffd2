// Package notify tells people about the nightly postcheck through
// shoutrrr (github.com/nicholas-fedor/shoutrrr, the maintained fork of
// containrrr/shoutrrr): one URL per service, in shoutrrr's URL forms
// (ntfy://, gotify://, discord://, slack://, telegram://, matrix://,
// smtp://, generic+https:// and the others it knows). The URLs carry the
// services' credentials: every error this package returns names a URL by
// its position and service only, Secrets lists exactly the parts to mask
// and Redact shows a URL with them masked.
package notify

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/homelab/bootstrap/internal/redact"
	"github.com/nicholas-fedor/shoutrrr/pkg/router"
	"github.com/nicholas-fedor/shoutrrr/pkg/types"
)

// Timeout bounds one service's send (shoutrrr's router default).
const Timeout = router.DefaultTimeout

// Parse reads notification URLs: one per line or separated by spaces, #
// starting a comment line, blank lines ignored.
func Parse(text string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, strings.Fields(line)...)
	}
	return out
}

// Label names the i-th URL (from 0) without its credentials:
// "notification 2 (ntfy)".
func Label(i int, raw string) string {
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok || scheme == "" || strings.ContainsAny(scheme, "/@:") {
		scheme = "unparsable"
	}
	return fmt.Sprintf("notification %d (%s)", i+1, strings.ToLower(scheme))
}

// Secrets returns the credentials a notification URL holds, for a
// redaction set: exactly the parts where its service carries a secret, so
// that a log line still reads ntfy://:[REDACTED]@10.0.20.2:8418/topic.
// Those parts are, in shoutrrr's URL forms: the password of the user
// information (ntfy, smtp, matrix, telegram's bot token, pushover, join,
// zulip, bark); the user name when it stands alone and is the token
// (discord, and any service but those whose user is a login name); the
// host where a service puts its key there (slack's webhook token-a,
// pushbullet, ifttt, pushover's user key, teams); the path segments that
// hold a token (gotify, opsgenie and lark: the last; mattermost: the first;
// slack, rocketchat and teams: all); the value of every query parameter
// whose name says it is a credential (redact.SecretParam: googlechat's key
// and token, lark's secret); and, for any service, a path segment or query
// value that looks random (redact.HighEntropy: a webhook's ID). A URL that
// does not parse is a secret whole. Parts shorter than 4 characters are
// left out (they would mask ordinary text and guard nothing).
func Secrets(raw string) []string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return []string{raw}
	}
	var out []string
	add := func(s string) {
		if len(s) >= 4 {
			out = append(out, s)
		}
	}
	service := strings.TrimPrefix(strings.ToLower(u.Scheme), "generic+")
	if u.User != nil {
		if p, ok := u.User.Password(); ok {
			add(p)
		} else if !loginUser[service] {
			add(u.User.Username())
		}
	}
	if h := u.Hostname(); hostIsKey[service] && h != "" && !isLoopbackOrIP(h) {
		add(h)
	}
	var segs []string
	for _, seg := range strings.Split(u.Path, "/") {
		if seg != "" {
			segs = append(segs, seg)
		}
	}
	for i, seg := range segs {
		switch which := tokenSegments[service]; {
		case which == "all" && !strings.HasPrefix(seg, "#") && !strings.HasPrefix(seg, "@"),
			which == "last" && i == len(segs)-1,
			which == "first" && i == 0,
			redact.HighEntropy(seg):
			add(seg)
		}
	}
	for k, vs := range u.Query() {
		for _, v := range vs {
			if redact.SecretParam(k) || redact.HighEntropy(v) {
				add(v)
			}
		}
	}
	return out
}

// Redact returns the URL with exactly its Secrets masked.
func Redact(raw string) string {
	return maskParts(raw, raw)
}

var (
	// loginUser: services whose lone user name is an account's login,
	// not a token.
	loginUser = map[string]bool{"slack": true, "smtp": true, "matrix": true, "mattermost": true, "rocketchat": true, "signal": true, "ntfy": true}
	// hostIsKey: services that carry a key or token where the host goes.
	hostIsKey = map[string]bool{"slack": true, "pushbullet": true, "ifttt": true, "pushover": true, "teams": true}
	// tokenSegments: which path segments carry a service's token.
	tokenSegments = map[string]string{
		"gotify": "last", "opsgenie": "last", "lark": "last",
		"mattermost": "first", "pushbullet": "first",
		"slack": "all", "rocketchat": "all", "teams": "all",
	}
)

// Check says whether each URL names a service shoutrrr knows with a
// valid configuration, without sending anything; the errors name URLs by
// Label.
func Check(urls []string) error {
	var errs []error
	for i, raw := range urls {
		_, err := router.New(nil, raw)
		if err == nil && gotifyEnhanced(raw) {
			_, _, _, _, err = gotifyEndpoint(raw)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %s", Label(i, raw), mask(err, raw)))
		}
	}
	return errors.Join(errs...)
}

// Result is what sending to one URL did.
type Result struct {
	// Label names the URL (Label).
	Label string
	// Err is nil when the service took the message; its text names no
	// credential of the URL.
	Err error
	// Took is how long the send took.
	Took time.Duration
}

// Send sends title and message to every URL, side by side, each bounded
// by Timeout, and reports each in the order given.
func Send(urls []string, title, message string) []Result {
	out := make([]Result, len(urls))
	done := make(chan struct{}, len(urls))
	for i, raw := range urls {
		go func() {
			defer func() { done <- struct{}{} }()
			start := time.Now()
			out[i] = Result{Label: Label(i, raw)}
			var err error
			if gotifyEnhanced(raw) {
				ctx, cancel := context.WithTimeout(context.Background(), Timeout)
				err = sendGotify(ctx, raw, title, message)
				cancel()
			} else {
				var r *router.ServiceRouter
				if r, err = router.New(nil, raw); err == nil {
					params := types.Params{"title": title}
					err = errors.Join(r.Send(message, &params)...)
				}
			}
			if err != nil {
				out[i].Err = errors.New(mask(err, raw))
			}
			out[i].Took = time.Since(start)
		}()
	}
	for range urls {
		<-done
	}
	return out
}

// mask is err's text with the URL's secret parts replaced (shoutrrr's
// errors quote the URL they were given) and every secret recognised by its
// shape (redact.Text): a service's errors may quote what it learnt on the
// way, such as the access token a Matrix login returned.
func mask(err error, raw string) string {
	return maskText(err.Error(), raw)
}

func maskText(s, raw string) string {
	return redact.Text(maskParts(s, raw))
}

func maskParts(s, raw string) string {
	secrets := Secrets(raw)
	// Longest first: a part inside another is masked with it.
	sort.Slice(secrets, func(i, j int) bool { return len(secrets[i]) > len(secrets[j]) })
	for _, sec := range secrets {
		s = strings.ReplaceAll(s, sec, redact.Mask)
		if esc := url.PathEscape(sec); esc != sec {
			s = strings.ReplaceAll(s, esc, redact.Mask)
		}
	}
	return s
}

// isLoopbackOrIP: an address names a machine, not an account.
func isLoopbackOrIP(h string) bool {
	return h == "localhost" || net.ParseIP(h) != nil
}
