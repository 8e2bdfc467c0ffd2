package talos

import (
	"errors"
	"testing"
)

// A node switching from its maintenance service to apid between the two
// calls of a probe (the cold CI run's TestSlowApplyIsNotRepeated: "is
// configured by another Talos cluster" for this cluster's own node while
// it installed): the first call meets the maintenance certificate, the
// second apid's demand for a client certificate. Asked once more, the node
// trusts us; another cluster's node does not.
func TestProbeAcrossTheSwitchToApid(t *testing.T) {
	untrusted := errors.New("rpc error: code = Unavailable desc = connection error: desc = \"transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority\"")
	certRequired := errors.New("rpc error: code = Unavailable desc = connection error: desc = \"remote error: tls: certificate required\"")
	script := func(answers ...error) func(bool) (string, error) {
		i := 0
		return func(bool) (string, error) {
			err := answers[min(i, len(answers)-1)]
			i++
			if err == nil {
				return "v1.13.3", nil
			}
			return "", err
		}
	}
	p, err := classifyProbe("10.5.0.11", script(untrusted, certRequired, nil))
	if err != nil || p.Mode != ModeConfigured || p.Version != "v1.13.3" {
		t.Fatalf("switching node: %+v %v, want configured", p, err)
	}
	p, err = classifyProbe("10.5.0.11", script(untrusted, certRequired, untrusted))
	if err != nil || p.Mode != ModeForeign {
		t.Fatalf("another cluster's node: %+v %v, want foreign", p, err)
	}
	p, err = classifyProbe("10.5.0.11", script(untrusted, nil))
	if err != nil || p.Mode != ModeMaintenance {
		t.Fatalf("maintenance node: %+v %v", p, err)
	}
}
