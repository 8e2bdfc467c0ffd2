package proxmox

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// The privilege model: what a run needs of the token (RequiredPrivileges,
// read from the checks Proxmox makes for each call), what it lacks
// (Missing), and the role derived from it (role.go). The precheck's
// privileges row reports Missing; schema_test.go holds the needs against
// each call's permission check in Proxmox's published API schema.

// Grant is a set of privileges on one path.
type Grant struct {
	Path  string
	Privs []string
}

func (g Grant) String() string { return strings.Join(g.Privs, "+") + " on " + g.Path }

// Need is one requirement of the run: any one of Options must be fully granted.
type Need struct {
	Why     string
	Options []Grant
	// Advisory marks what the run itself does without: lacking it, only a
	// later check degrades (the nightly's guest-agent row), so the
	// precheck warns instead of failing.
	Advisory bool
}

func allOf(why, path string, privs ...string) Need {
	return Need{Why: why, Options: []Grant{{Path: path, Privs: privs}}}
}

func anyOf(why, path string, privs ...string) Need {
	n := Need{Why: why}
	for _, p := range privs {
		n.Options = append(n.Options, Grant{Path: path, Privs: []string{p}})
	}
	return n
}

// createPrivileges are what POST /nodes/{node}/qemu checks for the options
// a Talos VM is created with (qemu-server's per-option privilege groups).
var createPrivileges = []string{
	"VM.Allocate", "VM.Audit", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Options",
	"VM.Config.HWType", "VM.Config.Disk", "VM.Config.Network", "VM.PowerMgmt",
}

