// Package notify tells people about the nightly postcheck through
// shoutrrr (github.com/nicholas-fedor/shoutrrr, the maintained fork of
// containrrr/shoutrrr): one URL per service, in shoutrrr's URL forms
// (ntfy://, gotify://, discord://, slack://, telegram://, matrix://,
// smtp://, generic+https:// and the others it knows). The URLs carry the
// services' credentials: every error this package returns names a URL by
// its position and service only, and Secrets lists what to mask.
package notify

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strings"
	"time"

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

// Secrets returns what in a notification URL may be a credential, for a
// redaction set: the whole URL, its user information, its host (a Discord
// webhook ID, a Telegram bot's name), every path segment and every query
// value. Services put tokens in any of these places (Gotify and Slack in
// the path, Telegram and Discord in the user information, ntfy in either),
// so all of them are masked wherever they appear; parts shorter than 4
// characters are left out (they would mask ordinary text and guard
// nothing).
func Secrets(raw string) []string {
	out := []string{raw}
	u, err := url.Parse(raw)
	if err != nil {
		return out
	}
	add := func(s string) {
		if len(s) >= 4 {
			out = append(out, s)
		}
	}
	if u.User != nil {
		add(u.User.Username())
		if p, ok := u.User.Password(); ok {
			add(p)
		}
	}
	if h := u.Hostname(); h != "" && !isLoopbackOrIP(h) {
		add(h)
	}
	for _, seg := range strings.Split(u.Path, "/") {
		add(seg)
	}
	for _, vs := range u.Query() {
		for _, v := range vs {
			add(v)
		}
	}
	return out
}

// isLoopbackOrIP: an address names a machine, not an account.
func isLoopbackOrIP(h string) bool {
	return h == "localhost" || net.ParseIP(h) != nil
}

// Check says whether each URL names a service shoutrrr knows with a
// valid configuration, without sending anything; the errors name URLs by
// Label.
func Check(urls []string) error {
	var errs []error
	for i, raw := range urls {
		if _, err := router.New(nil, raw); err != nil {
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
			r, err := router.New(nil, raw)
			if err == nil {
				params := types.Params{"title": title}
				err = errors.Join(r.Send(message, &params)...)
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

// mask is err's text with the URL and each of its secret parts replaced:
// shoutrrr's errors quote the URL they were given.
func mask(err error, raw string) string {
	s := err.Error()
	secrets := Secrets(raw)
	// Longest first: a part inside another is masked with it.
	sort.Slice(secrets, func(i, j int) bool { return len(secrets[i]) > len(secrets[j]) })
	for _, sec := range secrets {
		s = strings.ReplaceAll(s, sec, "****")
	}
	return s
}
