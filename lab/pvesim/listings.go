package pvesim

import (
	"cmp"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Listings and node reads: the node's VMs, /cluster/resources, /cluster/nextid, /nodes, node status, rrddata and the network index.

func (s *Server) listQemu(r *request) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []any{}
	for _, id := range s.vmIDsLocked() {
		if !r.who.has("/vms/"+strconv.Itoa(id), "VM.Audit") {
			continue
		}
		out = append(out, s.vmStatusLocked(s.vms[id]))
	}
	return out
}

func (s *Server) vmIDsLocked() []int {
	ids := make([]int, 0, len(s.vms))
	for id := range s.vms {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids
}

func (s *Server) clusterResources(r *request) (any, *apiError) {
	typ := r.param("type")
	// The filter's enum (pve-manager 9.2.11 and 8.4.21 PVE/API2/Cluster.pm
	// resources) has no 'pool', although pools are listed unfiltered.
	if typ != "" && typ != "vm" && typ != "storage" && typ != "node" && typ != "sdn" {
		return nil, paramErr(map[string]string{"type": "value '" + typ + "' does not have a value in the enumeration 'vm, storage, node, sdn'"})
	}
	out := s.ownResources(r, typ)
	if typ == "" || typ == "vm" {
		s.mu.Lock()
		for _, id := range sortedGuestIDs(s.guests) {
			if r.who.has("/vms/"+strconv.Itoa(id), "VM.Audit") {
				out = append(out, guestEntry(s.guests[id]))
			}
		}
		s.mu.Unlock()
	}
	for _, p := range s.peers() {
		out = append(out, p.ownResources(r, typ)...)
	}
	if s.cl != nil {
		sortResources(out)
	}
	return out, nil
}

// ownResources are this member's rows of /cluster/resources: its VMs, its
// node and its storages.
func (s *Server) ownResources(r *request, typ string) []any {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []any{}
	if typ == "" || typ == "vm" {
		for _, id := range s.vmIDsLocked() {
			if !r.who.has("/vms/"+strconv.Itoa(id), "VM.Audit") {
				continue
			}
			st := s.rrdViewLocked(s.vms[id], s.vmStatusLocked(s.vms[id]), time.Now())
			e := map[string]any{
				"id":     "qemu/" + strconv.Itoa(id),
				"type":   "qemu",
				"vmid":   id,
				"node":   s.node.Name,
				"status": st["status"],
			}
			if _, broadcast := st["maxmem"]; broadcast {
				for k, from := range map[string]string{"maxmem": "maxmem", "maxcpu": "cpus", "maxdisk": "maxdisk", "mem": "mem", "cpu": "cpu", "uptime": "uptime"} {
					e[k] = st[from]
				}
				e["template"], e["disk"], e["diskread"], e["diskwrite"], e["netin"], e["netout"] = 0, 0, 0, 0, 0, 0
			}
			for _, k := range []string{"name", "tags", "lock"} {
				if val, ok := st[k]; ok {
					e[k] = val
				}
			}
			// The HA state of a managed guest (pve-manager 9.2.11
			// PVE/API2/Cluster.pm resources, "get ha status").
			if state, ok := s.ha[id]; ok {
				e["hastate"] = state
			}
			out = append(out, e)
		}
	}
	if typ == "" || typ == "node" {
		e := s.nodeEntryLocked()
		// Without Sys.Audit on /nodes/<node> the row keeps only its
		// identity, status and level (extract_node_stats with
		// $exclude_stats, pve-manager 9.2.11 PVE/API2Tools.pm).
		if !r.who.has("/nodes/"+s.node.Name, "Sys.Audit") {
			for _, k := range []string{"uptime", "cpu", "mem", "disk", "maxcpu", "maxmem", "maxdisk"} {
				delete(e, k)
			}
		}
		out = append(out, e)
	}
	if typ == "" || typ == "storage" {
		for _, st := range s.storages {
			// Datastore.Audit only (pve-manager 9.2.11 PVE/API2/Cluster.pm
			// resources), one row per member the storage is enabled on:
			// a disabled storage has none (storage_check_enabled).
			if !r.who.has("/storage/"+st.spec.Name, "Datastore.Audit") || st.spec.Disabled {
				continue
			}
			status := "available"
			content := append([]string(nil), st.spec.Content...)
			sort.Strings(content)
			out = append(out, map[string]any{
				"id": "storage/" + s.node.Name + "/" + st.spec.Name, "type": "storage", "storage": st.spec.Name,
				"node": s.node.Name, "status": status, "plugintype": st.spec.Type, "content": strings.Join(content, ","),
				"disk": st.used, "maxdisk": st.spec.TotalBytes, "shared": boolInt(st.spec.Shared),
			})
		}
	}
	return out
}

func (s *Server) nextID(r *request) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if want := r.param("vmid"); want != "" {
		id, aerr := parseVMID(want)
		if aerr != nil {
			return nil, aerr
		}
		if kind, _ := s.guestTypeLocked(id); kind != "" {
			return nil, paramErr(map[string]string{"vmid": fmt.Sprintf("VM %d already exists", id)})
		}
		return strconv.Itoa(id), nil
	}
	for id := 100; ; id++ {
		if kind, _ := s.guestTypeLocked(id); kind == "" {
			return strconv.Itoa(id), nil
		}
	}
}

