package proxmox

import (
	"fmt"
	"slices"
	"strings"
)

// RunnerRole is the name the README's setup gives the role of this tool's
// API token.
const RunnerRole = "BootstrapRunner"

// RunnerPrivileges is the least-privilege role for this tool's API token on
// Proxmox VE v: everything the privileges precheck can ask of a run (VMs
// created on a VLAN of a bridge under SDN, the ISO downloaded, adopted VMs
// updated and their disks grown, guest agents pinged). It is derived from
// RequiredPrivileges, so the role and the precheck cannot disagree: every
// need with one way to meet it adds its privileges; a need with
// alternatives adds nothing when one of them is already held, else its
// smallest (Sys.AccessNetwork rather than Sys.Audit+Sys.Modify for the
// download where PVE has it). Removing a node needs VM.PowerMgmt and
// VM.Allocate, already in it. Tags need Sys.Modify on / only on PVE 9.2+
// where datacenter.cfg's user-tag-access is not free (the precheck's tags
// row says so); that is left out.
func RunnerPrivileges(v Version) []string {
	full := VMSpec{Cluster: "c", Name: "cp-1", Role: "controlplane", VMID: 1, DiskStorage: "disks",
		Bridge: "vmbr0", VLAN: 20, ISOStorage: "isos", GuestAgent: true}
	adopted := full
	adopted.Name, adopted.VMID = "cp-2", 2
	in := PrecheckInput{VMs: []VMSpec{full, adopted}, ISO: ISOSource{Storage: "isos"}}
	plans := map[int]Plan{
		full.VMID:    {Create: true},
		adopted.VMID: {Adopt: true, GrowDisk: 1, Update: map[string]string{"cores": "", "memory": "", "agent": ""}},
	}
	needs := RequiredPrivileges("pve", v, in, plans, true)
	var out []string
	add := func(privs []string) {
		for _, p := range privs {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	for _, n := range needs {
		if len(n.Options) == 1 {
			add(n.Options[0].Privs)
		}
	}
	for _, n := range needs {
		if len(n.Options) == 1 || slices.ContainsFunc(n.Options, func(o Grant) bool {
			return !slices.ContainsFunc(o.Privs, func(p string) bool { return !slices.Contains(out, p) })
		}) {
			continue
		}
		best := n.Options[0]
		for _, o := range n.Options[1:] {
			if len(o.Privs) < len(best.Privs) {
				best = o
			}
		}
		add(best.Privs)
	}
	slices.Sort(out)
	return out
}

// RunnerSetup is the pveum commands creating the role, a user and its
// privilege-separated token, granted on / (a token holds what both it and
// its user are granted: pve-access-control's compile_acl_path).
func RunnerSetup(v Version, user, token string) string {
	return fmt.Sprintf(`pveum role add %[1]s --privs "%[2]s"
pveum user add %[3]s
pveum acl modify / --users %[3]s --roles %[1]s
pveum user token add %[3]s %[4]s --privsep 1
pveum acl modify / --tokens '%[3]s!%[4]s' --roles %[1]s
`, RunnerRole, strings.Join(RunnerPrivileges(v), ","), user, token)
}
