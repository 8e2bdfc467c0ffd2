package proxmox

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"
)

// HostRoom is one cluster member's room for new VMs.
type HostRoom struct {
	Name string
	// FreeBytes is the memory available now (node status' memory.available,
	// see NodeStatus).
	FreeBytes int64
}

// Place decides the member of every spec without one, deterministically
// for the same inputs:
//   - a VM that exists already stays where it is (at: VMID → member, from
//     /cluster/resources), whatever the config asks: PlanVM adopts it
//     there and says where it was asked to be;
//   - a spec with a Node (the config's nodes[].host) keeps it;
//   - each new control plane goes to the member with the fewest control
//     planes so far, so etcd members do not share a host while there are
//     hosts to spare (ties: most free memory, then the hosts' order);
//   - each new worker goes to the member with the most free memory left
//     after the VMs placed before it (ties: the hosts' order).
//
// Specs keep their order; hosts must not be empty.
func Place(specs []VMSpec, hosts []HostRoom, at map[int]string) []VMSpec {
	out := append([]VMSpec(nil), specs...)
	free := map[string]int64{}
	cps := map[string]int{}
	index := map[string]int{}
	for i, h := range hosts {
		free[h.Name] = h.FreeBytes
		index[h.Name] = i
	}
	isNew := make([]bool, len(out))
	for i := range out {
		s := &out[i]
		if where, ok := at[s.VMID]; ok && where != "" {
			if s.Node == "" {
				s.Node = where
			}
			// Counted where it runs, which PlanVM adopts.
			if s.Role == "controlplane" {
				cps[where]++
			}
			continue
		}
		isNew[i] = true
		if s.Node != "" {
			free[s.Node] -= int64(s.MemoryMiB) << 20
			if s.Role == "controlplane" {
				cps[s.Node]++
			}
		}
	}
	better := func(a, b string, byCP bool) bool {
		if byCP && cps[a] != cps[b] {
			return cps[a] < cps[b]
		}
		if free[a] != free[b] {
			return free[a] > free[b]
		}
		return index[a] < index[b]
	}
	for _, role := range []string{"controlplane", "worker"} {
		for i := range out {
			s := &out[i]
			if !isNew[i] || s.Node != "" || s.Role != role {
				continue
			}
			best := hosts[0].Name
			for _, h := range hosts[1:] {
				if better(h.Name, best, role == "controlplane") {
					best = h.Name
				}
			}
			s.Node = best
			free[best] -= int64(s.MemoryMiB) << 20
			if role == "controlplane" {
				cps[best]++
			}
		}
	}
	return out
}

// PlaceVMs places specs over hosts (see Place) from the members' memory
// and where vms already are. With one host (or none: this client's node)
// every spec without a Node goes there and nothing is read.
func (c *Client) PlaceVMs(ctx context.Context, specs []VMSpec, hosts []string, vms []VMSummary) ([]VMSpec, error) {
	if len(hosts) == 0 {
		hosts = []string{c.node}
	}
	at := map[int]string{}
	for _, v := range vms {
		at[v.VMID] = v.Node
	}
	if len(hosts) == 1 {
		return Place(specs, []HostRoom{{Name: hosts[0]}}, at), nil
	}
	// The members are asked at once: the reads are independent, and the
	// placement waits for the slowest answer instead of their sum.
	rooms := make([]HostRoom, len(hosts))
	g, gctx := errgroup.WithContext(ctx)
	for i, h := range hosts {
		g.Go(func() error {
			ns, err := c.On(h).NodeStatus(gctx)
			if err != nil {
				return fmt.Errorf("reading the memory of Proxmox member %s to place the VMs: %w", h, err)
			}
			rooms[i] = HostRoom{Name: h, FreeBytes: ns.MemoryAvailable}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return Place(specs, rooms, at), nil
}
