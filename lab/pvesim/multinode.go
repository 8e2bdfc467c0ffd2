package pvesim

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A cluster of several simulated nodes. Each member is a full Server with
// its own listener, memory, storages, bridges and VMs; what PVE keeps
// cluster-wide is shared:
//
//   - The VMID space: pmxcfs keeps one vmlist for the cluster, so a VMID
//     held on any node is taken everywhere (pve-cluster
//     src/PVE/Cluster.pm check_vmid_unused, as for seeded guests).
//   - Calls for another member: the methods below /nodes/{node} that
//     pvesim serves are declared proxyto => 'node' (qemu-server 9.2.6
//     src/PVE/API2/Qemu.pm, pve-manager PVE/API2/Nodes.pm; the schema's
//     "proxyto") and pveproxy forwards them there, so any member's
//     endpoint answers for all of them. GET /nodes/{node}/rrddata has no
//     proxyto: the receiving member answers from its copy of the
//     broadcast RRD, which holds the same data; pvesim forwards it too.
//   - /nodes and /cluster/resources list every member and every member's
//     guests and storages (pve-manager PVE/API2/Cluster.pm resources reads
//     the cluster-wide vmlist and each node's status broadcast).
//
// Storage contents are per member even for a storage marked shared: an
// ISO downloaded through one member is not seen by another (real shared
// storage would show it; docs/lab.md lists this difference). Certificates
// are per member with a CA of their own (PVE signs every node's with the
// one cluster CA). HA resources stay with the member that was asked.

// clusterState is what the members share. Its mutex is a leaf: it is taken
// with or without a member's s.mu held and never takes another lock.
type clusterState struct {
	members []*Server // in the order given to NewCluster; set once

	mu    sync.Mutex
	owner map[int]string // VMID → member holding it
	// noQuorum: corosync lost its majority, so pmxcfs turned /etc/pve
	// read-only (SetQuorate).
	noQuorum bool
}

// NewCluster starts one simulator per node, joined as one Proxmox VE
// cluster: the same tokens, users, datacenter options, profile and hooks,
// each member with its own NodeSpec (opts.Node is ignored), storages and
// bridges from opts unless perNode gives its own (by node name).
func NewCluster(opts Options, nodes []NodeSpec, perNode map[string]Options) ([]*Server, error) {
	if len(nodes) == 0 {
		return nil, fmt.Errorf("pvesim: a cluster needs at least one node")
	}
	opts = withDefaults(opts)
	cl := &clusterState{owner: map[int]string{}}
	rules := newHARules()
	var out []*Server
	fail := func(err error) ([]*Server, error) {
		for _, s := range out {
			_ = s.Close()
		}
		return nil, err
	}
	for _, n := range nodes {
		o := opts
		o.Node = n
		o.Guests = nil
		if p, ok := perNode[n.Name]; ok {
			if p.Storages != nil {
				o.Storages = p.Storages
			}
			if p.Bridges != nil {
				o.Bridges = p.Bridges
			}
			if p.ISOs != nil {
				o.ISOs = p.ISOs
			}
		}
		s, err := New(o)
		if err != nil {
			return fail(fmt.Errorf("pvesim: starting node %s: %w", n.Name, err))
		}
		s.cl = cl
		s.haRules = rules // rules.cfg is the cluster's (/etc/pve/ha)
		out = append(out, s)
	}
	cl.members = out
	// Seeded guests live on the first member, the one tests talk to.
	for _, g := range opts.Guests {
		out[0].SeedGuest(g)
	}
	return out, nil
}

// peer is the cluster member named name, nil when there is none.
func (s *Server) peer(name string) *Server {
	if s.cl == nil {
		return nil
	}
	for _, m := range s.cl.members {
		if m.node.Name == name {
			return m
		}
	}
	return nil
}

// peers are the other members, in cluster order.
func (s *Server) peers() []*Server {
	if s.cl == nil {
		return nil
	}
	var out []*Server
	for _, m := range s.cl.members {
		if m != s {
			out = append(out, m)
		}
	}
	return out
}

