package pvesim

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// VMInfo is a snapshot of one simulated VM for tests and the lab.
type VMInfo struct {
	VMID int
	// Status is "stopped", "starting" or "running".
	Status string
	// Config is the stored config (pending changes not applied).
	Config map[string]string
	// Pending holds changes waiting for the next start.
	Pending map[string]string
	Event   VMEvent
}

// VM returns a snapshot of the VM with vmid.
func (s *Server) VM(vmid int) (VMInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.vms[vmid]
	if v == nil {
		return VMInfo{}, false
	}
	info := VMInfo{VMID: vmid, Status: v.state, Config: map[string]string{}, Pending: map[string]string{}, Event: s.eventLocked(v)}
	for k, val := range v.conf {
		info.Config[k] = val
	}
	for k, val := range v.pending {
		info.Pending[k] = val
	}
	return info, true
}

// VMIDs lists the VMs that exist, sorted.
func (s *Server) VMIDs() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.vmIDsLocked()
}

// SeedVM creates a VM out of band (no API call, no task, no counters), as
// if someone had made it earlier, with the same option syntax as the create
// call ("scsi0": "local-lvm:32", "net0": "virtio,bridge=vmbr0", ...).
func (s *Server) SeedVM(vmid int, params map[string]string, running bool) error {
	cfg := map[string]string{}
	for k, v := range params {
		cfg[k] = v
	}
	if errs := validateConfig(cfg, s.major()); len(errs) > 0 {
		return fmt.Errorf("invalid seed config for VM %d: %v", vmid, errs)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.vms[vmid]; ok {
		return fmt.Errorf("VM %d already exists", vmid)
	}
	s.addMACsLocked(cfg)
	vols, _, err := s.createDisksLocked(vmid, cfg)
	if err != nil {
		for _, vol := range vols {
			s.freeLocked(vol)
		}
		return err
	}
	if cfg["boot"] == "" {
		cfg["boot"] = defaultBoot(cfg)
	}
	if cfg["smbios1"] == "" {
		cfg["smbios1"] = "uuid=" + newUUID()
	}
	v := newVM(vmid, cfg)
	if running {
		s.pid++
		v.state, v.startedAt, v.pid, v.reserved = "running", time.Now(), s.pid, memoryMiB(cfg)*mib
	}
	s.vms[vmid] = v
	s.claimLocked(vmid)
	return nil
}

// EditVM changes a VM's config out of band, as an administrator editing it
// in the GUI would (values in create syntax; "" deletes an option). It
// bypasses locks and pending handling.
func (s *Server) EditVM(vmid int, changes map[string]string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.vms[vmid]
	if v == nil {
		return fmt.Errorf("VM %d does not exist", vmid)
	}
	set := map[string]string{}
	for k, val := range changes {
		if val == "" {
			delete(v.conf, k)
			continue
		}
		set[k] = val
	}
	vols, _, err := s.createDisksLocked(vmid, set)
	if err != nil {
		for _, vol := range vols {
			s.freeLocked(vol)
		}
		return err
	}
	for k, val := range set {
		v.conf[k] = val
	}
	return nil
}

// SetLock sets the config lock of a VM ("backup", "migrate", ...) as a
// running backup job would; for > 0 clears it again after that long.
func (s *Server) SetLock(vmid int, lock string, clearAfter time.Duration) error {
	s.mu.Lock()
	v := s.vms[vmid]
	if v == nil {
		s.mu.Unlock()
		return fmt.Errorf("VM %d does not exist", vmid)
	}
	v.conf["lock"] = lock
	s.mu.Unlock()
	if clearAfter > 0 {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			select {
			case <-time.After(clearAfter):
			case <-s.ctx.Done():
			}
			s.mu.Lock()
			if v.conf["lock"] == lock {
				delete(v.conf, "lock")
			}
			s.mu.Unlock()
		}()
	}
	return nil
}

// SetNodeOnline marks the node online or offline in /nodes; while offline,
// calls to /nodes/<node>/... fail like an unreachable cluster member.
func (s *Server) SetNodeOnline(online bool) {
	s.mu.Lock()
	s.nodeOnline = online
	s.mu.Unlock()
}

