package pvesim

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Cluster-wide facts beyond this node's VMs: other guests holding VMIDs,
// pvestatd's status broadcasts, datacenter.cfg's tag policy, node memory
// and the network list's SDN filter. Each cites the PVE source it models;
// docs/fidelity.md lists them.

// SeedGuest adds a guest this node does not run: a container, or a VM on
// another node. It holds its VMID cluster-wide.
func (s *Server) SeedGuest(g GuestSpec) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.Node == "" {
		g.Node = s.node.Name
	}
	if g.Status == "" {
		g.Status = "running"
	}
	if s.guests == nil {
		s.guests = map[int]GuestSpec{}
	}
	s.guests[g.VMID] = g
	if g.Node != s.node.Name && !slices.Contains(s.otherNodes, g.Node) {
		s.otherNodes = append(s.otherNodes, g.Node)
		sort.Strings(s.otherNodes)
	}
}

// guestTypeLocked names what holds vmid cluster-wide: "VM" or "CT" and its
// node, as PVE::Cluster::check_vmid_unused says it (pve-cluster
// src/PVE/Cluster.pm); "" when free.
func (s *Server) guestTypeLocked(vmid int) (kind, node string) {
	if _, ok := s.vms[vmid]; ok {
		return "VM", s.node.Name
	}
	if g, ok := s.guests[vmid]; ok {
		if g.Type == "lxc" {
			return "CT", g.Node
		}
		return "VM", g.Node
	}
	if n := s.memberHolding(vmid); n != "" {
		return "VM", n
	}
	return "", ""
}

// rrdView is what /cluster/resources shows of a VM: name, status and usage
// come from pvestatd's broadcast, taken every RRDInterval
// (PVE::API2Tools::extract_vm_stats: status 'unknown' and no name without
// RRD data); tags and lock come from the config at once
// (get_guest_config_properties). With no interval the values are live.
func (s *Server) rrdViewLocked(v *vm, live map[string]any, now time.Time) map[string]any {
	every := s.scaled(s.opts.Profile.RRDInterval)
	if every <= 0 {
		return live
	}
	// The broadcast that last ran.
	last := now.Truncate(every)
	if v.rrdAt.Before(last) {
		if v.created.After(last) {
			// Not in any broadcast yet.
			out := map[string]any{"status": "unknown"}
			for _, k := range []string{"tags", "lock"} {
				if val, ok := live[k]; ok {
					out[k] = val
				}
			}
			return out
		}
		v.rrd, v.rrdAt = live, last
	}
	out := map[string]any{}
	for k, val := range v.rrd {
		out[k] = val
	}
	for _, k := range []string{"tags", "lock"} {
		delete(out, k)
		if val, ok := live[k]; ok {
			out[k] = val
		}
	}
	return out
}

// clusterOptions answers GET /cluster/options (pve-manager
// PVE/API2/Cluster.pm get_options): the datacenter.cfg options with
// Sys.Audit on /, else only console and tag-style; and always
// 'allowed-tags', the tags this user may set (get_allowed_tags).
func (s *Server) clusterOptions(r *request) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	dc := s.opts.Datacenter
	out := map[string]any{}
	if r.who.has("/", "Sys.Audit") {
		if dc.UserTagAccess != "" || len(dc.UserAllowList) > 0 {
			uta := map[string]any{"user-allow": dc.UserTagAccess}
			if len(dc.UserAllowList) > 0 {
				uta["user-allow-list"] = dc.UserAllowList
			}
			out["user-tag-access"] = uta
		}
		if len(dc.RegisteredTags) > 0 {
			out["registered-tags"] = dc.RegisteredTags
		}
	}
	allowed, _, _ := s.allowedTagsLocked(r.who)
	out["allowed-tags"] = sortedKeys(allowed)
	return out
}

// allowedTagsLocked is get_allowed_tags (pve-guest-common
// src/PVE/GuestHelpers.pm at 6.0.2).
func (s *Server) allowedTagsLocked(who *identity) (allowed, privileged map[string]bool, freeform bool) {
	dc := s.opts.Datacenter
	privUser := who.has("/", "Sys.Modify")
	allowed, privileged = map[string]bool{}, map[string]bool{}
	for _, t := range dc.RegisteredTags {
		privileged[t] = true
	}
	allow := dc.UserTagAccess
	if allow == "" {
		allow = "free"
	}
	freeform = allow == "free"
	if allow != "none" || privUser {
		for _, t := range dc.UserAllowList {
			allowed[t] = true
		}
	}
	if allow == "free" || allow == "existing" || privUser {
		for id, v := range s.vms {
			if !privUser && !who.has("/vms/"+strconv.Itoa(id), "VM.Audit") {
				continue
			}
			for _, t := range splitTags(v.conf["tags"]) {
				allowed[t] = true
			}
		}
	}
	if privUser {
		for t := range privileged {
			allowed[t] = true
		}
	} else {
		for t := range privileged {
			delete(allowed, t)
		}
	}
	return allowed, privileged, freeform
}

// tagPerms is assert_tag_permissions (pve-guest-common GuestHelpers.pm):
// each tag added or removed must be allowed, unless the user holds
// Sys.Modify on /.
func (s *Server) tagPerms(who *identity, oldTags, newTags string) *apiError {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tagPermsLocked(who, oldTags, newTags)
}

