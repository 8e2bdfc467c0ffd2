package proxmox

import (
	"fmt"
	"net"
	"net/url"
	"testing"

	"github.com/homelab/bootstrap/internal/retry"
)

// TestClassifyNamesAreFinalTimeoutsAreNot: a host name the resolver says
// does not exist is no transient failure (retrying it only delays the
// answer a newcomer's first run needs); a resolver that timed out or
// failed is.
func TestClassifyNamesAreFinalTimeoutsAreNot(t *testing.T) {
	wrap := func(e *net.DNSError) error {
		return &url.Error{Op: "Get", URL: "https://pve.lan:8006/api2/json/version", Err: &net.OpError{Op: "dial", Net: "tcp", Err: e}}
	}
	nx := wrap(&net.DNSError{Err: "no such host", Name: "pve.lan", IsNotFound: true})
	if retry.IsRetryable(classify("GET", "/version", nx)) {
		t.Errorf("no such host is retried: %v", classify("GET", "/version", nx))
	}
	for _, e := range []*net.DNSError{
		{Err: "i/o timeout", Name: "pve.lan", IsTimeout: true},
		{Err: "server misbehaving", Name: "pve.lan", IsTemporary: true},
	} {
		if err := classify("GET", "/version", wrap(e)); !retry.IsRetryable(err) {
			t.Errorf("%v is not retried", fmt.Sprint(e))
		}
	}
}
