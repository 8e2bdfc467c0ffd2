package pvesim

import (
	"strings"
	"testing"
)

// The cpu option is refused as qemu-server's validate_vm_cpu_conf
// refuses it, naming the flags of the simulated release in its order.
func TestCPUOption(t *testing.T) {
	for _, tc := range []struct{ qemuServer, cpu, err string }{
		{"8.3.12", "host,flags=+aes;-pcid", ""},
		{"8.3.12", "cputype=x86-64-v2-AES,flags=+nested-virt", "subset of: pcid, spec-ctrl, ibpb, ssbd, virt-ssbd, amd-ssbd, amd-no-ssb, pdpe1gb, md-clear, hv-tlbflush, hv-evmcs, aes\n"},
		{"9.1.9", "host,flags=+nested-virt", ""},
		{"9.1.9", "host,flags=+vmx", "subset of: nested-virt, pcid, spec-ctrl"},
		{"9.2.6", "host,flags=aes", "subset of: aes, amd-no-ssb, amd-ssbd, hv-evmcs, hv-tlbflush, ibpb, md-clear, nested-virt, pcid"},
		{"9.2.6", "Skylake-Client-v9", "Built-in cputype 'Skylake-Client-v9' is not defined"},
		{"9.2.6", "flags=+aes", ""}, // the type defaults to kvm64
	} {
		s := &Server{opts: Options{QemuServer: tc.qemuServer}}
		errs := s.cpuErrs(map[string]string{"cpu": tc.cpu})
		switch {
		case tc.err == "" && errs != nil:
			t.Errorf("%s %q: refused: %v", tc.qemuServer, tc.cpu, errs)
		case tc.err != "" && !strings.Contains(errs["cpu"], tc.err):
			t.Errorf("%s %q: %q, want %q", tc.qemuServer, tc.cpu, errs["cpu"], tc.err)
		}
	}
}
