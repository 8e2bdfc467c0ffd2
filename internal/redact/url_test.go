package redact

import (
	"slices"
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	for _, c := range []struct {
		in, want string
		secrets  []string
	}{
		{"https://pve.lan:8006/api2/json", "https://pve.lan:8006/api2/json", nil},
		{"https://root:hunter2@pve.lan:8006/api2/json", "https://root:[REDACTED]@pve.lan:8006/api2/json", []string{"hunter2"}},
		{"https://glpat-abcdefghij0123456789@gitlab.com/x.git", "https://[REDACTED]@gitlab.com/x.git", []string{"glpat-abcdefghij0123456789"}},
		{"https://h/manifests.tar.gz?token=s3cr3t&v=1", "https://h/manifests.tar.gz?token=[REDACTED]&v=1", []string{"s3cr3t"}},
		{"https://b.s3.amazonaws.com/k?X-Amz-Signature=abcd&X-Amz-Date=1", "https://b.s3.amazonaws.com/k?X-Amz-Date=1&X-Amz-Signature=[REDACTED]", []string{"abcd"}},
		{"oci://user:tok123@ghcr.io/charts", "oci://user:[REDACTED]@ghcr.io/charts", []string{"tok123"}},
		{"https://user:pa ss@host/x", "https://[REDACTED]@host/x", []string{"user:pa ss", "pa ss"}},
		{"not a url", "not a url", nil},
		{"ssh://git@github.com/me/homelab.git", "ssh://git@github.com/me/homelab.git", nil},
		{"ssh://git:pw123@github.com/me/homelab.git", "ssh://git:[REDACTED]@github.com/me/homelab.git", []string{"pw123"}},
	} {
		got, secrets := urlSecrets(c.in)
		if got != c.want || !slices.Equal(secrets, c.secrets) {
			t.Errorf("urlSecrets(%q) = %q %q, want %q %q", c.in, got, secrets, c.want, c.secrets)
		}
		for _, s := range c.secrets {
			if strings.Contains(got, s) {
				t.Errorf("URL(%q) = %q still holds %q", c.in, got, s)
			}
		}
	}
}

// Parameters named like a credential are masked in the query and in a
// fragment written as parameters; the others stay.
func TestURLParams(t *testing.T) {
	for in, want := range map[string]string{
		"https://git.lan/r.git?pass=hunter22":         "https://git.lan/r.git?pass=[REDACTED]",
		"https://git.lan/r.git?pwd=hunter22&ref=main": "https://git.lan/r.git?pwd=[REDACTED]&ref=main",
		"https://git.lan/r.git#access_token=hunter22": "https://git.lan/r.git#access_token=[REDACTED]",
		"https://git.lan/r.git#readme":                "https://git.lan/r.git#readme",
		"https://git.lan/r.git?ref=main#x=1":          "https://git.lan/r.git?ref=main#x=1",
	} {
		if got := URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
}