// claimLocked records that this member holds vmid; s.mu is held.
func (s *Server) claimLocked(vmid int) {
	if s.cl == nil {
		return
	}
	s.cl.mu.Lock()
	s.cl.owner[vmid] = s.node.Name
	s.cl.mu.Unlock()
}

// releaseLocked forgets this member's hold on vmid; s.mu is held.
func (s *Server) releaseLocked(vmid int) {
	if s.cl == nil {
		return
	}
	s.cl.mu.Lock()
	if s.cl.owner[vmid] == s.node.Name {
		delete(s.cl.owner, vmid)
	}
	s.cl.mu.Unlock()
}

// memberHolding names the other member holding vmid, "" when none does.
func (s *Server) memberHolding(vmid int) string {
	if s.cl == nil {
		return ""
	}
	s.cl.mu.Lock()
	defer s.cl.mu.Unlock()
	if n := s.cl.owner[vmid]; n != s.node.Name {
		return n
	}
	return ""
}

// VMNode names the member that runs vmid ("" when no member does).
func (s *Server) VMNode(vmid int) string {
	if s.cl == nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.vms[vmid]; ok {
			return s.node.Name
		}
		return ""
	}
	s.cl.mu.Lock()
	defer s.cl.mu.Unlock()
	return s.cl.owner[vmid]
}

// MemberOf is the cluster member that runs vmid; s itself when it is
// alone or no member holds vmid.
func (s *Server) MemberOf(vmid int) *Server {
	if m := s.peer(s.VMNode(vmid)); m != nil {
		return m
	}
	return s
}

// migrateVM answers POST /nodes/{node}/qemu/{vmid}/migrate (qemu-server
// 9.2.6 src/PVE/API2/Qemu.pm migrate_vm and src/PVE/QemuMigrate.pm
// prepare/phase1): VM.Migrate on the VM; the target must be another
// member; a running VM needs online=1; every volume's storage must be
// enabled on the target (QemuServer.pm check_storage_availability →
// pve-storage 9.1.7 src/PVE/Storage.pm storage_check_node); a cdrom
// holding an image on storage that is not shared blocks the migration
// ("local cdrom image", then "can't migrate VM - check log"), as does a
// running VM's local disk without with-local-disks. The task moves the
// config and the local volumes; a running VM keeps running (its guest
// does not notice; onStart/onStop are not called). HA-managed VMs
// ('hamigrate') and replication are not modelled.
func (s *Server) migrateVM(r *request, idStr string) (any, *apiError) {
	id, aerr := parseVMID(idStr)
	if aerr != nil {
		return nil, aerr
	}
	if aerr := r.who.check("/vms/"+strconv.Itoa(id), "VM.Migrate"); aerr != nil {
		return nil, aerr
	}
	target := r.param("target")
	if target == "" {
		return nil, paramErr(map[string]string{"target": "property is missing and it is not optional"})
	}
	if target == s.node.Name {
		return nil, paramErr(map[string]string{"target": "target is local node."})
	}
	if aerr := s.quorumErr(); aerr != nil {
		return nil, aerr
	}
	dst := s.peer(target)
	if dst == nil {
		return nil, errf(500, "no such cluster node '%s'", target)
	}
	v, _, aerr := s.vmByID(id)
	if aerr != nil {
		return nil, aerr
	}
	s.mu.Lock()
	lock := v.conf["lock"]
	running := v.state != "stopped"
	conf := maps.Clone(v.conf)
	s.mu.Unlock()
	if lock != "" {
		return nil, errf(500, "VM is locked (%s)", lock)
	}
	online := r.param("online") == "1"
	if running && !online {
		return nil, errf(500, "can't migrate running VM without --online")
	}
	vols := storageVolumes(conf)
	for _, v := range vols {
		if dst.storageSpec(v.storage) == nil {
			return nil, errf(500, "storage '%s' is not available on node '%s'", v.storage, target)
		}
	}
	localDisks := r.param("with-local-disks") == "1"
	return s.startTask(r, "qmigrate", strconv.Itoa(id), func(ctx context.Context, t *task) error {
		t.logf("starting migration of VM %d to node '%s'", id, target)
		var problems []string
		for _, v := range vols {
			d := v.drive
			spec := s.storageSpec(v.storage)
			if spec == nil || spec.Shared {
				continue
			}
			switch {
			case d.isCDROM() && !d.isCloudInit():
				problems = append(problems, fmt.Sprintf("can't migrate local disk '%s': local cdrom image", d.file))
			case running && !d.isCDROM() && !localDisks:
				problems = append(problems, fmt.Sprintf("can't migrate local disk '%s': can't live migrate attached local disks without with-local-disks option", d.file))
			}
		}
		for _, p := range problems {
			t.logf("%s", p)
		}
		if len(problems) > 0 {
			return fmt.Errorf("can't migrate VM - check log")
		}
		if err := s.pause(ctx, s.opts.Profile.Start); err != nil {
			return err
		}
		return s.moveVM(id, dst)
	}), nil
}

