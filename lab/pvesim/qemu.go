package pvesim

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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
	flock      chan struct{}
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
		case isDriveKey(k) || unusedRE.MatchString(k) || serialRE.MatchString(k) || k == "cdrom":
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
		if err := t.injected(); err != nil {
			s.dropVM(id, nil)
			return err
		}
		if err := s.pause(ctx, s.opts.Profile.Create); err != nil {
			s.dropVM(id, nil)
			return err
		}
		s.mu.Lock()
		vols, err := s.createDisksLocked(id, cfg)
		if err != nil {
			s.mu.Unlock()
			s.dropVM(id, vols)
			return fmt.Errorf("unable to create VM %d - %v", id, err)
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

// createDisksLocked allocates new disks and the cloud-init drive and
// rewrites the drive options as stored; s.mu must be held.
func (s *Server) createDisksLocked(id int, cfg map[string]string) ([]string, error) {
	var vols []string
	for _, k := range sortedKeys(cfg) {
		if !isDriveKey(k) {
			continue
		}
		d, _ := parseDrive(cfg[k])
		switch {
		case d.file == "none" || d.file == "cdrom":
			d.del("size")
		case d.isCloudInit():
			stName, _, _ := strings.Cut(d.file, ":")
			st := s.storageByName(stName)
			if st == nil {
				return vols, fmt.Errorf("storage '%s' does not exist", stName)
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
				return vols, err
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
			volid, err := s.allocLocked(m[2], id, "", size, d.get("format"))
			if err != nil {
				return vols, err
			}
			vols = append(vols, volid)
			d.file = volid
			d.del("format")
			d.set("size", formatSize(size))
		default:
			_, vol := s.volumeLocked(d.file)
			if vol == nil {
				return vols, fmt.Errorf("volume '%s' does not exist", d.file)
			}
			d.set("size", formatSize(vol.size))
		}
		cfg[k] = d.String()
	}
	return vols, nil
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
	if r.param("skiplock") == "1" && !r.who.root {
		return nil, paramErr(map[string]string{"skiplock": "Only root may use this option."})
	}
	if aerr := s.drivePerms(r.who, id, set, true); aerr != nil {
		return nil, aerr
	}
	if aerr := configPerms(r.who, id, append(sortedKeys(set), dels...)); aerr != nil {
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
			vols, err := s.createDisksLocked(v.id, one)
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
	for _, k := range sortedKeys(v.conf) {
		if !netKeyRE.MatchString(k) {
			continue
		}
		n, err := parseNet(v.conf[k])
		if err != nil || n.bridge == "" {
			continue
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
		s.mu.Unlock()
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

func (s *Server) agentInterfaces(r *request, idStr string) (any, *apiError) {
	if _, aerr := s.agentAvailable(r, idStr); aerr != nil {
		return nil, aerr
	}
	// What a running agent reports is not modelled.
	return map[string]any{"result": []any{}}, nil
}

// agentPing is the ping guest agent command (qemu-server
// src/PVE/API2/Qemu/Agent.pm at 9.2.6: POST, VM.GuestAgent.Audit or
// VM.GuestAgent.Unrestricted; {"result": {}} when the agent answers).
func (s *Server) agentPing(r *request, idStr string) (any, *apiError) {
	if _, aerr := s.agentAvailable(r, idStr); aerr != nil {
		return nil, aerr
	}
	return map[string]any{"result": map[string]any{}}, nil
}

// agentAvailable is assert_agent_available (qemu-server
// src/PVE/QemuServer/Agent.pm at 9.2.6) behind the command's privilege
// check: no agent option at all, then the VM not running, then no answer
// to guest-ping — which is also what agent: 0 gets, as QEMU then has no
// agent channel to ping. The guest answers when Options.GuestAgent says
// it runs the agent.
func (s *Server) agentAvailable(r *request, idStr string) (int, *apiError) {
	// The command's schema check is ['perm', '/vms/{vmid}', [$perm,
	// 'VM.GuestAgent.Unrestricted'], any => 1] since qemu-server 9.0.3
	// (commit b92a40ce), VM.Monitor alone before; check_any
	// (pve-access-control src/PVE/RPCEnvironment.pm at 9.1.1) names both in
	// its refusal: "(/vms/701, VM.GuestAgent.Audit|VM.GuestAgent.Unrestricted)".
	id, perr := parseVMID(idStr)
	if perr != nil {
		return 0, perr
	}
	privs := []string{"VM.Monitor"}
	if s.major() >= 9 {
		privs = []string{"VM.GuestAgent.Audit", "VM.GuestAgent.Unrestricted"}
	}
	if aerr := r.who.checkAny("/vms/"+strconv.Itoa(id), privs...); aerr != nil {
		return id, aerr
	}
	v, id, aerr := s.vmByID(id)
	if aerr != nil {
		return 0, aerr
	}
	s.mu.Lock()
	conf, state := v.conf["agent"], v.state
	s.mu.Unlock()
	switch {
	case conf == "":
		return id, errf(500, "No QEMU guest agent configured")
	case state != "running":
		return id, errf(500, "VM %d is not running", id)
	case !agentEnabled(conf) || s.opts.GuestAgent == nil || !s.opts.GuestAgent(id):
		return id, errf(500, "QEMU guest agent is not running")
	}
	return id, nil
}

// agentEnabled reads the agent option's enabled flag (parse_guest_agent:
// "1", "enabled=1,…", "0", "enabled=0").
func agentEnabled(a string) bool {
	return a != "" && a != "0" && !strings.HasPrefix(a, "0,") && !strings.Contains(a, "enabled=0")
}

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

// swapBytes is the node's swap, as node status reports it.
const swapBytes = 8 * gib

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
			e["bridge_vids"] = "2-4094"
		}
		if b.CIDR != "" {
			addr, bits, _ := strings.Cut(b.CIDR, "/")
			e["cidr"], e["address"], e["netmask"], e["method"] = b.CIDR, addr, bits, "static"
		}
		if b.Gateway != "" {
			e["gateway"] = b.Gateway
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

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