// RequiredPrivileges lists what this run needs given the plans (from
// PlanVM; a spec without a plan counts as to be created) and whether the
// ISO must be downloaded.
func RequiredPrivileges(node string, v Version, in PrecheckInput, plans map[int]Plan, downloadISO bool) []Need {
	var needs []Need
	members := []string{node}
	for _, s := range in.VMs {
		if s.Node != "" && !contains(members, s.Node) {
			members = append(members, s.Node)
		}
	}
	for _, m := range members {
		needs = append(needs, allOf("read node status", "/nodes/"+m, "Sys.Audit"))
	}
	storages := map[string]bool{}
	for _, s := range in.VMs {
		vmPath := "/vms/" + strconv.Itoa(s.VMID)
		p, planned := plans[s.VMID]
		if !planned || p.Create || p.WaitCreate {
			needs = append(needs, allOf(fmt.Sprintf("create and start VM %d %s", s.VMID, s.Name), vmPath, createPrivileges...))
			// A cloudinit volume needs no Datastore.AllocateSpace
			// (qemu-server PVE/API2/Qemu.pm check_storage_access: "nothing
			// to check"), only the disks do.
			needs = append(needs, allOf("allocate disks for VM "+strconv.Itoa(s.VMID), "/storage/"+s.DiskStorage, "Datastore.AllocateSpace"))
			if zone := in.zone(s.Bridge); v.Major >= 8 && zone != "" {
				// check_vnet_access (pve-guest-common GuestHelpers.pm):
				// SDN.Use on the bridge's zone path, and its VLAN when tagged.
				path := "/sdn/zones/" + zone + "/" + s.Bridge
				if s.VLAN != 0 {
					path += "/" + strconv.Itoa(s.VLAN)
				}
				needs = append(needs, allOf("attach VM "+strconv.Itoa(s.VMID)+" to "+s.Bridge, path, "SDN.Use"))
			}
			storages[s.DiskStorage] = true
			continue
		}
		needs = append(needs, allOf(fmt.Sprintf("read and start VM %d %s", s.VMID, s.Name), vmPath, "VM.Audit", "VM.PowerMgmt"))
		for k := range p.Update {
			switch k {
			case "cores":
				needs = append(needs, allOf("change cores of VM "+strconv.Itoa(s.VMID), vmPath, "VM.Config.CPU"))
			case "memory":
				needs = append(needs, allOf("change memory of VM "+strconv.Itoa(s.VMID), vmPath, "VM.Config.Memory"))
			default:
				needs = append(needs, allOf("change "+k+" of VM "+strconv.Itoa(s.VMID), vmPath, "VM.Config.Options"))
			}
		}
		if p.GrowDisk > 0 {
			needs = append(needs, allOf("grow the disk of VM "+strconv.Itoa(s.VMID), vmPath, "VM.Config.Disk"))
			needs = append(needs, allOf("grow the disk of VM "+strconv.Itoa(s.VMID), "/storage/"+s.DiskStorage, "Datastore.AllocateSpace"))
		}
		storages[s.DiskStorage] = true
	}
	for st := range storages {
		needs = append(needs, anyOf("see capacity of "+st, "/storage/"+st, "Datastore.Audit", "Datastore.AllocateSpace"))
	}
	needs = append(needs, anyOf("list and attach ISOs on "+in.ISO.Storage, "/storage/"+in.ISO.Storage, "Datastore.Audit", "Datastore.AllocateSpace"))
	if downloadISO {
		needs = append(needs, downloadNeeds(v, in.ISO.Storage, members)...)
	}
	if in.HA {
		for _, s := range in.VMs {
			if p, ok := plans[s.VMID]; !ok || !p.HAManaged {
				needs = append(needs, allOf("add the VMs to the HA resources", "/", "Sys.Console"))
				break
			}
		}
	}
	if in.HA && SeparationSupported(v) && controlPlanes(in.VMs) >= 2 {
		// The rule that keeps the control planes apart is read (GET
		// /cluster/ha/rules: Sys.Audit on /) and written (POST, PUT,
		// DELETE: Sys.Console on /), pve-ha-manager 5.2.0
		// src/PVE/API2/HA/Rules.pm.
		needs = append(needs, allOf("keep the control planes on separate members (HA rule)", "/", "Sys.Audit", "Sys.Console"))
	}
	needs = append(needs, pciNeeds(in, plans)...)
	for _, s := range in.VMs {
		if !s.GuestAgent {
			continue
		}
		// The postcheck pings each agent: VM.GuestAgent.Audit (or
		// .Unrestricted) since qemu-server 9.0.3 (commit b92a40ce, "use more
		// specific guest agent privileges"), VM.Monitor before it
		// (src/PVE/API2/Qemu/Agent.pm's default perms).
		why := "ping the guest agent of VM " + strconv.Itoa(s.VMID)
		n := anyOf(why, "/vms/"+strconv.Itoa(s.VMID), "VM.GuestAgent.Audit", "VM.GuestAgent.Unrestricted")
		if v.Major < 9 {
			n = allOf(why, "/vms/"+strconv.Itoa(s.VMID), "VM.Monitor")
		}
		n.Advisory = true
		needs = append(needs, n)
	}
	for _, s := range in.VMs {
		if s.Image != "" {
			continue
		}
		// The talos stage ejects the ISO once Talos runs from the disk
		// (a VM holding an ISO on local storage cannot migrate): update_vm
		// asks VM.Config.CDROM for a cdrom drive (qemu-server 9.2.6
		// src/PVE/API2/Qemu.pm $check_drive_perms). Without it the ISO
		// stays and the run goes on.
		n := allOf("eject the Talos ISO from VM "+strconv.Itoa(s.VMID)+" once Talos is installed", "/vms/"+strconv.Itoa(s.VMID), "VM.Config.CDROM")
		n.Advisory = true
		needs = append(needs, n)
	}
	return needs
}

// controlPlanes counts the control planes among specs.
func controlPlanes(specs []VMSpec) int {
	n := 0
	for _, s := range specs {
		if s.Role == "controlplane" {
			n++
		}
	}
	return n
}

// Paths returns the ACL paths the needs are judged on, the ones whose
// permissions are to be read.
func Paths(needs []Need) []string {
	var paths []string
	for _, n := range needs {
		for _, o := range n.Options {
			paths = append(paths, o.Path)
		}
	}
	return paths
}

