package talos

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/homelab/bootstrap/lab/talossim"
)

// TestReadsKeepTheirConnection: reads to a node share one kept client; a
// read whose kept connection died with the node's power cycle is asked
// again on a fresh one and answers as a fresh read would, and a read to a
// node that is down fails as it would on a fresh connection.
func TestReadsKeepTheirConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := newHarness(t, harnessOptions{controlPlanes: 1})
	if _, err := h.converge(ctx, nil); err != nil {
		t.Fatal(err)
	}
	cp := h.targets()[0]
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := h.ops.Services(ctx, cp.IP); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	kept := func() *keptClient {
		h.ops.keptMu.Lock()
		defer h.ops.keptMu.Unlock()
		if len(h.ops.kept) != 1 {
			t.Fatalf("kept clients %v, want one for %s", h.ops.kept, cp.IP)
		}
		return h.ops.kept[cp.IP]
	}
	first := kept()
	if first.refs != 0 {
		t.Fatalf("a finished read still holds the client (%d refs)", first.refs)
	}

	// Power-cycled between two reads: the kept connection went with the
	// old process; the read is answered (gRPC dials the new one, or the
	// read is asked again on a fresh client).
	boot := func() {
		node, err := h.sim.BootNode(ctx, talossim.NodeSpec{IP: cp.IP, Hostname: cp.Name, Disks: []talossim.Disk{{Bus: "scsi", Size: 64 << 30}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := node.WaitPhase(ctx, talossim.PhaseRunning); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.sim.StopNode(cp.IP); err != nil {
		t.Fatal(err)
	}
	boot()
	if p, err := h.ops.Probe(ctx, cp.IP); err != nil || p.Mode != ModeConfigured {
		t.Fatalf("probe after a power cycle: %+v %v", p, err)
	}
	// Off: the read fails as on a fresh connection (the node is down), and
	// the failed client is not kept.
	if err := h.sim.StopNode(cp.IP); err != nil {
		t.Fatal(err)
	}
	if p, err := h.ops.Probe(ctx, cp.IP); err != nil || p.Mode != ModeDown {
		t.Fatalf("probe of a node that is off: %+v %v", p, err)
	}
	h.ops.keptMu.Lock()
	n := len(h.ops.kept)
	h.ops.keptMu.Unlock()
	if n != 0 || !first.dropped {
		t.Fatalf("a client whose reads failed is still kept (%d kept)", n)
	}
	boot()
	if p, err := h.ops.Probe(ctx, cp.IP); err != nil || p.Mode != ModeConfigured {
		t.Fatalf("probe once it is back: %+v %v", p, err)
	}
	if kept() == first {
		t.Fatal("the dropped client came back")
	}
}
