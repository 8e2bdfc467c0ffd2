package proxmox

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/lab/pveapi"
	"github.com/homelab/bootstrap/lab/pvesim"
)

// A Secure Boot VM is created with a TPM 2.0 state volume of qemu-server's
// fixed 4 MiB, which the guest does not see as a disk; the EFI disk keeps
// no pre-enrolled keys (setup mode, for the Secure Boot ISO to enroll).
// Each release's schema judges the create (pvesim's schema judge); PVE 8
// stores the state raw (stable-bookworm), PVE 9 in the storage's format.
func TestSecureBootVMGetsTPMState(t *testing.T) {
	for _, version := range []string{"8.2.10", "9.1.19"} {
		t.Run(version, func(t *testing.T) { secureBootVMGetsTPMState(t, version) })
	}
}

func secureBootVMGetsTPMState(t *testing.T, version string) {
	pveapi.DirForTest(t)
	e := newEnv(t, pvesim.Options{Version: version})
	if api, _ := e.sim.Schema(); api == nil {
		t.Fatal("no schema judges the calls")
	}
	ctx := ctxT(t)
	s := spec(1)
	s.Hardware = Hardware{SecureBoot: true, TPM: true}
	e.provision(ctx, e.c, []VMSpec{s})
	vm, _ := e.sim.VM(s.VMID)
	if got := vm.Config["tpmstate0"]; !regexp.MustCompile(`^local-lvm:vm-701-disk-\d+,size=4M,version=v2\.0$`).MatchString(got) {
		t.Errorf("tpmstate0 = %q, want a 4M v2.0 volume on local-lvm", got)
	}
	if !strings.Contains(vm.Config["efidisk0"], "pre-enrolled-keys=0") {
		t.Errorf("efidisk0 = %q, want setup mode", vm.Config["efidisk0"])
	}
	for _, d := range vm.Event.Disks {
		if d.Slot == "tpmstate0" || d.Slot == "efidisk0" {
			t.Errorf("the guest sees %s as a disk", d.Slot)
		}
	}
	fw := vm.Event.Firmware
	if !fw.UEFI || !fw.EFIDisk || fw.PreEnrolledKeys || fw.TPM != "v2.0" {
		t.Errorf("firmware %+v", fw)
	}

	// Without the TPM: none.
	plain := spec(2)
	e.provision(ctx, e.c, []VMSpec{plain})
	if vm, _ := e.sim.VM(plain.VMID); vm.Config["tpmstate0"] != "" || vm.Event.Firmware.TPM != "" {
		t.Errorf("a VM without TPM got %q", vm.Config["tpmstate0"])
	}
}

// An existing VM without the TPM the config asks for is adopted as it
// is, the difference reported with the command that adds one.
func TestMissingTPMIsReportedNotAdded(t *testing.T) {
	e := newEnv(t, pvesim.Options{})
	ctx := ctxT(t)
	s := spec(1)
	s.Hardware = Hardware{TPM: true}
	seed := seedOf(s, "tpmstate0")
	seed["ide2"] = "none,media=cdrom"
	if err := e.sim.SeedVM(s.VMID, seed, false); err != nil {
		t.Fatal(err)
	}
	res := e.provision(ctx, e.c, []VMSpec{s})
	found := false
	for _, d := range res[0].Drift {
		if d.Field == "TPM" {
			found = true
			if d.Kind != DriftReport || !strings.Contains(d.Why, "qm set 701 --tpmstate0 local-lvm:1,version=v2.0") {
				t.Errorf("TPM drift %+v", d)
			}
		}
	}
	if !found {
		t.Errorf("missing TPM not reported: %+v", res[0].Drift)
	}
	if vm, _ := e.sim.VM(s.VMID); vm.Config["tpmstate0"] != "" || vm.Pending["tpmstate0"] != "" {
		t.Error("adoption added a TPM")
	}
}

// Secure Boot cannot be switched under an existing VM: one whose ISO is
// the plain one, or whose EFI disk holds Microsoft's keys, is refused
// with bootstrap node replace as the way on; the Secure Boot ISO under a
// plain spec likewise.
func TestSecureBootSwitchRefused(t *testing.T) {
	for name, c := range map[string]struct {
		secureBoot bool
		edit       map[string]string
		have       string
	}{
		"plain ISO":           {true, nil, "its ISO is local:iso/talos-nocloud-amd64.iso"},
		"pre-enrolled keys":   {true, map[string]string{"ide2": "none,media=cdrom", "efidisk0": "local-lvm:1,efitype=4m,pre-enrolled-keys=1"}, "pre-enrolled Microsoft keys"},
		"Secure Boot ISO":     {false, map[string]string{"ide2": "local:iso/talos-nocloud-amd64-secureboot.iso,media=cdrom"}, "its ISO is local:iso/talos-nocloud-amd64-secureboot.iso"},
		"SB with no EFI disk": {true, map[string]string{"ide2": "none,media=cdrom", "efidisk0": ""}, "no EFI disk"},
	} {
		t.Run(name, func(t *testing.T) {
			s := spec(1)
			s.Hardware = Hardware{SecureBoot: c.secureBoot, TPM: true}
			cfg := &VMConfig{Effective: map[string]string{}}
			for k, v := range s.createParams() {
				cfg.Effective[k] = fmt.Sprint(v)
			}
			for k, v := range c.edit {
				if v == "" {
					delete(cfg.Effective, k)
				} else {
					cfg.Effective[k] = v
				}
			}
			cfg.CDROM, _, _ = strings.Cut(cfg.Effective["ide2"], ",")
			var refused []string
			reportSecurity(s, cfg, func(string, string, string, string) {}, func(field, want, have, why string) {
				refused = append(refused, field+": "+have+": "+why)
			})
			if len(refused) != 1 || !strings.Contains(refused[0], c.have) || !strings.Contains(refused[0], "bootstrap node replace node-1") {
				t.Errorf("refusals %q", refused)
			}
		})
	}
}
