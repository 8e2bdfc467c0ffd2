package pvesim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

type vm struct {
	id         int
	created    time.Time
	rrd        map[string]any // the last pvestatd broadcast of it
	rrdAt      time.Time
	conf       map[string]string
	pending    map[string]string
	pendingDel map[string]bool
	state      string // "stopped", "starting", "running"
	startedAt  time.Time
	pid        int
	reserved   int64
	// pci are the host PCI devices the VM holds while not stopped (pci.go).
	pci   []string
	flock chan struct{}
}

func newVM(id int, conf map[string]string) *vm {
	return &vm{id: id, created: time.Now(), conf: conf, pending: map[string]string{}, pendingDel: map[string]bool{}, state: "stopped", flock: make(chan struct{}, 1)}
}

// createChecksTags reports whether a create checks its tags: qemu-server
// 9.2.0 added the check (commit a929b3e0 "vm_create: check tag permissions
// if setting tags", bumped in b69480d6; not in 9.1.19 nor 8.4.10). It
// follows the installed qemu-server (Options.QemuServer), not pve-manager:
// pve-manager 9.2.0-9.2.4 came out before qemu-server 9.2.0 and 9.2.11
// still declares qemu-server >= 9.1.13 (debian/control at f6997e69).
func (s *Server) createChecksTags() bool {
	return versionAtLeast(s.opts.QemuServer, 9, 2, 0)
}

// createHashTag is what the 9.2 create's tag check takes for the VM's old
// tags: create_vm passes assert_tag_permissions an empty hash ({}) as the
// old tag list (qemu-server 9.2.6 src/PVE/API2/Qemu.pm, in the create
// worker), which split_list stringifies (pve-common src/PVE/ParseUtils.pm)
// into one tag "HASH(0x…)" the check counts as removed.
const createHashTag = "HASH(0x55d0c0ffee00)"

// createTagsCheck is the 9.2 create task's tag check: VM.Config.Options on
// the VM itself (check_vm_perm with no pool: the VM joins its pool only
// after; pve-guest-common GuestHelpers.pm assert_tag_permissions), then
// every changed tag, the "HASH(0x…)" one included, so that a token
// without Sys.Modify on / gets no tag at all unless user-tag-access is
// free. s.mu must be held.
func (s *Server) createTagsCheck(who *identity, id int, tags string) *apiError {
	path := "/vms/" + strconv.Itoa(id)
	if !who.has(path, "VM.Config.Options") {
		return permErr(path + ", VM.Config.Options")
	}
	return s.tagPermsLocked(who, createHashTag, tags)
}

func (s *Server) major() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, _ := s.versionLocked()
	return m
}

// versionLocked is the pve-manager version's major and minor ("9.2.11":
// 9, 2); s.mu must be held.
func (s *Server) versionLocked() (major, minor int) {
	parts := strings.SplitN(s.version, ".", 3)
	major, _ = strconv.Atoi(parts[0])
	if len(parts) > 1 {
		minor, _ = strconv.Atoi(parts[1])
	}
	return major, minor
}

func noConfig(node string, id int) *apiError {
	return errf(500, "Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", node, id)
}

func parseVMID(v string) (int, *apiError) {
	if v == "" {
		return 0, paramErr(map[string]string{"vmid": "property is missing and it is not optional"})
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, paramErr(map[string]string{"vmid": "invalid format - value does not look like a valid VM ID"})
	}
	if n < 100 {
		return 0, paramErr(map[string]string{"vmid": "value must have a minimum value of 100"})
	}
	if n > 999999999 {
		return 0, paramErr(map[string]string{"vmid": "value must have a maximum value of 999999999"})
	}
	return n, nil
}

// vmFor resolves the {vmid} path segment of a request.
func (s *Server) vmFor(idStr string) (*vm, int, *apiError) {
	id, err := parseVMID(idStr)
	if err != nil {
		return nil, 0, err
	}
	return s.vmByID(id)
}

func (s *Server) vmByID(id int) (*vm, int, *apiError) {
	s.mu.Lock()
	v := s.vms[id]
	s.mu.Unlock()
	if v == nil {
		return nil, id, noConfig(s.node.Name, id)
	}
	return v, id, nil
}