func (s *Server) nodeEntryLocked() map[string]any {
	status := "online"
	if !s.nodeOnline {
		status = "offline"
	}
	return map[string]any{
		"id": "node/" + s.node.Name, "type": "node", "node": s.node.Name, "status": status,
		"cpu": 0.03, "maxcpu": s.node.CPUs, "mem": s.usedMemoryLocked(), "maxmem": s.node.MemoryBytes,
		"disk": 9 * gib, "maxdisk": 94 * gib, "uptime": int64(time.Since(s.bootTime).Seconds()), "level": "",
		"ssl_fingerprint": s.certs.fingerprint,
	}
}

func (s *Server) listNodes() any {
	s.mu.Lock()
	out := []any{s.nodeEntryLocked()}
	for _, n := range s.otherNodesLocked() {
		out = append(out, otherNodeEntry(n))
	}
	s.mu.Unlock()
	return append(out, s.memberEntries()...)
}

func (s *Server) nodeStatus(r *request) (any, *apiError) {
	if aerr := r.who.check("/nodes/"+s.node.Name, "Sys.Audit"); aerr != nil {
		return nil, aerr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return map[string]any{
		"cpu":    0.03,
		"wait":   0.0001,
		"uptime": int64(time.Since(s.bootTime).Seconds()),
		"memory": s.memoryLocked(),
		"swap":   map[string]any{"total": swapBytes, "used": 0, "free": swapBytes},
		"rootfs": map[string]any{"total": 94 * gib, "used": 9 * gib, "free": 85 * gib, "avail": 80 * gib},
		"cpuinfo": map[string]any{
			"cpus": s.node.CPUs, "cores": s.node.CPUs, "sockets": 1, "model": s.node.CPUModel,
			"mhz": "806.000", "hvm": "1", "user_hz": 100, "flags": "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr vmx",
		},
		"loadavg":  []string{"0.12", "0.08", "0.05"},
		"kversion": "Linux 6.8.12-1-pve #1 SMP PREEMPT_DYNAMIC PMX 6.8.12-1 (2024-08-05T16:17Z)",
		// uname's fields (pve-manager 9.2.11 PVE/API2/Nodes.pm status,
		// get_current_kernel_info); required by the returns schema of
		// every published release.
		"current-kernel": map[string]any{"sysname": "Linux", "release": "6.8.12-1-pve",
			"version": "#1 SMP PREEMPT_DYNAMIC PMX 6.8.12-1 (2024-08-05T16:17Z)", "machine": "x86_64"},
		"pveversion": "pve-manager/" + s.version + "/" + s.repoid,
		"ksm":        map[string]any{"shared": 0},
		"boot-info":  map[string]any{"mode": "efi", "secureboot": 0},
	}, nil
}

// rrdData answers GET /nodes/{node}/rrddata (pve-manager 9.2.11
// PVE/API2/Nodes.pm rrddata: Sys.Audit on /nodes/{node}; pve-cluster 9.1.6
// src/PVE/RRD.pm create_rrd_data): one row per step, oldest first, each
// with its 'time'; a value the RRD has not consolidated yet (the current
// step) is left out of its row. PVE 9 reads the pve-node-9.0 schema, which
// pvestatd fills with memavailable and the ZFS ARC's arcsize (pve-manager
// PVE/Service/pvestatd.pm update_node_status); PVE 8 reads pve2-node,
// which has neither (pve-manager 8.4.21 Nodes.pm rrddata).
func (s *Server) rrdData(r *request) (any, *apiError) {
	if aerr := r.who.check("/nodes/"+s.node.Name, "Sys.Audit"); aerr != nil {
		return nil, aerr
	}
	steps := map[string]int64{"hour": 60, "day": 60, "week": 1800, "month": 1800, "year": 21600, "decade": 604800}
	tf := r.param("timeframe")
	step, ok := steps[tf]
	if !ok {
		return nil, paramErr(map[string]string{"timeframe": "value '" + tf + "' does not have a value in the enumeration 'hour, day, week, month, year, decade'"})
	}
	if cf := r.param("cf"); cf != "" && cf != "AVERAGE" && cf != "MAX" {
		return nil, paramErr(map[string]string{"cf": "value '" + cf + "' does not have a value in the enumeration 'AVERAGE, MAX'"})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	major, _ := s.versionLocked()
	total, used := s.node.MemoryBytes, s.usedMemoryLocked()
	now := step * (time.Now().Unix() / step)
	const rows = 60
	out := make([]map[string]any, 0, rows)
	for i := int64(rows - 1); i >= 0; i-- {
		row := map[string]any{"time": now - i*step}
		if i > 0 {
			row["memtotal"], row["memused"] = float64(total), float64(used)
			row["swaptotal"], row["swapused"] = float64(swapBytes), 0.0
			row["maxcpu"], row["cpu"] = float64(s.node.CPUs), 0.03
			if major >= 9 {
				row["memavailable"], row["arcsize"] = float64(total-used), float64(s.node.ARCBytes)
			}
		}
		out = append(out, row)
	}
	return out, nil
}

// listNetwork answers GET /nodes/{node}/network. Bridges (and, for
// any_bridge, SDN VNets) the identity may neither audit nor use on their
// zone are left out (bridgeVisible), without an error.
func (s *Server) listNetwork(r *request) any {
	typ := r.param("type")
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []any{}
	if typ != "" && typ != "bridge" && typ != "any_bridge" && typ != "vnet" && typ != "OVSBridge" {
		return out
	}
	for i, b := range s.bridges {
		zone := s.zoneOf(b.Name)
		if !bridgeVisible(r.who, zone, b.Name, aclVLANs(r.who, zone, b.Name)) {
			continue
		}
		if b.OVS {
			// Type OVSBridge, matched by any_bridge and OVSBridge
			// (pve-manager 9.2.11 PVE/API2/Network.pm index:
			// "$type eq 'bridge' || $type eq 'OVSBridge'"); no
			// bridge_vlan_aware key (pve-common
			// src/PVE/Network/Interfaces.pm writes it for Linux
			// bridges only).
			if typ != "" && typ != "any_bridge" && typ != "OVSBridge" {
				continue
			}
			out = append(out, map[string]any{
				"iface": b.Name, "type": "OVSBridge", "active": 1, "autostart": 1, "method": "manual", "method6": "manual",
				"ovs_type": "OVSBridge", "ovs_ports": b.Ports, "families": []string{"inet"}, "priority": i + 3,
			})
			continue
		}
		if typ == "OVSBridge" {
			continue
		}
		if b.Zone != "" {
			if typ == "bridge" {
				continue
			}
			e := map[string]any{"iface": b.Name, "type": "vnet", "active": "1", "ipam": 0, "vlanaware": boolInt(b.VLANAware)}
			out = append(out, e)
			continue
		}
		if typ == "vnet" {
			continue
		}
		e := map[string]any{
			"iface": b.Name, "type": "bridge", "active": 1, "autostart": 1, "method": "manual", "method6": "manual",
			"bridge_ports": b.Ports, "bridge_stp": "off", "bridge_fd": "0", "families": []string{"inet"}, "priority": i + 3,
		}
		if b.VLANAware {
			e["bridge_vlan_aware"] = 1
			e["bridge_vids"] = cmp.Or(b.VIDs, "2-4094")
		}
		if b.CIDR != "" {
			addr, bits, _ := strings.Cut(b.CIDR, "/")
			e["cidr"], e["address"], e["netmask"], e["method"] = b.CIDR, addr, bits, "static"
		}
		if b.Gateway != "" {
			e["gateway"] = b.Gateway
		}
		if b.MTU != 0 {
			e["mtu"] = b.MTU
		}
		out = append(out, e)
	}
	return out
}

func sortedGuestIDs(m map[int]GuestSpec) []int {
	ids := make([]int, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids
}
