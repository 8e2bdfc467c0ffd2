package pvesim

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// HA-managed VMs (pve-ha-manager 5.2.0 and qemu-server 9.2.6; the same
// paths in 8.4.10). A VM listed in the HA resources is started and stopped
// by the HA stack: a stop request only queues a CRM command, and a destroy
// without purge is refused; one that went down by itself is started
// again (control.go haRestart); a start request only sets the requested
// state, and the LRM starts the VM a CRM round later (haStart). HA groups
// and relocation are not modelled; rules are in harules.go.

// SetHAManaged adds a VM to the HA resources (ha-manager add vm:<id>) with
// its requested state "started", or removes it.
func (s *Server) SetHAManaged(vmid int, managed bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.vms[vmid]; !ok {
		return fmt.Errorf("VM %d does not exist", vmid)
	}
	if managed {
		s.ha[vmid] = "started"
	} else {
		delete(s.ha, vmid)
	}
	return nil
}

// HAManaged reports whether vmid is an HA resource.
func (s *Server) HAManaged(vmid int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ha[vmid]
	return ok
}

// haSIDVMID parses "vm:100" or "100" (pve-ha-resource-or-vm-id).
func haSIDVMID(sid string) (int, bool) {
	id, err := strconv.Atoi(strings.TrimPrefix(sid, "vm:"))
	return id, err == nil
}

// The HA state of a VM is kept by the member that runs it (MemberOf):
// pvesim keeps PVE's cluster-wide resources config per member, where the
// VM's vmstatus reads it.

// haCreate answers POST /cluster/ha/resources (pve-ha-manager 5.2.0
// src/PVE/API2/HA/Resources.pm create): Sys.Console on /; the sid is
// "vm:<id>" or a bare VMID of an existing guest (Config.pm parse_sid);
// the VM must exist in the cluster (Resources/PVEVM.pm exists); a
// resource defined twice fails inside the HA domain lock ("create
// resource failed: ..."). The requested state defaults to started.
// Without quorum it fails as create_vm does ("cluster not ready - no
// quorum?").
func (s *Server) haCreate(r *request) (any, *apiError) {
	if aerr := r.who.check("/", "Sys.Console"); aerr != nil {
		return nil, aerr
	}
	// check_cfs_quorum comes first in the code (pve-ha-manager 5.2.0
	// src/PVE/API2/HA/Resources.pm create).
	if aerr := s.quorumErr(); aerr != nil {
		return nil, aerr
	}
	sid := r.param("sid")
	if sid == "" {
		return nil, paramErr(map[string]string{"sid": "property is missing and it is not optional"})
	}
	id, ok := haSIDVMID(sid)
	bare := !strings.Contains(sid, ":")
	if !ok {
		return nil, errf(500, "unable to parse service id '%s'", sid)
	}
	state := r.param("state")
	if state == "" {
		state = "started"
	}
	s.mu.Lock()
	kind, _ := s.guestTypeLocked(id)
	s.mu.Unlock()
	switch {
	case kind == "" && bare:
		return nil, errf(500, "unable to detect SID from VMID - VM/CT %d does not exist", id)
	case kind == "":
		return nil, errf(500, "resource 'vm:%d' does not exist in cluster", id)
	case kind == "CT":
		return nil, errf(500, "resource 'vm:%d' - guest with ID %d is not a VM", id, id)
	}
	m := s.MemberOf(id)
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, dup := m.ha[id]; dup {
		return nil, errf(500, "create resource failed: resource ID 'vm:%d' already defined", id)
	}
	m.ha[id] = state
	return nil, nil
}

// haRead answers GET /cluster/ha/resources/{sid} (pve-ha-manager
// src/PVE/API2/HA/Resources.pm read).
func (s *Server) haRead(r *request, sid string) (any, *apiError) {
	// Sys.Audit on / (pve-ha-manager 5.2.0 src/PVE/API2/HA/Resources.pm
	// read; the schema's declared check).
	if aerr := r.who.check("/", "Sys.Audit"); aerr != nil {
		return nil, aerr
	}
	id, ok := haSIDVMID(sid)
	s = s.MemberOf(id)
	s.mu.Lock()
	state, managed := s.ha[id]
	s.mu.Unlock()
	if !ok || !managed {
		return nil, errf(500, "no such resource '%s'", haSID(sid))
	}
	return map[string]any{"sid": haSID(sid), "type": "vm", "state": state, "digest": randHex(20)}, nil
}