// Missing returns, for each unmet need, what is lacking: the missing
// privileges of its one grant, or the alternatives spelled out.
func Missing(needs []Need, held map[string]Privileges) []Grant {
	var out []Grant
	for _, n := range needs {
		var lacks [][]string
		met := false
		for _, opt := range n.Options {
			var lack []string
			for _, p := range opt.Privs {
				if !held[opt.Path][p] {
					lack = append(lack, p)
				}
			}
			if len(lack) == 0 {
				met = true
				break
			}
			lacks = append(lacks, lack)
		}
		switch {
		case met:
		case len(n.Options) == 1:
			out = append(out, Grant{Path: n.Options[0].Path, Privs: lacks[0]})
		case samePath(n.Options):
			// Alternatives on one path read as one grant: "VM.GuestAgent.Audit
			// or VM.GuestAgent.Unrestricted on /vms/701, /vms/702".
			alts := make([]string, len(n.Options))
			for i, o := range n.Options {
				alts[i] = strings.Join(o.Privs, "+")
			}
			out = append(out, Grant{Path: n.Options[0].Path, Privs: []string{strings.Join(alts, " or ")}})
		default:
			alts := make([]string, len(n.Options))
			for i, o := range n.Options {
				alts[i] = o.String()
			}
			out = append(out, Grant{Privs: []string{"one of (" + strings.Join(alts, " or ") + ")"}})
		}
	}
	return out
}

func samePath(gs []Grant) bool {
	for _, g := range gs {
		if g.Path != gs[0].Path {
			return false
		}
	}
	return true
}

// describeMissing groups missing grants by privilege: "VM.Allocate on
// /vms/701, /vms/702; SDN.Use on /sdn/zones/localnetwork/vmbr0".
func describeMissing(gs []Grant) string {
	byPriv := map[string][]string{}
	for _, g := range gs {
		for _, p := range g.Privs {
			if g.Path == "" {
				byPriv[p] = nil
				continue
			}
			if !contains(byPriv[p], g.Path) {
				byPriv[p] = append(byPriv[p], g.Path)
			}
		}
	}
	privs := make([]string, 0, len(byPriv))
	for p := range byPriv {
		privs = append(privs, p)
	}
	sort.Strings(privs)
	parts := make([]string, 0, len(privs))
	for _, p := range privs {
		if byPriv[p] == nil {
			parts = append(parts, p)
			continue
		}
		sort.Strings(byPriv[p])
		parts = append(parts, p+" on "+strings.Join(byPriv[p], ", "))
	}
	return strings.Join(parts, "; ")
}

// CreatePrivileges are what creating and starting a VM needs on its
// /vms/<vmid> path (see RequiredPrivileges), for callers that re-create one.
func CreatePrivileges() []string { return slices.Clone(createPrivileges) }

// VMGrants compares the token's privileges on /vms/<vmid> with those on
// /vms: a difference is an ACL entry on the VM itself (or its pool's), which
// Proxmox deletes with the VM (remove_vm_access: qemu-server 9.2.6
// src/PVE/API2/Qemu.pm destroy_vm; pve-access-control 9.1.1
// src/PVE/AccessControl.pm drops the VM's ACL entries and its pool
// membership). lackAfter are the create privileges the token will then
// lack on a VM created again under that VMID (what /vms grants).
func (c *Client) VMGrants(ctx context.Context, vmid int) (perVM bool, lackAfter []string, err error) {
	vmPath := "/vms/" + strconv.Itoa(vmid)
	held, err := c.Permissions(ctx, []string{vmPath, "/vms"})
	if err != nil {
		return false, nil, fmt.Errorf("reading the token's privileges on %s: %w", vmPath, err)
	}
	here, parent := held[vmPath], held["/vms"]
	for p := range here {
		if !parent[p] {
			perVM = true
		}
	}
	for p := range parent {
		if !here[p] {
			perVM = true
		}
	}
	for _, p := range createPrivileges {
		if !parent[p] {
			lackAfter = append(lackAfter, p)
		}
	}
	return perVM, lackAfter, nil
}
