package pvesim

import (
	"context"
	"fmt"
	"slices"
	"strconv"
)

// The destroy of a VM (DELETE /nodes/{node}/qemu/{vmid}).

func (s *Server) deleteVM(r *request, idStr string) (any, *apiError) {
	v, id, aerr := s.vmAllowed(r, idStr, "VM.Allocate")
	if aerr != nil {
		return nil, aerr
	}
	skiplock := r.param("skiplock") == "1"
	if skiplock && !r.who.root {
		return nil, paramErr(map[string]string{"skiplock": "Only root may use this option."})
	}
	purge := r.param("purge") == "1"
	unreferenced := r.param("destroy-unreferenced-disks") == "1"
	s.mu.Lock()
	_, ha := s.ha[id]
	s.mu.Unlock()
	// destroy_vm's early checks (qemu-server 9.2.6 src/PVE/API2/Qemu.pm):
	// an HA resource needs purge, which removes it from HA after the
	// disks.
	if ha && !purge {
		return nil, errf(500, "unable to remove VM %d - used in HA resources and purge parameter not set.", id)
	}
	// The early checks (protection, HA, running) answer the request; the
	// lock is checked only inside the task, by destroy_vm
	// (src/PVE/QemuServer.pm), so a locked VM's DELETE answers a UPID
	// whose task fails "VM is locked (<lock>)".
	check := func(inTask bool) error {
		if p := v.conf["protection"]; p == "1" {
			return fmt.Errorf("can't remove VM %d - protection mode enabled", id)
		}
		if v.state != "stopped" {
			return fmt.Errorf("VM %d is running - destroy failed", id)
		}
		if lock := v.conf["lock"]; inTask && lock != "" && !skiplock {
			return fmt.Errorf("VM is locked (%s)", lock)
		}
		return nil
	}
	s.mu.Lock()
	err := check(false)
	s.mu.Unlock()
	if err != nil {
		return nil, errf(500, "%s", err.Error())
	}
	return s.startTask(r, "qmdestroy", strconv.Itoa(id), func(ctx context.Context, t *task) error {
		if err := s.flock(ctx, v, s.lockTimeout()); err != nil {
			return err
		}
		defer funlock(v)
		if err := t.injected(); err != nil {
			return err
		}
		s.mu.Lock()
		err := check(true)
		s.mu.Unlock()
		if err != nil {
			return err
		}
		if err := s.pause(ctx, s.opts.Profile.Delete); err != nil {
			return err
		}
		// Only the volumes the VM owns are freed, unused ones included
		// (destroy_vm's remove_owned_drive in src/PVE/QemuServer.pm of
		// qemu-server master): a VM created again later gets new, empty
		// disks, which the OnDestroy listeners learn from the event.
		s.mu.Lock()
		ev := s.eventLocked(v)
		for k, val := range v.conf {
			if !isDriveKey(k) && !unusedRE.MatchString(k) {
				continue
			}
			d, err := parseDrive(val)
			if err != nil || d.file == "none" {
				continue
			}
			if _, vol := s.volumeLocked(d.file); vol != nil && vol.vmid == id {
				s.freeLocked(d.file)
			}
		}
		// destroy-unreferenced-disks then lists the VM's volumes on every
		// enabled storage with images content (qemu-server 9.2.6
		// destroy_vm, vdisk_list): an offline one fails the task here,
		// its referenced disks already gone and its config left
		// (disabled storages are skipped).
		if unreferenced {
			for _, st := range s.storages {
				if st.spec.Disabled || !st.hasContent("images") {
					continue
				}
				if st.spec.Offline {
					s.mu.Unlock()
					return fmt.Errorf("storage '%s' is not online", st.spec.Name)
				}
				for name, vol := range st.vols {
					if vol.vmid == id && vol.content == "images" {
						s.freeLocked(st.spec.Name + ":" + name)
					}
				}
			}
		}
		delete(s.vms, id)
		s.releaseLocked(id)
		_, ha := s.ha[id]
		delete(s.ha, id)
		hooks := slices.Clone(s.onDestroy)
		major, minor := s.versionLocked()
		s.mu.Unlock()
		if ha && (major > 9 || major == 9 && minor >= 1) {
			// delete_service_from_config("vm:<id>", purge) leaves the
			// rules too (qemu-server e6352be6 src/PVE/API2/Qemu.pm
			// destroy_vm; pve-ha-manager 5.0.7, harules.go).
			s.purgeFromRules(haSID(strconv.Itoa(id)))
		}
		s.removeVMAccess(id)
		t.logf("destroyed VM %d", id)
		if ha {
			t.logf("NOTE: removed VM %d from HA resource configuration.", id)
		}
		for _, h := range hooks {
			h(ev)
		}
		return nil
	}), nil
}
