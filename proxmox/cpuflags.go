package proxmox

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/homelab/bootstrap/check"
)

// CPUFlagsCheck names the row that proves each new VM's CPU flags are
// ones its member's qemu-server lets a VM set.
const CPUFlagsCheck = "proxmox: CPU flags"

// nestedVirtSince is the qemu-server release that added the nested-virt
// flag (commit 9e319737 "cpu config: introduce vendor-agnostic
// 'nested-virt' CPU flag", first in 9.0.27; Proxmox VE 9.1 ships 9.1.x).
// An older qemu-server refuses it at create: "VM-specific CPU flags must
// be a subset of" its twelve (8.4.10 src/PVE/QemuServer/CPUConfig.pm).
var nestedVirtSince = [3]int{9, 0, 27}

// wantsNestedVirt says whether any VM asks for the nested-virt flag.
func wantsNestedVirt(vms []VMSpec) bool {
	for _, s := range vms {
		for _, f := range s.CPUFlags {
			if strings.TrimLeft(f, "+-") == "nested-virt" {
				return true
			}
		}
	}
	return false
}

// checkCPUFlags proves that every member a VM with nested-virt is created
// on runs a qemu-server that knows the flag; the other flags are known to
// every release we support (config validates them).
func (f *facts) checkCPUFlags(ctx context.Context) (check.Status, string) {
	ps, placed, err := f.placedPlans(ctx)
	if err != nil {
		return check.Failf("%v", err)
	}
	members := map[string][]string{}
	for _, s := range placed {
		if p, ok := ps.plans[s.VMID]; ok && !p.Create && !p.WaitCreate {
			continue // an existing VM keeps its flags; the run reports a difference
		}
		if !wantsNestedVirt([]VMSpec{s}) {
			continue
		}
		node := s.Node
		if node == "" {
			node = f.c.node
		}
		members[node] = append(members[node], s.Name)
	}
	if len(members) == 0 {
		return check.Passf("no VM to create asks for nested-virt; the other flags are known to every supported release")
	}
	var bad, good []string
	for _, m := range sortedKeys(mapKeys(members)) {
		qs, found, err := f.c.On(m).InstalledPackage(ctx, "qemu-server")
		switch {
		case err != nil:
			return check.Failf("cannot read qemu-server's version on %s to know whether it has the nested-virt flag (%s): %v", m, strings.Join(members[m], ", "), err)
		case !found:
			return check.Failf("qemu-server is not in %s's package list: cannot tell whether it has the nested-virt flag (%s)", m, strings.Join(members[m], ", "))
		case !qs.AtLeastPatch(nestedVirtSince[0], nestedVirtSince[1], nestedVirtSince[2]):
			bad = append(bad, fmt.Sprintf("%s runs qemu-server %s (VMs %s)", m, qs, strings.Join(members[m], ", ")))
		default:
			good = append(good, m)
		}
	}
	if len(bad) > 0 {
		return check.Failf("the nested-virt CPU flag needs qemu-server 9.0.27 or later (Proxmox VE 9.1): %s; upgrade the host, or remove nested-virt from cpuFlags", strings.Join(bad, "; "))
	}
	slices.Sort(good)
	return check.Passf("nested-virt is known to qemu-server on %s", strings.Join(good, ", "))
}
