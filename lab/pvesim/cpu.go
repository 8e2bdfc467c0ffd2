package pvesim

import (
	"slices"
	"strings"
)

// cpuTypes are the CPU types a VM's cpu option may name without a
// custom- prefix: host and qemu-server's built-in models (9.2.6
// src/PVE/QemuServer/CPUConfig.pm $cpu_vendor_list and
// $builtin_models_by_arch). The lab knows the ones the product offers
// and Proxmox's defaults; another name is refused here as the real
// validate_vm_cpu_conf refuses an unknown one (the full QEMU list is not
// modelled: unverified for names outside it).
var cpuTypes = []string{"host", "kvm64", "qemu64", "max", "x86-64-v2", "x86-64-v2-AES", "x86-64-v3", "x86-64-v4"}

// vmCPUFlags are the flags a VM's own cpu option may set: the twelve of
// qemu-server 8.4.10 (src/PVE/QemuServer/CPUConfig.pm
// @supported_cpu_flags), in its order.
var vmCPUFlags = []string{"pcid", "spec-ctrl", "ibpb", "ssbd", "virt-ssbd", "amd-ssbd", "amd-no-ssb", "pdpe1gb", "md-clear", "hv-tlbflush", "hv-evmcs", "aes"}

// nestedVirtSince is the qemu-server release that added nested-virt, at
// the head of the list (commit 9e319737, first in 9.0.27); flagsSortedSince
// the one whose refusal names them sorted (commit 71c42d38 moved them to
// CPUFlags.pm, supported_cpu_flags_names; first in 9.1.13).
var (
	nestedVirtSince  = [3]int{9, 0, 27}
	flagsSortedSince = [3]int{9, 1, 13}
)

// supportedCPUFlags lists the VM-specific flags of the simulated
// qemu-server, in the order its refusal names them.
func (s *Server) supportedCPUFlags() []string {
	if !atLeast(s.opts.QemuServer, nestedVirtSince) {
		return vmCPUFlags
	}
	fs := append([]string{"nested-virt"}, vmCPUFlags...)
	if atLeast(s.opts.QemuServer, flagsSortedSince) {
		slices.Sort(fs)
	}
	return fs
}

// cpuErrs checks a cpu option as qemu-server's pve-vm-cpu-conf format
// does (validate_vm_cpu_conf): a known type, and flags only from the
// VM-specific set. The message is the format's die text under
// JSONSchema's "invalid format - ".
func (s *Server) cpuErrs(cfg map[string]string) map[string]string {
	v, ok := cfg["cpu"]
	if !ok {
		return nil
	}
	var typ, flags string
	for i, part := range strings.Split(v, ",") {
		k, val, hasEq := strings.Cut(part, "=")
		switch {
		case i == 0 && !hasEq:
			typ = part
		case k == "cputype":
			typ = val
		case k == "flags":
			flags = val
		case !hasEq:
			return map[string]string{"cpu": "invalid format - missing key in comma-separated list property"}
		}
	}
	if typ == "" {
		typ = "kvm64"
	}
	if !strings.HasPrefix(typ, "custom-") && !slices.Contains(cpuTypes, typ) {
		return map[string]string{"cpu": "invalid format - Built-in cputype '" + typ + "' is not defined (missing 'custom-' prefix?)\n"}
	}
	if flags != "" {
		allowed := s.supportedCPUFlags()
		for _, f := range strings.Split(flags, ";") {
			if len(f) < 2 || (f[0] != '+' && f[0] != '-') || !slices.Contains(allowed, f[1:]) {
				return map[string]string{"cpu": "invalid format - VM-specific CPU flags must be a subset of: " + strings.Join(allowed, ", ") + "\n"}
			}
		}
	}
	return nil
}