// vmAllowed resolves the VM for a caller that needs priv on it. PVE checks
// the permission of the API schema before the handler looks the VM up, so
// a caller without priv gets 403 even for a VMID that does not exist.
func (s *Server) vmAllowed(r *request, idStr, priv string) (*vm, int, *apiError) {
	id, err := parseVMID(idStr)
	if err != nil {
		return nil, 0, err
	}
	if err := r.who.check("/vms/"+strconv.Itoa(id), priv); err != nil {
		return nil, id, err
	}
	return s.vmByID(id)
}

// flock takes the per-VM config lock like PVE's lock_config, waiting up
// to timeout before failing with PVE's text.
func (s *Server) flock(ctx context.Context, v *vm, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case v.flock <- struct{}{}:
		return nil
	default:
	}
	select {
	case v.flock <- struct{}{}:
		return nil
	case <-t.C:
		return fmt.Errorf("can't lock file '/var/lock/qemu-server/lock-%d.conf' - got timeout", v.id)
	case <-ctx.Done():
		return errors.New("got interrupted by signal")
	case <-s.ctx.Done():
		return errors.New("got interrupted by signal")
	}
}

func funlock(v *vm) { <-v.flock }

func (s *Server) lockTimeout() time.Duration { return s.scaled(s.opts.Profile.LockTimeout) }

