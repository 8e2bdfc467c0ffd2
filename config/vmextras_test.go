package config

import "testing"

// TestExtrasPerRoleAndNode: a role's non-empty disks or nics replace
// proxmox.vm's, a node's replace its role's; an empty list inherits.
func TestExtrasPerRoleAndNode(t *testing.T) {
	c := &Config{Proxmox: Proxmox{
		VM:     VMShape{Disks: []VMDisk{{Name: "all"}}, NICs: []VMNIC{{Bridge: "vmbr1"}}},
		RoleVM: RoleVM{Worker: VMShape{Disks: []VMDisk{{Name: "longhorn"}}}},
	}}
	for _, tc := range []struct {
		node       Node
		disk, nicB string
	}{
		{Node{Role: RoleControlPlane}, "all", "vmbr1"},
		{Node{Role: RoleWorker}, "longhorn", "vmbr1"},
		{Node{Role: RoleWorker, VM: VMShape{Disks: []VMDisk{{Name: "ceph"}}, NICs: []VMNIC{{Bridge: "vmbr2"}}}}, "ceph", "vmbr2"},
	} {
		s := c.VMShapeOf(tc.node)
		if len(s.Disks) != 1 || s.Disks[0].Name != tc.disk || len(s.NICs) != 1 || s.NICs[0].Bridge != tc.nicB {
			t.Errorf("%s %+v: disks %+v nics %+v, want %s and %s", tc.node.Role, tc.node.VM, s.Disks, s.NICs, tc.disk, tc.nicB)
		}
	}
	if got := DiskSerial("lab", "wk-1", "data"); len(got) != 19 || got != DiskSerial("lab", "wk-1", "data") || got == DiskSerial("lab", "wk-2", "data") {
		t.Errorf("serial %q: must be 19 characters, stable, and differ per node", got)
	}
}