// SetBridges replaces the node's bridges.
func (s *Server) SetBridges(b []BridgeSpec) {
	s.mu.Lock()
	s.bridges = append([]BridgeSpec(nil), b...)
	s.mu.Unlock()
}

// AddToken adds (or replaces) an API token.
func (s *Server) AddToken(t Token) {
	s.mu.Lock()
	s.tokens[t.ID] = t
	s.mu.Unlock()
}

// LoseVM takes a VM away with its disks behind the API's back, as a dead
// host disk or someone else's destroy does: a running VM stops first (the
// OnStop listeners hear it), then the VM and the volumes it owns are gone
// and the OnDestroy listeners hear that.
func (s *Server) LoseVM(vmid int) error {
	s.mu.Lock()
	v := s.vms[vmid]
	if v == nil {
		s.mu.Unlock()
		return fmt.Errorf("no VM %d", vmid)
	}
	ev := s.eventLocked(v)
	wasRunning := v.state != "stopped"
	stops, destroys := slices.Clone(s.onStop), slices.Clone(s.onDestroy)
	for _, st := range s.storages {
		for name, vol := range st.vols {
			if vol.vmid == vmid && vol.content == "images" {
				s.freeLocked(st.spec.Name + ":" + name)
			}
		}
	}
	delete(s.vms, vmid)
	s.releaseLocked(vmid)
	delete(s.ha, vmid)
	s.mu.Unlock()
	if wasRunning {
		for _, h := range stops {
			h(ev)
		}
	}
	for _, h := range destroys {
		h(ev)
	}
	return nil
}

// GuestPowerOff is a guest shutting itself down (Talos' reset without
// reboot ends in a shutdown). QEMU runs with -no-shutdown (qemu-server
// 9.2.6 src/PVE/QemuServer.pm config_to_command) and qmeventd, on the
// guest's SHUTDOWN event, terminates it unless a backup runs
// (src/qmeventd/qmeventd.c handle_qmp_event, terminate_check; a running
// backup is not simulated): the VM is stopped and the OnStop listeners
// hear it; an HA-managed VM is started again by HA a CRM round later
// (haRestart). A VM that is not running is left alone.
func (s *Server) GuestPowerOff(vmid int) error {
	s.mu.Lock()
	v := s.vms[vmid]
	if v == nil {
		s.mu.Unlock()
		return fmt.Errorf("no VM %d", vmid)
	}
	if v.state != "running" {
		s.mu.Unlock()
		return nil
	}
	restart := s.ha[vmid] == "started"
	s.stoppedLocked(v)
	if restart {
		s.haRestart(v)
	}
	return nil
}

// haRestart is the HA stack starting a VM that went down on its own
// while its requested state is 'started' (pve-ha-manager 5.2.0
// src/PVE/HA/Manager.pm next_state_started: "ensure service gets started
// again if it went unexpected down", a new uid makes the node's LRM queue
// 'started' again, src/PVE/HA/LRM.pm queue_resource_command): a CRM round
// (Profile.HAStop) later the VM runs again, unless it was taken out of
// HA, asked to stop, or destroyed meanwhile.
func (s *Server) haRestart(v *vm) {
	s.afterCRMRound(func() {
		s.mu.Lock()
		still := s.vms[v.id] == v && s.ha[v.id] == "started" && v.state == "stopped"
		s.mu.Unlock()
		if !still {
			return
		}
		if err := s.flock(s.ctx, v, s.lockTimeout()); err != nil {
			return
		}
		defer funlock(v)
		lrm := &task{node: s.node.Name, typ: "qmstart", id: strconv.Itoa(v.id)}
		if err := s.startWork(s.ctx, lrm, v, false); err != nil {
			s.log.Debug().Int("vmid", v.id).Err(err).Msg("HA restart failed")
		}
	})
}

// OnStart registers a listener called when a VM has started; an error
// fails the start task with "start failed: <err>".
func (s *Server) OnStart(fn func(VMEvent) error) {
	s.mu.Lock()
	s.onStart = append(s.onStart, fn)
	s.mu.Unlock()
}

// OnStop registers a listener called when a VM has stopped.
func (s *Server) OnStop(fn func(VMEvent)) {
	s.mu.Lock()
	s.onStop = append(s.onStop, fn)
	s.mu.Unlock()
}

