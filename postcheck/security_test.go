package postcheck

import (
	"context"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/talos"
)

type secProbe struct {
	extProbe
	sec map[string]talos.Security
}

func (p secProbe) Security(context.Context) (map[string]talos.Security, error) { return p.sec, nil }

// The talos-security row exists only when a node asks for Secure Boot or
// encryption; it fails naming the node that asks and does not have it,
// with the volume's own error, and passes saying what each node runs.
func TestSecurityRow(t *testing.T) {
	nodes := []Node{{Name: "cp-1"}, {Name: "wk-1"}}
	names := func(o Options) []string {
		var out []string
		for _, c := range Checks(o) {
			out = append(out, c.Name)
		}
		return out
	}
	plain := Options{Nodes: nodes, Security: map[string]SecurityWant{"cp-1": {}, "wk-1": {}}}
	if got := names(plain); strings.Contains(strings.Join(got, " "), CheckSecurity) {
		t.Errorf("a cluster that asks for nothing got the row: %v", got)
	}
	o := plain
	o.Security = map[string]SecurityWant{"cp-1": {SecureBoot: true, Encrypted: true}, "wk-1": {}}
	if got := names(o); got[len(got)-1] != CheckSecurity {
		t.Fatalf("rows %v", got)
	}
	luks := map[string]string{"STATE": "luks2", "EPHEMERAL": "luks2"}
	none := map[string]string{"STATE": "none", "EPHEMERAL": "none"}
	o.Talos = secProbe{sec: map[string]talos.Security{
		"cp-1": {SecureBoot: true, Volumes: luks},
		"wk-1": {Volumes: none},
	}}
	c := &checker{o: o}
	st, why := c.security(context.Background())
	if st != check.Pass || !strings.Contains(why, "cp-1: Secure Boot on, STATE luks2, EPHEMERAL luks2") || !strings.Contains(why, "wk-1: Secure Boot off, STATE not encrypted") {
		t.Errorf("pass: %s %s", st, why)
	}
	o.Talos = secProbe{sec: map[string]talos.Security{
		"cp-1": {Volumes: map[string]string{"STATE": "none", "EPHEMERAL": "luks2"}, Errors: map[string]string{"STATE": "error formatting and encrypting volume: 1 error occurred:\n\t* open /dev/tpm0: no such file or directory\n\n"}},
		"wk-1": {Volumes: none},
	}}
	c = &checker{o: o}
	st, why = c.security(context.Background())
	if st != check.Fail || !strings.Contains(why, "cp-1 did not boot with Secure Boot") || !strings.Contains(why, "bootstrap node replace cp-1") ||
		!strings.Contains(why, "cp-1's STATE is not encrypted (error formatting and encrypting volume: 1 error occurred: * open /dev/tpm0: no such file or directory)") ||
		strings.Contains(why, "EPHEMERAL is not") || strings.Contains(why, "wk-1") {
		t.Errorf("fail: %s %s", st, why)
	}
}