// haDelete answers DELETE /cluster/ha/resources/{sid} (Resources.pm
// delete): Sys.Console on /, synchronous, and refused for a VM HA does not
// manage.
func (s *Server) haDelete(r *request, sid string) (any, *apiError) {
	if aerr := r.who.check("/", "Sys.Console"); aerr != nil {
		return nil, aerr
	}
	id, ok := haSIDVMID(sid)
	s = s.MemberOf(id)
	s.mu.Lock()
	if _, managed := s.ha[id]; !ok || !managed {
		s.mu.Unlock()
		return nil, errf(500, "cannot delete service '%s', not HA managed!", haSID(sid))
	}
	delete(s.ha, id)
	major, minor := s.versionLocked()
	s.mu.Unlock()
	if (major > 9 || major == 9 && minor >= 1) && r.param("purge") != "0" {
		s.purgeFromRules(haSID(sid))
	}
	return nil, nil
}

// haStatusLocked is vmstatus' "ha" field.
func (s *Server) haStatusLocked(vmid int) map[string]any {
	state, ok := s.ha[vmid]
	if !ok {
		return map[string]any{"managed": 0}
	}
	return map[string]any{"managed": 1, "state": state}
}

// haStop is the stop of an HA-managed VM (qemu-server 9.2.6
// src/PVE/API2/Qemu.pm vm_stop): a 'hastop' task that only runs
// `ha-manager crm-command stop vm:<id> 0` and ends at once. The CRM then
// sets the requested state to stopped and the node's LRM stops the VM,
// Profile.HAStop later.
func (s *Server) haStop(r *request, v *vm) string {
	id := v.id
	return s.startTask(r, "hastop", strconv.Itoa(id), func(ctx context.Context, t *task) error {
		t.logf("Requesting HA stop for VM %d", id)
		s.afterCRMRound(func() {
			s.mu.Lock()
			if _, ok := s.ha[id]; ok {
				s.ha[id] = "stopped"
			}
			s.mu.Unlock()
			lrm := &task{node: s.node.Name, typ: "qmstop", id: strconv.Itoa(id)}
			_ = s.stopWork(s.ctx, lrm, v, false, 0)
		})
		return nil
	})
}

// haStart is the start of an HA-managed VM (qemu-server 9.2.6
// src/PVE/API2/Qemu.pm vm_start, line 3631: when vm_is_ha_managed and the
// request is not the HA stack's own): a 'hastart' task that only runs
// `ha-manager set vm:<id> --state started` ("Requesting HA start for VM
// <id>") and ends at once. The requested state is "started" from then;
// the node's LRM starts the VM on the CRM's next round (Profile.HAStop,
// the same round as a stop). A VM that already runs stays as it is.
func (s *Server) haStart(r *request, v *vm) string {
	id := v.id
	return s.startTask(r, "hastart", strconv.Itoa(id), func(ctx context.Context, t *task) error {
		t.logf("Requesting HA start for VM %d", id)
		s.mu.Lock()
		if _, ok := s.ha[id]; ok {
			s.ha[id] = "started"
		}
		s.mu.Unlock()
		s.afterCRMRound(func() {
			s.mu.Lock()
			running := v.state != "stopped"
			s.mu.Unlock()
			if running {
				return
			}
			lrm := &task{node: s.node.Name, typ: "qmstart", id: strconv.Itoa(id)}
			if err := s.flock(s.ctx, v, s.lockTimeout()); err != nil {
				return
			}
			defer funlock(v)
			_ = s.startWork(s.ctx, lrm, v, false)
		})
		return nil
	})
}

// afterCRMRound runs what the HA stack does on its next round
// (Profile.HAStop from now), unless the server closes first.
func (s *Server) afterCRMRound(fn func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.pause(s.ctx, s.opts.Profile.HAStop); err != nil {
			return
		}
		fn()
	}()
}