// storageVolume is a drive of a VM config that names a storage.
type storageVolume struct {
	drive   drive
	storage string
}

// storageVolumes lists conf's drives on a storage ("local:iso/x.iso",
// "local-lvm:vm-701-disk-0"), in option order.
func storageVolumes(conf map[string]string) []storageVolume {
	var out []storageVolume
	for _, k := range sortedKeys(conf) {
		if !isDriveKey(k) {
			continue
		}
		d, _ := parseDrive(conf[k])
		if st, _, ok := strings.Cut(d.file, ":"); ok {
			out = append(out, storageVolume{drive: d, storage: st})
		}
	}
	return out
}

// Migrate moves a VM to another member as a migration by the user or by
// HA would (see migrateVM for what blocks one); it returns when the VM
// runs on target.
func (s *Server) Migrate(ctx context.Context, vmid int, target string) error {
	src := s.peer(s.VMNode(vmid))
	if src == nil {
		return fmt.Errorf("VM %d is on no member of this cluster", vmid)
	}
	r := &request{method: "POST", params: map[string][]string{"target": {target}, "online": {"1"}, "with-local-disks": {"1"}}, who: rootIdentity()}
	data, aerr := src.migrateVM(r, strconv.Itoa(vmid))
	if aerr != nil {
		return aerr
	}
	upid, _ := data.(string)
	for {
		st, ok := src.taskExit(upid)
		if ok {
			if st != "OK" {
				return fmt.Errorf("migrating VM %d to %s: %s", vmid, target, st)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// moveVM hands VM id with its local volumes to dst. The VMID stays held by
// this member until dst holds it, so no create can take it in between.
func (s *Server) moveVM(id int, dst *Server) error {
	s.mu.Lock()
	v, ok := s.vms[id]
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", s.node.Name, id)
	}
	type moved struct {
		storage string
		name    string
		vol     *volume
	}
	var vols []moved
	for _, st := range s.storages {
		if st.spec.Shared {
			continue
		}
		for name, vol := range st.vols {
			if vol.vmid == id {
				vols = append(vols, moved{st.spec.Name, name, vol})
				st.used -= vol.alloc
				delete(st.vols, name)
			}
		}
	}
	delete(s.vms, id)
	reserved := v.reserved
	haState, ha := s.ha[id]
	delete(s.ha, id)
	s.mu.Unlock()

	dst.mu.Lock()
	for _, m := range vols {
		if st := dst.storageByName(m.storage); st != nil {
			st.vols[m.name] = m.vol
			st.used += m.vol.alloc
		}
	}
	v.reserved = reserved
	if ha {
		dst.ha[id] = haState
	}
	dst.vms[id] = v
	dst.claimLocked(id)
	dst.mu.Unlock()
	return nil
}

// storageSpec is this member's storage named name, nil when it has none.
func (s *Server) storageSpec(name string) *StorageSpec {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.storageByName(name); st != nil {
		spec := st.spec
		return &spec
	}
	return nil
}

// memberEntries are the other members' rows of GET /nodes.
func (s *Server) memberEntries() []any {
	var out []any
	for _, p := range s.peers() {
		p.mu.Lock()
		out = append(out, p.nodeEntryLocked())
		p.mu.Unlock()
	}
	return out
}

// sortResources orders /cluster/resources rows as one listing would read:
// VMs by VMID, then nodes and storages by id.
func sortResources(rows []any) {
	key := func(e any) (int, string, int) {
		m, _ := e.(map[string]any)
		typ, _ := m["type"].(string)
		id, _ := m["id"].(string)
		vmid, _ := m["vmid"].(int)
		rank := 2
		switch typ {
		case "qemu", "lxc":
			rank = 0
		case "node":
			rank = 1
		}
		return rank, id, vmid
	}
	sort.SliceStable(rows, func(i, j int) bool {
		ri, idi, vi := key(rows[i])
		rj, idj, vj := key(rows[j])
		if ri != rj {
			return ri < rj
		}
		if ri == 0 {
			return vi < vj
		}
		return idi < idj
	})
}

// rootIdentity is root@pam, for the moves a test makes as the administrator.
func rootIdentity() *identity { return &identity{user: "root@pam", root: true} }

// taskExit reports a task's exit status once it ended.
func (s *Server) taskExit(upid string) (string, bool) {
	s.mu.Lock()
	t := s.tasks[upid]
	s.mu.Unlock()
	if t == nil {
		return "no such task", true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.exit, t.done
}

// SetQuorate sets whether the cluster has quorum. Without it pmxcfs makes
// /etc/pve read-only and every API call that writes a guest config dies
// in check_cfs_quorum with "cluster not ready - no quorum?" (pve-cluster
// 9.1.6 src/PVE/Cluster.pm; called by qemu-server 9.2.6 create_vm,
// vm_start and migrate_vm before they fork their task); GET
// /cluster/status reports quorate 0. Only a cluster (NewCluster) can lose
// quorum: a standalone node always has it, and asking for that is an error.
func (s *Server) SetQuorate(quorate bool) error {
	if s.cl == nil {
		return fmt.Errorf("pvesim: node %s is standalone: it has no quorum to lose", s.node.Name)
	}
	s.cl.mu.Lock()
	s.cl.noQuorum = !quorate
	s.cl.mu.Unlock()
	return nil
}

// quorumErr is check_cfs_quorum's error, nil with quorum.
func (s *Server) quorumErr() *apiError {
	if s.cl == nil {
		return nil
	}
	s.cl.mu.Lock()
	lost := s.cl.noQuorum
	s.cl.mu.Unlock()
	if lost {
		return errf(500, "cluster not ready - no quorum?")
	}
	return nil
}

// clusterStatus answers GET /cluster/status (pve-manager 9.2.11
// PVE/API2/Cluster.pm get_status): Sys.Audit on /; in a cluster one
// "cluster" row (nodes, version, name, quorate) and a row per member
// (nodeid, local, online, ip, level); a standalone node gets only its own
// row, with nodeid 0.
func (s *Server) clusterStatus(r *request) (any, *apiError) {
	if aerr := r.who.check("/", "Sys.Audit"); aerr != nil {
		return nil, aerr
	}
	node := func(m *Server, id int) map[string]any {
		m.mu.Lock()
		online := m.nodeOnline
		m.mu.Unlock()
		return map[string]any{"type": "node", "id": "node/" + m.node.Name, "name": m.node.Name, "nodeid": id,
			"local": boolInt(m == s), "online": boolInt(online), "ip": "127.0.0.1", "level": ""}
	}
	if s.cl == nil {
		return []any{node(s, 0)}, nil
	}
	s.cl.mu.Lock()
	quorate := !s.cl.noQuorum
	s.cl.mu.Unlock()
	out := []any{map[string]any{"type": "cluster", "id": "cluster", "name": "homelab", "nodes": len(s.cl.members), "version": len(s.cl.members), "quorate": boolInt(quorate)}}
	for i, m := range s.cl.members {
		out = append(out, node(m, i+1))
	}
	return out, nil
}
