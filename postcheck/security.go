package postcheck

import (
	"context"
	"fmt"
	"strings"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/talos"
)

// CheckSecurity is the row of each node's Secure Boot and volume
// encryption, as the node reports them.
const CheckSecurity = "talos-security"

// SecurityWant is what the config asks of a node's boot and volumes.
type SecurityWant struct {
	// SecureBoot: the node must boot with Secure Boot enforced.
	SecureBoot bool
	// Encrypted: its STATE and EPHEMERAL must be LUKS2-encrypted.
	Encrypted bool
}

// SecurityProbe reads each node's Secure Boot and volume encryption, by
// node name (talos.Ops.Security). A TalosProbe that also implements it
// feeds CheckSecurity.
type SecurityProbe interface {
	Security(ctx context.Context) (map[string]talos.Security, error)
}

// securityCheck is CheckSecurity's row when some node asks for Secure
// Boot or encryption (Options.Security); nil otherwise, so a cluster
// that asks for neither makes no calls for it.
func securityCheck(o Options) []check.Check {
	for _, w := range o.Security {
		if w.SecureBoot || w.Encrypted {
			c := &checker{o: o}
			return []check.Check{{Name: CheckSecurity, Run: c.security}}
		}
	}
	return nil
}

// security fails naming every node the config asks to boot with Secure
// Boot, or to encrypt, that does not; its pass says what each node runs.
func (c *checker) security(ctx context.Context) (check.Status, string) {
	probe, ok := c.o.Talos.(SecurityProbe)
	if c.o.Talos == nil || !ok {
		return check.Warnf("no talosconfig to reach the Talos API with")
	}
	got, err := probe.Security(ctx)
	var bad, rows []string
	for _, n := range c.o.Nodes {
		want := c.o.Security[n.Name]
		s, answered := got[n.Name]
		if !answered {
			if want.SecureBoot || want.Encrypted {
				bad = append(bad, fmt.Sprintf("%s did not answer", n.Name))
			}
			continue
		}
		row := fmt.Sprintf("%s: Secure Boot %s, STATE %s, EPHEMERAL %s", n.Name, onOff(s.SecureBoot), orNone(s.Volumes["STATE"]), orNone(s.Volumes["EPHEMERAL"]))
		rows = append(rows, row)
		if want.SecureBoot && !s.SecureBoot {
			bad = append(bad, fmt.Sprintf("%s did not boot with Secure Boot (the config asks for it): replace it with bootstrap node replace %s", n.Name, n.Name))
		}
		if want.Encrypted {
			for _, v := range []string{"STATE", "EPHEMERAL"} {
				if s.Volumes[v] == "luks2" {
					continue
				}
				why := ""
				if e := strings.TrimSpace(s.Errors[v]); e != "" {
					why = " (" + strings.Join(strings.Fields(e), " ") + ")"
				}
				bad = append(bad, fmt.Sprintf("%s's %s is not encrypted%s", n.Name, v, why))
			}
		}
	}
	if len(bad) > 0 {
		return check.Failf("%s", strings.Join(bad, "; "))
	}
	if err != nil {
		return check.Warnf("%s; %v", strings.Join(rows, "; "), err)
	}
	return check.Passf("%s", strings.Join(rows, "; "))
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func orNone(p string) string {
	if p == "" || p == "none" {
		return "not encrypted"
	}
	return p
}