// tagPermsLocked is tagPerms with s.mu held.
func (s *Server) tagPermsLocked(who *identity, oldTags, newTags string) *apiError {
	if who.has("/", "Sys.Modify") {
		return nil
	}
	count := func(s string) map[string]int {
		m := map[string]int{}
		for _, t := range splitTags(s) {
			m[t]++
		}
		return m
	}
	old, neu := count(oldTags), count(newTags)
	var changed []string
	for t, n := range neu {
		if old[t] != n {
			changed = append(changed, t)
		}
	}
	for t, n := range old {
		if neu[t] != n {
			changed = append(changed, t)
		}
	}
	sort.Strings(changed)
	if len(changed) == 0 {
		return nil
	}
	allowed, privileged, freeform := s.allowedTagsLocked(who)
	for _, t := range changed {
		if (!allowed[t] && !freeform) || privileged[t] {
			return permErr("/, Sys.Modify for modifying tag '" + t + "'")
		}
	}
	return nil
}

// memoryLocked is the node's memory as GET /nodes/{node}/status reports it
// (pve-manager PVE/API2/Nodes.pm status; pve-common
// src/PVE/ProcFSTools.pm read_meminfo): since pve-common 8.3.1 (commit
// 219fe33) 'used' is total − MemAvailable and 'free' the kernel's raw
// MemFree, which leaves out the page cache; before it 'free' counted
// buffers and cache too (taken here as MemAvailable); pve-manager 9.0
// adds 'available' (MemAvailable). Each follows its package (pveCommon).
func (s *Server) memoryLocked() map[string]any {
	total := s.node.MemoryBytes
	used := s.usedMemoryLocked()
	available := total - used
	free := max(available-s.node.PageCacheBytes, 0)
	if !versionAtLeast(pveCommon(s.version), 8, 3, 1) {
		free = available
	}
	out := map[string]any{"total": total, "used": used, "free": free}
	if major, _ := s.versionLocked(); major >= 9 {
		out["available"] = available
	}
	return out
}

// zoneOf is the SDN zone a bridge or VNet belongs to: a VNet's own zone,
// localnetwork for a plain bridge (check_vnet_access in pve-guest-common
// GuestHelpers.pm).
func (s *Server) zoneOf(bridge string) string {
	for _, b := range s.bridges {
		if b.Name == bridge && b.Zone != "" {
			return b.Zone
		}
	}
	return "localnetwork"
}

// bridgeVisible is the network list's filter (pve-manager
// PVE/API2/Network.pm index, check_sdn_bridge in pve-access-control
// src/PVE/RPCEnvironment.pm): a bridge or VNet is listed only with
// SDN.Audit or SDN.Use on /sdn/zones/<zone>/<bridge> or on one of its VLANs.
func bridgeVisible(who *identity, zone, bridge string, aclVLANs []string) bool {
	if who.root {
		return true
	}
	path := "/sdn/zones/" + zone + "/" + bridge
	if who.has(path, "SDN.Audit") || who.has(path, "SDN.Use") {
		return true
	}
	for _, vlan := range aclVLANs {
		if who.has(path+"/"+vlan, "SDN.Audit") || who.has(path+"/"+vlan, "SDN.Use") {
			return true
		}
	}
	return false
}

// aclVLANs lists the VLAN children an identity's ACL names under a bridge.
func aclVLANs(who *identity, zone, bridge string) []string {
	prefix := "/sdn/zones/" + zone + "/" + bridge + "/"
	var out []string
	for _, acl := range [][]ACE{who.acl, who.userACL} {
		for _, ace := range acl {
			p := "/" + strings.Trim(ace.Path, "/")
			if rest, ok := strings.CutPrefix(p, prefix); ok && !strings.Contains(rest, "/") && !slices.Contains(out, rest) {
				out = append(out, rest)
			}
		}
	}
	return out
}

func guestEntry(g GuestSpec) map[string]any {
	e := map[string]any{
		"id": fmt.Sprintf("%s/%d", g.Type, g.VMID), "type": g.Type, "vmid": g.VMID,
		"node": g.Node, "status": g.Status, "template": 0,
	}
	if g.Name != "" {
		e["name"] = g.Name
	}
	if g.Tags != "" {
		e["tags"] = g.Tags
	}
	return e
}

// readVNet answers GET /cluster/sdn/vnets/{vnet} (pve-network
// src/PVE/API2/Network/SDN/Vnets.pm read): SDN.Audit or SDN.Allocate on
// /sdn/zones/<zone>/<vnet>.
func (s *Server) readVNet(r *request, name string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.bridges {
		if b.Name != name || b.Zone == "" {
			continue
		}
		if aerr := r.who.checkAny("/sdn/zones/"+b.Zone+"/"+b.Name, "SDN.Audit", "SDN.Allocate"); aerr != nil {
			return nil, aerr
		}
		return map[string]any{"vnet": b.Name, "zone": b.Zone, "type": "vnet", "vlanaware": boolInt(b.VLANAware)}, nil
	}
	return nil, errf(500, "sdn vnet '%s' does not exist", name)
}
