package pvesim

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// VM status and power actions: status/current, start, stop, shutdown, reboot, and what a start plugs in (bridges, memory).

func (s *Server) statusCurrent(r *request, idStr string) (any, *apiError) {
	v, _, aerr := s.vmAllowed(r, idStr, "VM.Audit")
	if aerr != nil {
		return nil, aerr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.vmStatusLocked(v), nil
}

func (s *Server) vmStatusLocked(v *vm) map[string]any {
	running := v.state == "running"
	out := map[string]any{
		"vmid":      v.id,
		"status":    "stopped",
		"qmpstatus": "stopped",
		"cpus":      vcpus(v.conf),
		"maxmem":    memoryMiB(v.conf) * mib,
		"mem":       0,
		"cpu":       0,
		"maxdisk":   bootDiskSize(s, v.conf),
		"disk":      0,
		"uptime":    0,
		"netin":     0,
		"netout":    0,
		"diskread":  0,
		"diskwrite": 0,
		"ha":        s.haStatusLocked(v.id),
	}
	// vmstatus: "$d->{name} = $conf->{name} || \"VM $vmid\"" (qemu-server
	// 9.2.6 and 8.4.10 src/PVE/QemuServer.pm): a VM being created (its
	// config holds only the create lock) or without a name is "VM <vmid>"
	// in status/current, the node's list and, from pvestatd's next
	// broadcast on, /cluster/resources.
	out["name"] = fmt.Sprintf("VM %d", v.id)
	if name := v.conf["name"]; name != "" {
		out["name"] = name
	}
	if tags := v.conf["tags"]; tags != "" {
		out["tags"] = tags
	}
	if lock := v.conf["lock"]; lock != "" {
		out["lock"] = lock
	}
	if agentEnabled(v.conf["agent"]) {
		out["agent"] = 1
	}
	if running {
		out["status"] = "running"
		out["qmpstatus"] = "running"
		out["pid"] = v.pid
		out["uptime"] = int64(time.Since(v.startedAt).Seconds())
		out["mem"] = memoryMiB(v.conf) * mib * 3 / 10
		out["cpu"] = 0.012
		out["running-machine"] = "pc-i440fx-9.0+pve0"
		out["running-qemu"] = "9.0.2"
	}
	return out
}

func vcpus(conf map[string]string) int {
	return intOr(conf["cores"], 1) * intOr(conf["sockets"], 1)
}

func bootDiskSize(s *Server, conf map[string]string) int64 {
	for _, k := range []string{"scsi0", "virtio0", "sata0", "ide0"} {
		if d, err := parseDrive(conf[k]); err == nil && conf[k] != "" && !d.isCDROM() {
			if n, ok := parseSize(d.get("size")); ok {
				return n
			}
		}
	}
	return 0
}

func (s *Server) powerAction(r *request, idStr, action string) (any, *apiError) {
	v, id, aerr := s.vmAllowed(r, idStr, "VM.PowerMgmt")
	if aerr != nil {
		return nil, aerr
	}
	skiplock := r.param("skiplock") == "1"
	// Only the user root@pam: a token's user is its full ID, so not even
	// a root@pam token may skip the lock (pve-manager PVE/HTTPServer.pm
	// auth_handler).
	if skiplock && r.who.name() != "root@pam" {
		return nil, paramErr(map[string]string{"skiplock": "Only root may use this option."})
	}
	s.mu.Lock()
	state := v.state
	s.mu.Unlock()
	sid := strconv.Itoa(id)
	switch action {
	case "start":
		if aerr := s.quorumErr(); aerr != nil {
			return nil, aerr
		}
		s.mu.Lock()
		_, ha := s.ha[id]
		s.mu.Unlock()
		if ha {
			return s.haStart(r, v), nil
		}
		return s.startTask(r, "qmstart", sid, func(ctx context.Context, t *task) error {
			if err := s.flock(ctx, v, s.lockTimeout()); err != nil {
				return err
			}
			defer funlock(v)
			if err := t.injected(); err != nil {
				return err
			}
			return s.startWork(ctx, t, v, skiplock)
		}), nil
	case "stop":
		s.mu.Lock()
		_, ha := s.ha[id]
		s.mu.Unlock()
		if ha {
			return s.haStop(r, v), nil
		}
		return s.startTask(r, "qmstop", sid, func(ctx context.Context, t *task) error {
			return s.stopWork(ctx, t, v, skiplock, s.opts.Profile.Stop)
		}), nil
	case "shutdown":
		if state != "running" {
			return nil, errf(500, "VM %d not running", id)
		}
		return s.startTask(r, "qmshutdown", sid, func(ctx context.Context, t *task) error {
			return s.stopWork(ctx, t, v, skiplock, s.opts.Profile.Shutdown)
		}), nil
	case "reboot":
		if state != "running" {
			return nil, errf(500, "VM %d not running", id)
		}
		return s.startTask(r, "qmreboot", sid, func(ctx context.Context, t *task) error {
			if err := s.stopWork(ctx, t, v, skiplock, s.opts.Profile.Reboot/2); err != nil {
				return err
			}
			if err := s.flock(ctx, v, s.lockTimeout()); err != nil {
				return err
			}
			defer funlock(v)
			return s.startWork(ctx, t, v, skiplock)
		}), nil
	}
	return nil, errf(http.StatusNotImplemented, "Method '%s %s' not implemented", r.method, r.path)
}

// startWork boots a stopped VM; the caller holds its flock.
func (s *Server) startWork(ctx context.Context, t *task, v *vm, skiplock bool) error {
	s.mu.Lock()
	if s.vms[v.id] != v {
		s.mu.Unlock()
		return fmt.Errorf("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", s.node.Name, v.id)
	}
	if lock := v.conf["lock"]; lock != "" && !skiplock {
		s.mu.Unlock()
		return fmt.Errorf("VM is locked (%s)", lock)
	}
	if v.state != "stopped" {
		s.mu.Unlock()
		return fmt.Errorf("VM %d already running", v.id)
	}
	applyPendingLocked(v)
	if n := vcpus(v.conf); n > s.node.CPUs {
		s.mu.Unlock()
		return fmt.Errorf("MAX %d vcpus allowed per VM on this node", s.node.CPUs)
	}
	if err := s.pciStartLocked(v); err != nil {
		s.mu.Unlock()
		return err
	}
	for _, k := range sortedKeys(v.conf) {
		if !netKeyRE.MatchString(k) {
			continue
		}
		n, err := parseNet(v.conf[k])
		if err != nil || n.bridge == "" {
			continue
		}
		if err := s.netdevLocked(k, n); err != nil {
			s.mu.Unlock()
			return err
		}
		if err := s.plugLocked(n); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	// PVE's vm_start checks no memory (qemu-server
	// 9.2.6 src/PVE/QemuServer.pm vm_start_nolock checks only hugepages): QEMU's RAM is mmap'ed and
	// the kernel's overcommit heuristic (OVERCOMMIT_GUESS, Linux
	// mm/util.c __vm_enough_memory) refuses only one mapping larger than
	// RAM plus swap. A host started past its free RAM runs, and the OOM
	// killer settles it later (not modelled).
	need := memoryMiB(v.conf) * mib
	if need > s.node.MemoryBytes+swapBytes {
		s.mu.Unlock()
		t.logf("kvm: cannot set up guest memory 'pc.ram': Cannot allocate memory")
		return errors.New("start failed: QEMU exited with code 1")
	}
	v.state, v.reserved = "starting", need
	s.mu.Unlock()

	revert := func() {
		s.mu.Lock()
		v.state, v.reserved = "stopped", 0
		s.mu.Unlock()
	}
	if err := s.pause(ctx, s.opts.Profile.Start); err != nil {
		revert()
		return err
	}
	s.mu.Lock()
	s.pid++
	v.state, v.startedAt, v.pid = "running", time.Now(), s.pid
	ev := s.eventLocked(v)
	hooks := slices.Clone(s.onStart)
	s.mu.Unlock()
	for _, h := range hooks {
		if err := h(ev); err != nil {
			revert()
			return fmt.Errorf("start failed: %v", err)
		}
	}
	return nil
}

// stopWork powers a VM off, waiting d; it takes the VM's flock itself.
func (s *Server) stopWork(ctx context.Context, t *task, v *vm, skiplock bool, d time.Duration) error {
	if err := s.flock(ctx, v, s.lockTimeout()); err != nil {
		return err
	}
	defer funlock(v)
	if err := t.injected(); err != nil {
		return err
	}
	s.mu.Lock()
	if lock := v.conf["lock"]; lock != "" && !skiplock {
		s.mu.Unlock()
		return fmt.Errorf("VM is locked (%s)", lock)
	}
	running := v.state == "running"
	s.mu.Unlock()
	if !running {
		return nil
	}
	if err := s.pause(ctx, d); err != nil {
		return err
	}
	s.mu.Lock()
	s.stoppedLocked(v)
	return nil
}

// stoppedLocked records that v's QEMU process is gone and tells the OnStop
// listeners; s.mu is held on entry and released before they are called.
func (s *Server) stoppedLocked(v *vm) {
	v.state, v.reserved, v.pid = "stopped", 0, 0
	ev := s.eventLocked(v)
	hooks := slices.Clone(s.onStop)
	s.mu.Unlock()
	for _, h := range hooks {
		h(ev)
	}
}

func (s *Server) hasBridgeLocked(name string) bool {
	_, ok := s.bridgeLocked(name)
	return ok
}

func (s *Server) bridgeLocked(name string) (BridgeSpec, bool) {
	for _, b := range s.bridges {
		if b.Name == name {
			return b, true
		}
	}
	return BridgeSpec{}, false
}

// plugLocked is what the VM's tap script does with a NIC when the VM
// starts (pve-common 9.2.1 src/PVE/Network.pm tap_plug): a bridge that is
// neither Linux nor OVS fails ("interface … does not exist" from
// is_linux_bridge); an OVS bridge tags the port itself (ovs-vsctl
// add-port … tag=N); a VLAN-aware Linux bridge tags it with bridge vlan;
// a Linux bridge that is not VLAN aware gets the classic vmbr0v<tag>
// bridge over <port>.<tag> (activate_bridge_vlan), which needs a port on
// the bridge ("no physical interface on bridge"). Nothing of this is
// checked at create. SDN VNets are left to their zone (unverified here).
func (s *Server) plugLocked(n nic) error {
	b, ok := s.bridgeLocked(n.bridge)
	if !ok {
		return fmt.Errorf("interface %s does not exist", n.bridge)
	}
	if n.tag == 0 || b.OVS || b.Zone != "" || b.VLANAware {
		return nil
	}
	if strings.TrimSpace(b.Ports) == "" {
		return fmt.Errorf("no physical interface on bridge '%s'", b.Name)
	}
	return nil
}

func (s *Server) usedMemoryLocked() int64 {
	used := s.node.HostUsedBytes + s.node.ARCBytes
	for _, v := range s.vms {
		used += v.reserved
	}
	return used
}