// OnDestroy registers a listener called when a VM was destroyed.
func (s *Server) OnDestroy(fn func(VMEvent)) {
	s.mu.Lock()
	s.onDestroy = append(s.onDestroy, fn)
	s.mu.Unlock()
}

// vidsHold says whether a bridge-vids list (tags and lo-hi ranges, the
// pve-vlan-id-or-range-list format of pve-common 9.2.1
// src/PVE/JSONSchema.pm, split as src/PVE/ParseUtils.pm split_list does)
// holds tag.
func vidsHold(vids string, tag int) bool {
	for _, part := range strings.FieldsFunc(vids, func(r rune) bool { return r == ',' || r == ';' || unicode.IsSpace(r) }) {
		lo, hi, rng := strings.Cut(part, "-")
		a, _ := strconv.Atoi(lo)
		z := a
		if rng {
			z, _ = strconv.Atoi(hi)
		}
		if tag >= a && tag <= z {
			return true
		}
	}
	return false
}

// eventLocked describes v as its guest would see it; s.mu must be held.
func (s *Server) eventLocked(v *vm) VMEvent {
	ev := VMEvent{Node: s.node.Name, VMID: v.id, Name: v.conf["name"], Tags: splitTags(v.conf["tags"]), MemoryMiB: memoryMiB(v.conf), At: time.Now()}
	ev.Firmware = firmwareOf(v.conf)
	if ev.Firmware.CDROM != "" {
		if _, vol := s.volumeLocked(ev.Firmware.CDROM); vol != nil {
			ev.Firmware.CDROMURL = vol.url
		}
	}
	if ipc := v.conf["ipconfig0"]; ipc != "" {
		if p, gw, err := parseIPConfig(ipc); err == nil {
			ev.IPv4, ev.Gateway = p, gw
		}
	}
	if ns := v.conf["nameserver"]; ns != "" {
		ev.Nameservers = strings.Fields(ns)
	}
	if n, err := parseNet(v.conf["net0"]); err == nil && v.conf["net0"] != "" {
		ev.MAC, ev.Bridge, ev.VLAN = strings.ToUpper(n.mac), n.bridge, n.tag
		// VLAN 1 is the ports' PVID, which they carry untagged: the tap of
		// an untagged NIC gets it too (pve-common 9.2.1 src/PVE/Network.pm
		// $bridge_add_interface, $tag = 1 if !$tag).
		if b, ok := s.bridgeLocked(n.bridge); ok && b.VLANAware && b.Zone == "" && !b.OVS && n.tag > 1 {
			ev.Isolated = !vidsHold(cmp.Or(b.VIDs, "2-4094"), n.tag)
		}
	}
	keys := sortedKeys(v.conf)
	sort.SliceStable(keys, func(i, j int) bool { return driveOrder(keys[i]) < driveOrder(keys[j]) })
	for _, k := range keys {
		// The EFI vars and TPM state volumes back the firmware's flash and
		// the TPM emulator (qemu-server 9.2.6 OVMF.pm, pflash unit 1;
		// QemuServer.pm start_swtpm): the guest sees no disk for them.
		if !isDriveKey(k) || k == "efidisk0" || k == "tpmstate0" {
			continue
		}
		d, err := parseDrive(v.conf[k])
		if err != nil || d.isCDROM() || d.isCloudInit() || d.file == "none" {
			continue
		}
		stName, vol, _ := strings.Cut(d.file, ":")
		size, _ := parseSize(d.get("size"))
		disk := Disk{Slot: k, Bus: driveBus(k), Storage: stName, Volume: vol, SizeBytes: size}
		if _, v := s.volumeLocked(d.file); v != nil {
			disk.ImportedFrom, disk.ImportURL = v.importedFrom, v.importURL
		}
		disk.Serial = driveSerial(d)
		ev.Disks = append(ev.Disks, disk)
	}
	ev.NICs = extraNICsOf(v.conf)
	return ev
}

// driveOrder sorts drives the way a guest enumerates them: by bus, then index.
func driveOrder(k string) int {
	m := driveKeyRE.FindStringSubmatch(k)
	if m == nil {
		return 1 << 20
	}
	n, _ := strconv.Atoi(m[2])
	bus := map[string]int{"scsi": 0, "virtio": 1, "sata": 2, "ide": 3}[m[1]]
	return bus*100 + n
}
