package postcheck

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/talos"
)

type extProbe struct {
	exts map[string][]talos.Extension
	err  error
}

func (p extProbe) Health(context.Context) talos.HealthReport           { return talos.HealthReport{} }
func (p extProbe) Versions(context.Context) (map[string]string, error) { return nil, nil }
func (p extProbe) Extensions(context.Context) (map[string][]talos.Extension, error) {
	return p.exts, p.err
}

type agentProbe map[string]error

func (p agentProbe) VMs(context.Context) (VMState, error)                  { return VMState{}, nil }
func (p agentProbe) GuestAgents(context.Context) (map[string]error, error) { return p, nil }

func TestExtensionsAndGuestAgentRows(t *testing.T) {
	nodes := []Node{{Name: "cp-1"}, {Name: "wk-1"}}
	ok := []talos.Extension{{Name: "i915", Version: "v1"}, {Name: "qemu-guest-agent", Version: "10"}, {Name: "schematic", Version: "abc"}}
	c := &checker{o: Options{Nodes: nodes, Extensions: []string{"i915", "qemu-guest-agent"}, Schematic: "abc", GuestAgent: true,
		Talos: extProbe{exts: map[string][]talos.Extension{"cp-1": ok, "wk-1": ok[1:]}}, Observed: &Observed{}}}
	st, why := c.extensions(context.Background())
	if st != check.Fail || !strings.Contains(why, "wk-1 lacks i915") || strings.Contains(why, "cp-1") {
		t.Errorf("extensions: %s %s", st, why)
	}
	c.o.Talos = extProbe{exts: map[string][]talos.Extension{"cp-1": ok, "wk-1": ok}}
	if st, why := c.extensions(context.Background()); st != check.Pass {
		t.Errorf("extensions: %s %s", st, why)
	}
	c.o.Schematic = "def"
	if st, why := c.extensions(context.Background()); st != check.Fail || !strings.Contains(why, `cp-1 runs schematic "abc", not def`) {
		t.Errorf("another schematic: %s %s", st, why)
	}
	c.o.Talos = extProbe{err: errors.New("boom")}
	if st, _ := c.extensions(context.Background()); st != check.Fail {
		t.Errorf("unreadable extensions: %s", st)
	}

	c.o.Proxmox = agentProbe{"cp-1": nil, "wk-1": errors.New("QEMU guest agent is not running")}
	if st, why := c.guestAgents(context.Background()); st != check.Warn || !strings.Contains(why, "wk-1 (QEMU guest agent is not running)") {
		t.Errorf("guest agents: %s %s", st, why)
	}
	c.o.GuestAgent = false
	if st, _ := c.guestAgents(context.Background()); st != check.Pass {
		t.Errorf("no agent expected: %s", st)
	}
}
