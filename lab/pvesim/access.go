package pvesim

import "strconv"

// removeVMAccess is remove_vm_access, which a destroy runs (qemu-server
// 9.2.6 src/PVE/API2/Qemu.pm destroy_vm; pve-access-control 9.1.1
// src/PVE/AccessControl.pm): every ACL entry on /vms/<vmid>, for users,
// groups and tokens alike, is deleted from user.cfg, which the whole
// cluster shares, so a VM created again under that VMID starts without
// them. Pool membership, which it also drops, is not modelled (pvesim has
// no pools).
func (s *Server) removeVMAccess(vmid int) {
	members := []*Server{s}
	if s.cl != nil {
		members = s.cl.members
	}
	path := "/vms/" + strconv.Itoa(vmid)
	keep := func(acl []ACE) []ACE {
		var out []ACE
		for _, ace := range acl {
			if "/"+trimSlashes(ace.Path) != path {
				out = append(out, ace)
			}
		}
		return out
	}
	for _, m := range members {
		m.mu.Lock()
		for id, t := range m.tokens {
			t.ACL = keep(t.ACL)
			m.tokens[id] = t
		}
		for id, u := range m.users {
			if u.ACL != nil {
				u.ACL = keep(u.ACL)
				if u.ACL == nil {
					u.ACL = []ACE{}
				}
			}
			m.users[id] = u
		}
		m.mu.Unlock()
	}
}

func trimSlashes(p string) string {
	for len(p) > 0 && p[0] == '/' {
		p = p[1:]
	}
	for len(p) > 0 && p[len(p)-1] == '/' {
		p = p[:len(p)-1]
	}
	return p
}
