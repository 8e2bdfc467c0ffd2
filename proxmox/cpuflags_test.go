package proxmox

import (
	"strings"
	"testing"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/lab/pvesim"
)

// A VM's CPU flags reach Proxmox in its cpu option; nested-virt is
// refused by the precheck on a host whose qemu-server predates it (as
// that qemu-server's create refuses it), and an existing VM's other flags
// are reported, never changed.
func TestCPUFlags(t *testing.T) {
	ctx := ctxT(t)
	for _, tc := range []struct {
		version string
		nested  bool
	}{{"9.0.11", false}, {"9.1.2", true}} {
		t.Run(tc.version, func(t *testing.T) {
			_, c := newCluster(t, pvesim.Options{Bridges: vlanBridge, Version: tc.version}, []pvesim.NodeSpec{{Name: "pve"}}, nil)
			in := precheckInput(1)
			in.VMs[0].CPU, in.VMs[0].CPUFlags = "x86-64-v3", []string{"+nested-virt", "+aes"}
			if tc.nested {
				expect(t, runPrechecks(t, c, in), CPUFlagsCheck, check.Pass, "nested-virt is known to qemu-server on pve")
				createOn(t, c, in.VMs[0], "pve")
				cfg, err := c.VMConfig(ctx, in.VMs[0].VMID)
				if err != nil || cfg.CPU != "x86-64-v3,flags=+nested-virt;+aes" {
					t.Fatalf("created VM cpu %q, %v", cfg.CPU, err)
				}
				return
			}
			expect(t, runPrechecks(t, c, in), CPUFlagsCheck, check.Fail, "pve runs qemu-server 9.0.20 (VMs node-1)", "remove nested-virt")
			// The precheck is right about the host: its create refuses it.
			src := iso
			src.Checksum = isoSum()
			if _, err := c.EnsureISO(ctx, src); err != nil {
				t.Fatal(err)
			}
			_, err := c.EnsureVM(ctx, in.VMs[0])
			if err == nil || !strings.Contains(err.Error(), "VM-specific CPU flags must be a subset of: pcid, spec-ctrl") {
				t.Fatalf("create with nested-virt on qemu-server 9.0.20: %v", err)
			}
			in.VMs[0].CPUFlags = []string{"+aes"}
			if _, ok := runPrechecks(t, c, in)[CPUFlagsCheck]; ok {
				t.Error("the CPU flags row runs with no VM asking for nested-virt")
			}
		})
	}
	// Adoption: other flags are reported with how to change them; the
	// same flags in another order are no difference.
	e := newEnv(t, pvesim.Options{})
	s := spec(1)
	s.CPUFlags = []string{"+pdpe1gb", "+aes"}
	seed := seedOf(s)
	seed["cpu"] = "host,flags=+aes"
	seed["ide2"] = "none,media=cdrom"
	if err := e.sim.SeedVM(s.VMID, seed, false); err != nil {
		t.Fatal(err)
	}
	vms, err := e.c.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := e.c.PlanVM(ctx, s, vms)
	if err != nil || len(p.Changes()) > 0 || len(p.Drift) != 1 || p.Drift[0].Field != "CPU flags" || p.Drift[0].Kind != DriftReport ||
		p.Drift[0].Want != "+aes;+pdpe1gb" || !strings.Contains(p.Drift[0].Why, "qm set") {
		t.Errorf("adopting a VM with other CPU flags: changes %v, drift %+v, %v", p.Changes(), p.Drift, err)
	}
	s.CPUFlags = []string{"+aes"}
	if p, err := e.c.PlanVM(ctx, s, vms); err != nil || len(p.Drift) != 0 {
		t.Errorf("the same flags: drift %+v, %v", p.Drift, err)
	}
}