// configPerms checks qemu-server's per-option privileges for keys.
func configPerms(who *identity, id int, keys []string) *apiError {
	path := "/vms/" + strconv.Itoa(id)
	for _, k := range keys {
		var err *apiError
		switch {
		case isDriveKey(k) || unusedRE.MatchString(k) || serialRE.MatchString(k) || isHostPCIKey(k) || k == "cdrom":
			continue
		case cpuOptions[k]:
			err = who.check(path, "VM.Config.CPU")
		case memoryOptions[k]:
			err = who.check(path, "VM.Config.Memory")
		case hwtypeOptions[k]:
			err = who.check(path, "VM.Config.HWType")
		case generalOptions[k]:
			err = who.check(path, "VM.Config.Options")
			// 'startup' changes how the host boots its guests.
			if err == nil && k == "startup" {
				err = who.check("/", "Sys.Modify")
			}
		case powerOptions[k]:
			err = who.check(path, "VM.PowerMgmt")
		case diskOptions[k]:
			err = who.check(path, "VM.Config.Disk")
		case netKeyRE.MatchString(k):
			err = who.check(path, "VM.Config.Network")
		case cloudinitOption[k] || ipcfgKeyRE.MatchString(k):
			err = who.checkAny(path, "VM.Config.Cloudinit", "VM.Config.Network")
		case k == "vmstate":
			err = who.check(path, "VM.Config.Disk", "VM.PowerMgmt")
		default:
			// 'root@pam' the user, not a token of it: a token's user is
			// its full ID (pve-manager PVE/HTTPServer.pm auth_handler).
			if who.name() != "root@pam" {
				err = errf(500, "only root can set '%s' config", k)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// rngPerm is qemu-server's check_rng_perm (9.2.6 src/PVE/API2/Qemu.pm,
// on create and update) past the option's VM.Config.HWType: the host's
// hardware RNG is a mapping, Mapping.Use on /mapping/hwrng.
func rngPerm(who *identity, rng0 string) *apiError {
	if src, _, _ := strings.Cut(strings.TrimPrefix(rng0, "source="), ","); src == "/dev/hwrng" {
		return who.check("/mapping/hwrng", "Mapping.Use")
	}
	return nil
}

// drivePerms checks storage access for drive options the way create and
// update do: new disks need Datastore.AllocateSpace, ISOs read access.
func (s *Server) drivePerms(who *identity, id int, cfg map[string]string, update bool) *apiError {
	keys := sortedKeys(cfg)
	for _, k := range keys {
		if !isDriveKey(k) {
			continue
		}
		d, err := parseDrive(cfg[k])
		if err != nil {
			return paramErr(map[string]string{k: err.Error()})
		}
		if update {
			priv := "VM.Config.Disk"
			if d.isCDROM() {
				priv = "VM.Config.CDROM"
			}
			if aerr := who.check("/vms/"+strconv.Itoa(id), priv); aerr != nil {
				return aerr
			}
		}
		switch {
		case d.file == "none" || d.isCloudInit():
		case d.isCDROM() && d.file == "cdrom":
			if aerr := who.check("/", "Sys.Console"); aerr != nil {
				return aerr
			}
		case !d.isCDROM() && newDiskRE.MatchString(d.file):
			m := newDiskRE.FindStringSubmatch(d.file)
			stName := m[2]
			if stName == "" {
				return errf(500, "no storage ID specified (and no default storage)")
			}
			if aerr := who.check("/storage/"+stName, "Datastore.AllocateSpace"); aerr != nil {
				return aerr
			}
			s.mu.Lock()
			st := s.storageByName(stName)
			images := st != nil && st.hasContent("images")
			s.mu.Unlock()
			if st == nil {
				return errf(500, "storage '%s' does not exist", stName)
			}
			if !images {
				return paramErr(map[string]string{"storage": fmt.Sprintf("storage '%s' does not support vm images", stName)})
			}
			if src := d.get("import-from"); src != "" {
				if update {
					return paramErr(map[string]string{k: "pvesim imports disks on create only"})
				}
				if aerr := s.importFromPerms(who, k, src); aerr != nil {
					return aerr
				}
			}
		default:
			stName, _, ok := strings.Cut(d.file, ":")
			if !ok {
				return paramErr(map[string]string{k: "unable to parse drive options"})
			}
			if aerr := who.checkAny("/storage/"+stName, "Datastore.AllocateSpace", "Datastore.Audit"); aerr != nil {
				return aerr
			}
		}
	}
	return nil
}

// bridgePerms is PVE 8's check_vnet_access (pve-guest-common
// GuestHelpers.pm): SDN.Use on the bridge's zone — localnetwork, or a
// VNet's own zone — and on its VLAN when tagged.
func (s *Server) bridgePerms(who *identity, cfg map[string]string) *apiError {
	for _, k := range sortedKeys(cfg) {
		if !netKeyRE.MatchString(k) {
			continue
		}
		n, err := parseNet(cfg[k])
		if err != nil || n.bridge == "" {
			continue
		}
		s.mu.Lock()
		zone := s.zoneOf(n.bridge)
		s.mu.Unlock()
		path := "/sdn/zones/" + zone + "/" + n.bridge
		if n.tag != 0 {
			path += "/" + strconv.Itoa(n.tag)
		}
		if aerr := who.check(path, "SDN.Use"); aerr != nil {
			return aerr
		}
	}
	return nil
}

// randomMACLocked generates a MAC in Proxmox's BC:24:11 range; s.mu must be held.
func (s *Server) randomMACLocked() string {
	return fmt.Sprintf("BC:24:11:%02X:%02X:%02X", s.rng.IntN(256), s.rng.IntN(256), s.rng.IntN(256))
}

func (s *Server) addMACsLocked(cfg map[string]string) {
	for k, v := range cfg {
		if !netKeyRE.MatchString(k) {
			continue
		}
		n, err := parseNet(v)
		if err != nil {
			continue
		}
		if n.mac == "" {
			n.mac = s.randomMACLocked()
		}
		cfg[k] = n.String()
	}
}

var createMeta = set("node", "vmid", "start", "pool", "storage", "archive", "force", "unique", "bwlimit", "live-restore")

func (s *Server) createVM(r *request) (any, *apiError) {
	id, aerr := parseVMID(r.param("vmid"))
	if aerr != nil {
		return nil, aerr
	}
	if r.param("archive") != "" {
		return nil, paramErr(map[string]string{"archive": "pvesim does not restore backups"})
	}
	cfg := map[string]string{}
	for k, vs := range r.params {
		if createMeta[k] || len(vs) == 0 {
			continue
		}
		cfg[k] = vs[0]
	}
	if v, ok := cfg["cdrom"]; ok {
		if !strings.Contains(v, "media=") {
			v += ",media=cdrom"
		}
		cfg["ide2"] = v
		delete(cfg, "cdrom")
	}
	major := s.major()
	if errs := validateConfig(cfg, major); len(errs) > 0 {
		return nil, paramErr(errs)
	}
	if errs := s.cpuErrs(cfg); len(errs) > 0 {
		return nil, paramErr(errs)
	}
	if st := r.param("storage"); st != "" {
		if aerr := r.who.check("/storage/"+st, "Datastore.AllocateSpace"); aerr != nil {
			return nil, aerr
		}
	}
	pool := r.param("pool")
	if !r.who.has("/vms/"+strconv.Itoa(id), "VM.Allocate") && !(pool != "" && r.who.has("/pool/"+pool, "VM.Allocate")) {
		return nil, permErr("")
	}
	if aerr := s.drivePerms(r.who, id, cfg, false); aerr != nil {
		return nil, aerr
	}
	if aerr := configPerms(r.who, id, sortedKeys(cfg)); aerr != nil {
		return nil, aerr
	}
	if aerr := rngPerm(r.who, cfg["rng0"]); aerr != nil {
		return nil, aerr
	}
	if aerr := hostpciPerms(r.who, id, cfg); aerr != nil {
		return nil, aerr
	}
	if major >= 8 {
		if aerr := s.bridgePerms(r.who, cfg); aerr != nil {
			return nil, aerr
		}
	}
	// Tags are not checked here: $check_vm_modify_config_perm skips them
	// ("next if $opt eq 'tags'", qemu-server src/PVE/API2/Qemu.pm, 8.4.10
	// and 9.2.6); from 9.2.0 the create task checks them (createTagsCheck).
	checkTags := cfg["tags"] != "" && s.createChecksTags()
	if aerr := s.quorumErr(); aerr != nil {
		return nil, aerr
	}

	s.mu.Lock()
	if kind, node := s.guestTypeLocked(id); kind != "" {
		s.mu.Unlock()
		return nil, errf(500, "unable to create VM %d - %s %d already exists on node '%s'", id, kind, id, node)
	}
	s.addMACsLocked(cfg)
	v := newVM(id, map[string]string{"lock": "create"})
	s.vms[id] = v
	s.claimLocked(id)
	s.mu.Unlock()

	startAfter := r.param("start") == "1"
	upid := s.startTask(r, "qmcreate", strconv.Itoa(id), func(ctx context.Context, t *task) error {
		if err := s.flock(ctx, v, s.scaled(time.Second)+time.Second); err != nil {
			s.dropVM(id, nil)
			return fmt.Errorf("unable to create VM %d - %v", id, err)
		}
		defer funlock(v)
		imports := importsOf(cfg)
		if len(imports) == 0 {
			if err := t.injected(); err != nil {
				s.dropVM(id, nil)
				return err
			}
		}
		if err := s.pause(ctx, s.opts.Profile.Create); err != nil {
			s.dropVM(id, nil)
			return err
		}
		s.mu.Lock()
		vols, imported, err := s.createDisksLocked(id, cfg)
		if err != nil {
			s.mu.Unlock()
			s.dropVM(id, vols)
			return fmt.Errorf("unable to create VM %d - %v", id, err)
		}
		if len(imports) > 0 {
			// qemu-img copies the image while the VM's config holds only
			// its 'create' lock (create_and_lock_config). A create that
			// fails here frees every volume it allocated and removes the
			// config (create_vm's worker, qemu-server 9.2.6): a task-error
			// fault on the create fails it half way through its import.
			s.mu.Unlock()
			perMiB := s.opts.Profile.ImportPerMiB
			if err := s.pause(ctx, time.Duration(float64(perMiB)*float64(imported)/float64(mib))); err != nil {
				s.dropVM(id, vols)
				return err
			}
			if err := t.injected(); err != nil {
				s.dropVM(id, vols)
				return fmt.Errorf("unable to create VM %d - cannot import from '%s' - %v", id, imports[0], err)
			}
			s.mu.Lock()
		}
		if checkTags {
			if aerr := s.createTagsCheck(r.who, id, cfg["tags"]); aerr != nil {
				s.mu.Unlock()
				s.dropVM(id, vols)
				return fmt.Errorf("unable to create VM %d - %s", id, aerr.msg)
			}
		}
		if cfg["boot"] == "" {
			cfg["boot"] = defaultBoot(cfg)
		}
		if cfg["smbios1"] == "" {
			cfg["smbios1"] = "uuid=" + newUUID()
		}
		if cfg["vmgenid"] == "" || cfg["vmgenid"] == "1" {
			cfg["vmgenid"] = newUUID()
		}
		cfg["meta"] = fmt.Sprintf("creation-qemu=9.0.2,ctime=%d", time.Now().Unix())
		v.conf = cfg
		s.mu.Unlock()
		t.logf("VM %d created", id)
		if startAfter {
			t.logf("Execute autostart")
			if err := s.startWork(ctx, t, v, false); err != nil {
				t.logf("%v", err)
			}
		}
		return nil
	})
	return upid, nil
}

// dropVM removes a VM whose creation failed, freeing what it allocated.
func (s *Server) dropVM(id int, vols []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, vol := range vols {
		s.freeLocked(vol)
	}
	delete(s.vms, id)
	s.releaseLocked(id)
}

// importsOf lists the import-from sources of a create's drives.
func importsOf(cfg map[string]string) []string {
	var out []string
	for _, k := range sortedKeys(cfg) {
		if !isDriveKey(k) {
			continue
		}
		if d, err := parseDrive(cfg[k]); err == nil && d.get("import-from") != "" {
			out = append(out, d.get("import-from"))
		}
	}
	return out
}

// createDisksLocked allocates new disks and the cloud-init drive and
// rewrites the drive options as stored; imported is the bytes of the disks
// imported (their virtual sizes); s.mu must be held.
func (s *Server) createDisksLocked(id int, cfg map[string]string) (vols []string, imported int64, _ error) {
	for _, k := range createOrder(cfg) {
		d, _ := parseDrive(cfg[k])
		switch {
		case k == "efidisk0" && newDiskRE.MatchString(d.file):
			// create_efidisk: the size asked is ignored; the volume gets the
			// OVMF vars file's size, copied in (qemu-server 9.2.6
			// src/PVE/API2/Qemu.pm $create_disks, src/PVE/QemuServer/OVMF.pm).
			m := newDiskRE.FindStringSubmatch(d.file)
			st := s.storageByName(m[2])
			if st == nil {
				return vols, imported, fmt.Errorf("storage '%s' does not exist", m[2])
			}
			size := volumeSize(st.spec.Type, ovmfVarsBytes(d.get("efitype")))
			volid, err := s.allocLocked(m[2], id, "", size, d.get("format"))
			if err != nil {
				return vols, imported, err
			}
			vols = append(vols, volid)
			d.file = volid
			d.del("format")
			d.set("size", formatSize(size))
		case k == "tpmstate0" && newDiskRE.MatchString(d.file):
			volid, size, err := s.allocTPMStateLocked(id, d)
			if err != nil {
				return vols, imported, err
			}
			vols = append(vols, volid)
			d.file = volid
			d.del("format")
			d.set("size", formatSize(size))
		case d.file == "none" || d.file == "cdrom":
			d.del("size")
		case d.isCloudInit():
			stName, _, _ := strings.Cut(d.file, ":")
			st := s.storageByName(stName)
			if st == nil {
				return vols, imported, fmt.Errorf("storage '%s' does not exist", stName)
			}
			format := d.get("format")
			name := fmt.Sprintf("vm-%d-cloudinit", id)
			if fileBased(st.spec.Type) {
				if format == "" {
					format = "qcow2"
				}
				name += "." + format
			}
			volid, err := s.allocLocked(stName, id, name, 4*mib, format)
			if err != nil {
				return vols, imported, err
			}
			vols = append(vols, volid)
			d.file = volid
			d.set("media", "cdrom")
			d.del("format")
			d.del("size")
		case !d.isCDROM() && newDiskRE.MatchString(d.file):
			m := newDiskRE.FindStringSubmatch(d.file)
			gibs, _ := strconv.ParseFloat(m[3], 64)
			size := int64(gibs * float64(gib))
			src := d.get("import-from")
			var from *volume
			if src != "" {
				// The untrusted check of an import volume, then a copy of
				// the image's virtual size (create_disks, $import_from_volid).
				var err error
				if from, size, err = s.importSourceLocked(src); err != nil {
					return vols, imported, fmt.Errorf("cannot import from '%s' - %v", src, err)
				}
				imported += size
			}
			volid, err := s.allocLocked(m[2], id, "", size, d.get("format"))
			if err != nil {
				return vols, imported, err
			}
			vols = append(vols, volid)
			if from != nil {
				_, vol := s.volumeLocked(volid)
				vol.importedFrom, vol.importURL = src, from.url
			}
			d.file = volid
			d.del("format")
			d.del("import-from")
			d.set("size", formatSize(size))
		default:
			_, vol := s.volumeLocked(d.file)
			if vol == nil {
				return vols, imported, fmt.Errorf("volume '%s' does not exist", d.file)
			}
			d.set("size", formatSize(vol.size))
		}
		cfg[k] = d.String()
	}
	return vols, imported, nil
}

// createOrder is cfg's drive keys in the order qemu-server creates them
// (PVE::QemuServer::Drive::valid_drive_names at 9.2.6: ide, scsi, virtio,
// sata, then efidisk0 and tpmstate0), which decides the disk numbers
// (vm-<id>-disk-<n>) each gets.
func createOrder(cfg map[string]string) []string {
	rank := func(k string) (int, int) {
		if k == "efidisk0" || k == "tpmstate0" {
			return map[string]int{"efidisk0": 4, "tpmstate0": 5}[k], 0
		}
		m := driveKeyRE.FindStringSubmatch(k)
		n, _ := strconv.Atoi(m[2])
		return map[string]int{"ide": 0, "scsi": 1, "virtio": 2, "sata": 3}[m[1]], n
	}
	var keys []string
	for _, k := range sortedKeys(cfg) {
		if isDriveKey(k) {
			keys = append(keys, k)
		}
	}
	sort.SliceStable(keys, func(i, j int) bool {
		bi, ni := rank(keys[i])
		bj, nj := rank(keys[j])
		return bi < bj || bi == bj && ni < nj
	})
	return keys
}

// ovmfVarsBytes is the size of the OVMF vars file an EFI disk of efitype
// is created from: OVMF_VARS_4M.fd for 4m, OVMF_VARS.fd for 2m (the
// default) (qemu-server 9.2.6 src/PVE/QemuServer/OVMF.pm
// get_ovmf_files). The byte counts are those of the pve-edk2-firmware
// files as a host reports them (528K and 128K in an efidisk on directory
// storage); they are not in qemu-server's source: unverified here.
func ovmfVarsBytes(efitype string) int64 {
	if efitype == "4m" {
		return 540672
	}
	return 131072
}

// volumeSize is the size a new volume of bytes gets on a storage type:
// a zvol is padded to 1 MiB (pve-storage 9.1.7 ZFSPoolPlugin.pm
// zfs_create_zvol), an RBD image to whole MiB (RBDPlugin.pm alloc_image,
// --size in MiB), an LVM volume to the volume group's extent (LVM's own
// rounding, 4 MiB by default: unverified for a host's actual extent
// size); a file keeps its size.
func volumeSize(storageType string, bytes int64) int64 {
	roundUp := func(n int64) int64 { return (bytes + n - 1) / n * n }
	switch storageType {
	case "zfspool", "zfs", "rbd":
		return roundUp(mib)
	case "lvm", "lvmthin":
		return roundUp(4 * mib)
	}
	return bytes
}

func defaultBoot(cfg map[string]string) string {
	var order []string
	for _, k := range sortedKeys(cfg) {
		if isDriveKey(k) {
			d, _ := parseDrive(cfg[k])
			if d.isCloudInit() {
				continue
			}
			order = append(order, k)
		}
	}
	if _, ok := cfg["net0"]; ok {
		order = append(order, "net0")
	}
	return "order=" + strings.Join(order, ";")
}

func (s *Server) getConfig(r *request, idStr string) (any, *apiError) {
	v, _, aerr := s.vmAllowed(r, idStr, "VM.Audit")
	if aerr != nil {
		return nil, aerr
	}
	major := s.major()
	s.mu.Lock()
	defer s.mu.Unlock()
	conf := map[string]string{}
	for k, val := range v.conf {
		conf[k] = val
	}
	if r.param("current") != "1" {
		for k, val := range v.pending {
			conf[k] = val
		}
		for k := range v.pendingDel {
			delete(conf, k)
		}
	}
	out := map[string]any{"digest": digestOf(v.conf)}
	for k, val := range conf {
		if k == "cipassword" {
			val = "**********"
		}
		out[k] = typedValue(k, val, major)
	}
	return out, nil
}

func (s *Server) getPending(r *request, idStr string) (any, *apiError) {
	v, _, aerr := s.vmAllowed(r, idStr, "VM.Audit")
	if aerr != nil {
		return nil, aerr
	}
	major := s.major()
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := map[string]bool{}
	for k := range v.conf {
		keys[k] = true
	}
	for k := range v.pending {
		keys[k] = true
	}
	out := []any{map[string]any{"key": "digest", "value": digestOf(v.conf)}}
	for _, k := range sortedKeys(keys) {
		e := map[string]any{"key": k}
		if val, ok := v.conf[k]; ok {
			e["value"] = typedValue(k, val, major)
		}
		if val, ok := v.pending[k]; ok {
			e["pending"] = typedValue(k, val, major)
		}
		if v.pendingDel[k] {
			e["delete"] = 1
		}
		out = append(out, e)
	}
	return out, nil
}

var updateMeta = set("node", "vmid", "digest", "delete", "revert", "skiplock", "force", "background_delay")

func (s *Server) updateConfig(ctx context.Context, r *request, idStr string, async bool) (any, *apiError) {
	v, id, aerr := s.vmFor(idStr)
	if aerr != nil {
		return nil, aerr
	}
	set := map[string]string{}
	for k, vs := range r.params {
		if updateMeta[k] || len(vs) == 0 {
			continue
		}
		set[k] = vs[0]
	}
	var dels []string
	for _, k := range strings.FieldsFunc(r.param("delete"), func(c rune) bool { return c == ',' || c == ';' || c == ' ' }) {
		if k == "cdrom" {
			k = "ide2"
		}
		if !knownKey(k) {
			return nil, paramErr(map[string]string{"delete": fmt.Sprintf("unknown option '%s'", k)})
		}
		if _, both := set[k]; both {
			return nil, paramErr(map[string]string{"delete": fmt.Sprintf("you can't use '-%s' and -delete %s' at the same time", k, k)})
		}
		dels = append(dels, k)
	}
	if len(set) == 0 && len(dels) == 0 {
		return nil, errf(500, "no options specified")
	}
	major := s.major()
	if errs := validateConfig(set, major); len(errs) > 0 {
		return nil, paramErr(errs)
	}
	if errs := s.cpuErrs(set); len(errs) > 0 {
		return nil, paramErr(errs)
	}
	if r.param("skiplock") == "1" && !r.who.root {
		return nil, paramErr(map[string]string{"skiplock": "Only root may use this option."})
	}
	if aerr := s.drivePerms(r.who, id, set, true); aerr != nil {
		return nil, aerr
	}
	if aerr := configPerms(r.who, id, append(sortedKeys(set), dels...)); aerr != nil {
		return nil, aerr
	}
	if aerr := rngPerm(r.who, set["rng0"]); aerr != nil {
		return nil, aerr
	}
	if aerr := hostpciPerms(r.who, id, set); aerr != nil {
		return nil, aerr
	}
	if major >= 8 {
		if aerr := s.bridgePerms(r.who, set); aerr != nil {
			return nil, aerr
		}
	}
	if tags, ok := set["tags"]; ok || slices.Contains(dels, "tags") {
		s.mu.Lock()
		old := v.conf["tags"]
		s.mu.Unlock()
		if aerr := s.tagPerms(r.who, old, tags); aerr != nil {
			return nil, aerr
		}
	}
	digest, skiplock := r.param("digest"), r.param("skiplock") == "1"
	apply := func(ctx context.Context) error {
		if err := s.flock(ctx, v, s.lockTimeout()); err != nil {
			return err
		}
		defer funlock(v)
		if err := s.pause(ctx, s.opts.Profile.ConfigUpdate); err != nil {
			return err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.vms[id] != v {
			return fmt.Errorf("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", s.node.Name, id)
		}
		if lock := v.conf["lock"]; lock != "" && !skiplock {
			return fmt.Errorf("VM is locked (%s)", lock)
		}
		if digest != "" && digest != digestOf(v.conf) {
			return errors.New("detected modified configuration - file changed by other user? Try again.")
		}
		return s.applyConfigLocked(v, set, dels)
	}
	if async {
		upid := s.startTask(r, "qmconfig", strconv.Itoa(id), func(ctx context.Context, t *task) error {
			if err := t.injected(); err != nil {
				return err
			}
			return apply(ctx)
		})
		return upid, nil
	}
	if err := apply(ctx); err != nil {
		return nil, errf(500, "%s", err.Error())
	}
	return nil, nil
}

// applyConfigLocked writes option changes: directly for a stopped VM and
// for fast-plug or hotpluggable (disk, network) options, into the pending
// section otherwise; s.mu must be held.
func (s *Server) applyConfigLocked(v *vm, set map[string]string, dels []string) error {
	running := v.state != "stopped"
	s.addMACsLocked(set)
	for _, k := range sortedKeys(set) {
		val := set[k]
		if isDriveKey(k) {
			one := map[string]string{k: val}
			vols, _, err := s.createDisksLocked(v.id, one)
			if err != nil {
				for _, vol := range vols {
					s.freeLocked(vol)
				}
				return err
			}
			if old, ok := v.conf[k]; ok {
				od, _ := parseDrive(old)
				nd, _ := parseDrive(one[k])
				if !od.isCDROM() && !od.isCloudInit() && od.file != nd.file {
					v.conf[nextUnused(v.conf)] = od.file
				}
			}
			v.conf[k] = one[k]
			continue
		}
		if running && !fastPlug[k] && !netKeyRE.MatchString(k) {
			v.pending[k] = val
			continue
		}
		v.conf[k] = val
		delete(v.pending, k)
	}
	for _, k := range dels {
		if running && !fastPlug[k] && !isDriveKey(k) && !netKeyRE.MatchString(k) {
			v.pendingDel[k] = true
			continue
		}
		if isDriveKey(k) {
			if d, err := parseDrive(v.conf[k]); err == nil && !d.isCDROM() && !d.isCloudInit() && d.file != "none" {
				v.conf[nextUnused(v.conf)] = d.file
			} else if err == nil && d.isCloudInit() {
				s.freeLocked(d.file)
			}
		}
		delete(v.conf, k)
		delete(v.pending, k)
	}
	return nil
}

func nextUnused(conf map[string]string) string {
	for i := 0; ; i++ {
		k := "unused" + strconv.Itoa(i)
		if _, ok := conf[k]; !ok {
			return k
		}
	}
}

// applyPendingLocked folds pending changes into the config, as a (re)start does.
func applyPendingLocked(v *vm) {
	for k, val := range v.pending {
		v.conf[k] = val
	}
	for k := range v.pendingDel {
		delete(v.conf, k)
	}
	v.pending = map[string]string{}
	v.pendingDel = map[string]bool{}
}

func (s *Server) resize(r *request, idStr string) (any, *apiError) {
	v, id, aerr := s.vmAllowed(r, idStr, "VM.Config.Disk")
	if aerr != nil {
		return nil, aerr
	}
	disk, sizeArg := r.param("disk"), r.param("size")
	if !isDriveKey(disk) {
		return nil, paramErr(map[string]string{"disk": "value '" + disk + "' does not have a value in the enumeration"})
	}
	rel := strings.HasPrefix(sizeArg, "+")
	amount, ok := parseSize(strings.TrimPrefix(sizeArg, "+"))
	if !ok {
		return nil, paramErr(map[string]string{"size": "value does not match the regex pattern"})
	}
	work := func(ctx context.Context) error {
		if err := s.flock(ctx, v, s.lockTimeout()); err != nil {
			return err
		}
		defer funlock(v)
		s.mu.Lock()
		if lock := v.conf["lock"]; lock != "" {
			s.mu.Unlock()
			return fmt.Errorf("VM is locked (%s)", lock)
		}
		d, err := parseDrive(v.conf[disk])
		if err != nil || v.conf[disk] == "" {
			s.mu.Unlock()
			return fmt.Errorf("disk '%s' does not exist", disk)
		}
		if d.isCDROM() {
			s.mu.Unlock()
			return fmt.Errorf("you can't resize a cdrom")
		}
		if stName, _, _ := strings.Cut(d.file, ":"); true {
			if aerr := r.who.check("/storage/"+stName, "Datastore.AllocateSpace"); aerr != nil {
				s.mu.Unlock()
				return errors.New(strings.TrimSpace(aerr.msg))
			}
		}
		st, vol := s.volumeLocked(d.file)
		if vol == nil {
			s.mu.Unlock()
			return fmt.Errorf("volume '%s' does not exist", d.file)
		}
		newSize := amount
		if rel {
			newSize = vol.size + amount
		}
		if newSize < vol.size {
			s.mu.Unlock()
			return errors.New("shrinking disks is not supported")
		}
		grow := newSize - vol.size
		if st.thin() {
			grow = 0
		}
		if grow > st.avail() {
			s.mu.Unlock()
			return fmt.Errorf("lvextend 'pve/%s' error:   Insufficient free space", vol.name)
		}
		s.mu.Unlock()
		if err := s.pause(ctx, s.opts.Profile.Resize); err != nil {
			return err
		}
		s.mu.Lock()
		st.used += grow
		vol.alloc += grow
		vol.size = newSize
		d.set("size", formatSize(newSize))
		v.conf[disk] = d.String()
		s.mu.Unlock()
		return nil
	}
	if s.major() < 8 {
		if err := work(context.Background()); err != nil {
			return nil, errf(500, "%s", err.Error())
		}
		return nil, nil
	}
	return s.startTask(r, "resize", strconv.Itoa(id), func(ctx context.Context, t *task) error {
		if err := t.injected(); err != nil {
			return err
		}
		return work(ctx)
	}), nil
}

// swapBytes is the node's swap, as node status reports it.
const swapBytes = 8 * gib

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
