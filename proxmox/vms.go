package proxmox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/homelab/bootstrap/internal/retry"
	"github.com/homelab/bootstrap/internal/wait"
)

// ClusterTag is the tag that marks a VM as belonging to cluster.
func ClusterTag(cluster string) string { return "bootstrap-" + cluster }

// VMSummary is one VM as GET /cluster/resources lists it.
type VMSummary struct {
	VMID int
	// Type is "qemu" (a VM) or "lxc" (a container): both hold VMIDs.
	Type   string
	Name   string
	Node   string
	Status string
	Tags   []string
	// Lock is the config lock ("create", "backup", ...), if any.
	Lock     string
	Template bool
	MaxMem   int64
	MaxCPU   int
}

// HasTag reports whether the VM carries tag.
func (v VMSummary) HasTag(tag string) bool {
	for _, t := range v.Tags {
		if strings.EqualFold(t, tag) {
			return true
		}
	}
	return false
}

// ListVMs lists every guest, VM or container, the token can see
// (VM.Audit) in the cluster. Name and status come from pvestatd's 10 s
// broadcast (PVE::API2Tools::extract_vm_stats): a guest just created shows
// no name and status "unknown" for a while; read its config and
// status/current where it matters.
func (c *Client) ListVMs(ctx context.Context) ([]VMSummary, error) {
	list, err := c.getList(ctx, "/cluster/resources?type=vm")
	if err != nil {
		return nil, err
	}
	var out []VMSummary
	for _, e := range list {
		t := str(e["type"])
		if t != "qemu" && t != "lxc" {
			continue
		}
		out = append(out, VMSummary{
			VMID: int(num(e["vmid"])), Type: t, Name: str(e["name"]), Node: str(e["node"]), Status: str(e["status"]),
			Tags: splitTags(str(e["tags"])), Lock: str(e["lock"]), Template: num(e["template"]) == 1,
			MaxMem: num(e["maxmem"]), MaxCPU: int(num(e["maxcpu"])),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].VMID < out[j].VMID })
	return out, nil
}

// FindClusterVMs lists the VMs tagged as cluster's.
func (c *Client) FindClusterVMs(ctx context.Context, cluster string) ([]VMSummary, error) {
	all, err := c.ListVMs(ctx)
	if err != nil {
		return nil, err
	}
	return ClusterVMs(all, cluster), nil
}

// ClusterVMs picks from a listing the VMs tagged as cluster's.
func ClusterVMs(all []VMSummary, cluster string) []VMSummary {
	var out []VMSummary
	for _, v := range all {
		if v.Type == "qemu" && v.HasTag(ClusterTag(cluster)) {
			out = append(out, v)
		}
	}
	return out
}

func splitTags(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == ',' || r == ' ' })
}

// VMStatus is GET .../status/current.
type VMStatus struct {
	VMID   int
	Name   string
	Status string
	Lock   string
	Tags   []string
	// HAManaged: the VM is an HA resource (vmstatus "ha": {"managed": 1},
	// qemu-server src/PVE/QemuServer.pm): HA starts and stops it.
	HAManaged bool
}

// Running reports whether the VM runs.
func (s VMStatus) Running() bool { return s.Status == "running" }

// Status reads a VM's power state and lock.
func (c *Client) Status(ctx context.Context, vmid int) (VMStatus, error) {
	return c.statusOn(ctx, c.node, vmid)
}

// statusOn reads the status of a VM on node: every call about a VM goes
// to the node that runs it; on another node's path PVE finds no config
// ("Configuration file 'nodes/<node>/qemu-server/<vmid>.conf' does not
// exist", which IsNotFound reads as gone).
func (c *Client) statusOn(ctx context.Context, node string, vmid int) (VMStatus, error) {
	m, err := c.getMap(ctx, vmPathOn(node, vmid)+"/status/current")
	if err != nil {
		return VMStatus{}, err
	}
	ha, _ := m["ha"].(map[string]any)
	return VMStatus{VMID: vmid, Name: str(m["name"]), Status: str(m["status"]), Lock: str(m["lock"]), Tags: splitTags(str(m["tags"])),
		HAManaged: num(ha["managed"]) == 1}, nil
}

func (c *Client) vmPath(vmid int) string { return vmPathOn(c.node, vmid) }

func vmPathOn(node string, vmid int) string { return fmt.Sprintf("/nodes/%s/qemu/%d", node, vmid) }

// DiskInfo is the VM's install disk.
type DiskInfo struct {
	Slot      string // "scsi0"
	Bus       string // "scsi"
	Storage   string
	Volume    string
	SizeBytes int64
}

// NetInfo is net0.
type NetInfo struct {
	Model  string
	MAC    string
	Bridge string
	VLAN   int
}

// VMConfig is a VM's configuration; Current is what the VM runs with,
// Effective includes changes pending until its next start.
type VMConfig struct {
	VMID      int
	Digest    string
	Current   map[string]string
	Effective map[string]string

	Name        string
	Tags        []string
	Cores       int
	Sockets     int
	CPU         string
	MemoryMiB   int
	SCSIHW      string
	Agent       string
	Boot        string
	Lock        string
	Disk        *DiskInfo
	CDROM       string
	CloudInit   string
	Net         NetInfo
	IPConfig0   string
	IPv4        netip.Prefix
	Gateway     netip.Addr
	Nameservers []string
}

// PendingValue returns the effective value of key and whether it differs
// from what the VM currently runs with.
func (c *VMConfig) PendingValue(key string) (string, bool) {
	return c.Effective[key], c.Effective[key] != c.Current[key]
}

// VMConfig reads a VM's config with its pending changes (GET .../pending).
func (c *Client) VMConfig(ctx context.Context, vmid int) (*VMConfig, error) {
	list, err := c.getList(ctx, c.vmPath(vmid)+"/pending")
	if err != nil {
		return nil, err
	}
	cfg := &VMConfig{VMID: vmid, Current: map[string]string{}, Effective: map[string]string{}}
	for _, e := range list {
		k := str(e["key"])
		if k == "digest" {
			cfg.Digest = str(e["value"])
			continue
		}
		if v, ok := e["value"]; ok {
			cfg.Current[k] = str(v)
			cfg.Effective[k] = str(v)
		}
		if v, ok := e["pending"]; ok {
			cfg.Effective[k] = str(v)
		}
		if num(e["delete"]) > 0 {
			delete(cfg.Effective, k)
		}
	}
	cfg.parse()
	return cfg, nil
}

func (c *VMConfig) parse() {
	e := c.Effective
	c.Name, c.Tags, c.CPU, c.SCSIHW, c.Agent, c.Boot, c.Lock = e["name"], splitTags(e["tags"]), e["cpu"], e["scsihw"], e["agent"], e["boot"], e["lock"]
	c.Cores = atoiOr(e["cores"], 1)
	c.Sockets = atoiOr(e["sockets"], 1)
	c.MemoryMiB = atoiOr(strings.TrimPrefix(e["memory"], "current="), 512)
	for _, slot := range []string{"scsi0", "virtio0", "sata0", "ide0"} {
		if v := e[slot]; v != "" {
			d := parseDriveString(v)
			if d.opts["media"] == "cdrom" {
				continue
			}
			st, vol, _ := strings.Cut(d.file, ":")
			size, _ := parseSize(d.opts["size"])
			c.Disk = &DiskInfo{Slot: slot, Bus: strings.TrimRight(slot, "0123456789"), Storage: st, Volume: vol, SizeBytes: size}
			break
		}
	}
	for k, v := range e {
		if !strings.HasPrefix(k, "ide") && !strings.HasPrefix(k, "sata") && !strings.HasPrefix(k, "scsi") {
			continue
		}
		d := parseDriveString(v)
		if d.opts["media"] != "cdrom" {
			continue
		}
		st, vol, _ := strings.Cut(d.file, ":")
		if strings.Contains(vol, "cloudinit") {
			c.CloudInit = st
		} else if k == "ide2" {
			c.CDROM = d.file
		}
	}
	if n := e["net0"]; n != "" {
		for i, part := range strings.Split(n, ",") {
			k, v, _ := strings.Cut(part, "=")
			switch {
			case i == 0:
				c.Net.Model, c.Net.MAC = k, strings.ToUpper(v)
			case k == "macaddr":
				c.Net.MAC = strings.ToUpper(v)
			case k == "bridge":
				c.Net.Bridge = v
			case k == "tag":
				c.Net.VLAN, _ = strconv.Atoi(v)
			}
		}
	}
	c.IPConfig0 = e["ipconfig0"]
	for _, part := range strings.Split(c.IPConfig0, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "ip":
			c.IPv4, _ = netip.ParsePrefix(v)
		case "gw":
			c.Gateway, _ = netip.ParseAddr(v)
		}
	}
	c.Nameservers = strings.Fields(e["nameserver"])
}

type driveString struct {
	file string
	opts map[string]string
}

func parseDriveString(v string) driveString {
	d := driveString{opts: map[string]string{}}
	for i, part := range strings.Split(v, ",") {
		k, val, hasEq := strings.Cut(part, "=")
		if i == 0 && !hasEq {
			d.file = part
			continue
		}
		if k == "file" {
			d.file = val
			continue
		}
		d.opts[k] = val
	}
	return d
}

// parseSize reads PVE sizes ("32G", "512M", "4096").
func parseSize(v string) (int64, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	mult := int64(1)
	switch strings.ToUpper(v[len(v)-1:]) {
	case "K":
		mult = 1 << 10
	case "M":
		mult = 1 << 20
	case "G":
		mult = 1 << 30
	case "T":
		mult = 1 << 40
	}
	if mult != 1 {
		v = v[:len(v)-1]
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, false
	}
	return int64(f * float64(mult)), true
}

func atoiOr(v string, def int) int {
	n, err := strconv.Atoi(v)
	if err != nil {
		return def
	}
	return n
}

// Start boots a VM and waits until it runs; an already running VM is
// left alone. Lock errors and transient failures are retried. The start
// task's end is not enough: for an HA-managed VM the start is a 'hastart'
// task that only sets the requested state (`ha-manager set vm:<id>
// --state started`, qemu-server 9.2.6 src/PVE/API2/Qemu.pm vm_start), and
// the HA stack starts the VM a CRM round later, so its status is polled
// until it reads running.
func (c *Client) Start(ctx context.Context, vmid int) error {
	unlock, err := c.lockVM(ctx, vmid)
	if err != nil {
		return err
	}
	defer unlock()
	what := fmt.Sprintf("VM %d start", vmid)
	if err := c.startTask(ctx, vmid, what); err != nil {
		return err
	}
	return wait.Until(ctx, wait.Spec{What: fmt.Sprintf("VM %d to run (an HA-managed VM starts a CRM round after its start is requested)", vmid),
		Timeout: c.opts.TaskTimeout, Interval: c.opts.TaskPoll, MaxInterval: c.opts.TaskPollMax, Log: c.log},
		func(ctx context.Context) (bool, string, error) {
			st, err := c.Status(ctx, vmid)
			if err != nil {
				return false, "", err
			}
			return st.Running(), "status " + st.Status, nil
		})
}

// startTask asks for the start and waits for its task.
func (c *Client) startTask(ctx context.Context, vmid int, what string) error {
	return retry.Do(ctx, c.opts.Retry, c.log, what, func(ctx context.Context) error {
		st, err := c.Status(ctx, vmid)
		if err != nil {
			return err
		}
		if st.Running() {
			return nil
		}
		upid, err := c.post(ctx, c.vmPath(vmid)+"/status/start", nil)
		if err != nil {
			return err
		}
		err = c.waitTask(ctx, upid, what, c.opts.TaskTimeout)
		var te *TaskError
		if errors.As(err, &te) && strings.Contains(te.ExitStatus, "already running") {
			return nil
		}
		return err
	})
}

// Stop powers a VM off (like pulling the plug) and waits; a stopped VM is left alone.
func (c *Client) Stop(ctx context.Context, vmid int) error {
	unlock, err := c.lockVM(ctx, vmid)
	if err != nil {
		return err
	}
	defer unlock()
	return c.stopOn(ctx, c.node, vmid)
}

// stopOn stops a VM on node and waits until it is stopped. The task's end
// is not enough: for an HA-managed VM the stop is a 'hastop' task that
// only queues the request (`ha-manager crm-command stop`, qemu-server
// src/PVE/API2/Qemu.pm vm_stop) and the HA stack stops the VM a CRM round
// later, so its status is polled until it reads stopped.
func (c *Client) stopOn(ctx context.Context, node string, vmid int) error {
	what := fmt.Sprintf("VM %d stop", vmid)
	err := retry.Do(ctx, c.opts.Retry, c.log, what, func(ctx context.Context) error {
		st, err := c.statusOn(ctx, node, vmid)
		if err != nil {
			return err
		}
		if !st.Running() && st.Status != "" {
			return nil
		}
		upid, err := c.post(ctx, vmPathOn(node, vmid)+"/status/stop", nil)
		if err != nil {
			return err
		}
		return c.waitTask(ctx, upid, what, c.opts.TaskTimeout)
	})
	if err != nil {
		return err
	}
	return wait.Until(ctx, wait.Spec{What: fmt.Sprintf("VM %d to be stopped (an HA-managed VM stops a CRM round after its stop is queued)", vmid),
		Timeout: c.opts.TaskTimeout, Interval: c.opts.TaskPoll, MaxInterval: c.opts.TaskPollMax, Log: c.log},
		func(ctx context.Context) (bool, string, error) {
			st, err := c.statusOn(ctx, node, vmid)
			if err != nil {
				return false, "", err
			}
			return !st.Running(), "status " + st.Status, nil
		})
}

// Delete removes a stopped VM and its disks and waits; a VM that no longer
// exists counts as deleted. It does not check ownership: see DestroyClusterVM.
func (c *Client) Delete(ctx context.Context, vmid int) error {
	unlock, err := c.lockVM(ctx, vmid)
	if err != nil {
		return err
	}
	defer unlock()
	return c.deleteOn(ctx, c.node, vmid)
}

// deleteOn destroys a stopped VM on node with its disks. purge also takes
// it out of the HA resources, which PVE requires of an HA-managed VM
// ("used in HA resources and purge parameter not set").
func (c *Client) deleteOn(ctx context.Context, node string, vmid int) error {
	what := fmt.Sprintf("VM %d delete", vmid)
	params := "?purge=1"
	offline, err := c.offlineImageStorages(ctx, node)
	if err != nil {
		return err
	}
	if len(offline) == 0 {
		params += "&destroy-unreferenced-disks=1"
	} else {
		c.log.Warn().Int("vmid", vmid).Strs("offline", offline).Msg("deleting the VM without looking for its unreferenced disks: a storage for VM disks is offline, and Proxmox would fail the delete after removing the VM's disks")
	}
	return retry.Do(ctx, c.opts.Retry, c.log, what, func(ctx context.Context) error {
		upid, err := c.del(ctx, vmPathOn(node, vmid)+params)
		if IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return c.waitTask(ctx, upid, what, c.opts.TaskTimeout)
	})
}

// offlineImageStorages names the enabled storages for VM disks on node
// that are not active. destroy-unreferenced-disks lists the VM's volumes
// on every such storage after deleting the disks its config names
// (qemu-server destroy_vm, vdisk_list), and an offline one ("storage 'x'
// is not online") fails the task there, leaving a VM without its disks.
// Storages the token cannot see are not listed, and not known here.
func (c *Client) offlineImageStorages(ctx context.Context, node string) ([]string, error) {
	list, err := c.getList(ctx, "/nodes/"+node+"/storage?content=images")
	if err != nil {
		return nil, fmt.Errorf("listing the storages of node %s: %w", node, err)
	}
	var out []string
	for _, e := range list {
		if num(e["enabled"]) == 1 && num(e["active"]) != 1 {
			out = append(out, str(e["storage"]))
		}
	}
	sort.Strings(out)
	return out, nil
}

// DestroyClusterVM stops and deletes a VM only if it carries cluster's tag,
// checked right before acting, on the node that runs it (v.Node, from
// /cluster/resources; this client's node when empty); a missing VM is not
// an error. An HA-managed VM leaves the cluster's separation rule
// (harules.go) and is taken out of HA first (DELETE
// /cluster/ha/resources/vm:<id>, Sys.Console on /), so HA neither restarts
// nor relocates it while it goes; without that privilege HA stops it and
// the purging delete removes it from HA.
func (c *Client) DestroyClusterVM(ctx context.Context, cluster string, v VMSummary) error {
	vmid, node := v.VMID, v.Node
	if node == "" {
		node = c.node
	}
	unlock, err := c.lockVM(ctx, vmid)
	if err != nil {
		return err
	}
	defer unlock()
	st, node, err := c.statusWhere(ctx, node, vmid)
	if IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	owned := false
	for _, t := range st.Tags {
		if strings.EqualFold(t, ClusterTag(cluster)) {
			owned = true
		}
	}
	if !owned {
		return fmt.Errorf("refusing to destroy VM %d (%s) on node %s: it has no tag %s", vmid, st.Name, node, ClusterTag(cluster))
	}
	if st.HAManaged {
		if err := c.dropFromSeparation(ctx, cluster, vmid); err != nil {
			c.log.Warn().Int("vmid", vmid).Err(err).Msg("cannot take the VM out of the HA rule that keeps the control planes apart: the next provision run sets the rule")
		}
		_, err := c.del(ctx, fmt.Sprintf("/cluster/ha/resources/vm:%d", vmid))
		switch {
		case err == nil:
			c.log.Info().Int("vmid", vmid).Msg("removed the VM from the HA resources")
		case IsForbidden(err):
			c.log.Warn().Int("vmid", vmid).Err(err).Msg("cannot take the VM out of HA: HA stops it, and the delete purges it from HA")
		default:
			return fmt.Errorf("removing VM %d from the HA resources: %w", vmid, err)
		}
	}
	if err := c.stopOn(ctx, node, vmid); err != nil {
		return err
	}
	return c.deleteOn(ctx, node, vmid)
}

// EjectISO empties a VM's cdrom drive (ide2: none,media=cdrom) and says
// whether it held anything. Talos needs the ISO only until it is installed
// to the disk, and QemuMigrate refuses to move a VM whose cdrom holds a
// volume on storage that is not shared ("local cdrom image", qemu-server
// 9.2.6 src/PVE/QemuMigrate.pm), the user's migration and HA's alike.
// The change needs VM.Config.CDROM on the VM (update_vm's
// $check_drive_perms, qemu-server 9.2.6 src/PVE/API2/Qemu.pm), which the
// create of an ISO-booted VM does not ask: create_vm's
// $check_vm_modify_config_perm skips drives, and a cdrom's volume is
// judged by $check_storage_access alone. The runner role lacks it.
func (c *Client) EjectISO(ctx context.Context, vmid int) (bool, error) {
	unlock, err := c.lockVM(ctx, vmid)
	if err != nil {
		return false, err
	}
	defer unlock()
	cfg, err := c.VMConfig(ctx, vmid)
	if err != nil {
		return false, err
	}
	if cfg.CDROM == "" || cfg.CDROM == "none" {
		return false, nil
	}
	what := fmt.Sprintf("VM %d ISO eject", vmid)
	params := map[string]any{"ide2": "none,media=cdrom", "digest": cfg.Digest}
	return true, retry.Do(ctx, c.opts.Retry, c.log, what, func(ctx context.Context) error {
		upid, err := c.put(ctx, c.vmPath(vmid)+"/config", params)
		if err != nil {
			return err
		}
		return c.waitTask(ctx, upid, what, c.opts.TaskTimeout)
	})
}

// statusWhere reads a VM's status on node, or on the member it moved to:
// its config lives in nodes/<node>/qemu-server/<vmid>.conf, so a VM
// migrated since a listing reads "does not exist" on the member listed
// (load_config in pve-guest-common 6.0.2 src/PVE/AbstractConfig.pm, with
// qemu-server 9.2.6 src/PVE/QemuConfig.pm cfs_config_path). The cluster listing
// says where it is now; a NotFound error is returned only when it is
// listed nowhere, with where the VM was found.
func (c *Client) statusWhere(ctx context.Context, node string, vmid int) (VMStatus, string, error) {
	for moves := 0; ; moves++ {
		st, err := c.statusOn(ctx, node, vmid)
		if !IsNotFound(err) {
			return st, node, err
		}
		vms, lerr := c.ListVMs(ctx)
		if lerr != nil {
			return VMStatus{}, node, lerr
		}
		now := ""
		for _, v := range vms {
			if v.VMID == vmid && v.Type == "qemu" {
				now = v.Node
			}
		}
		switch {
		case now == "":
			return st, node, err
		case now == node || moves >= 3:
			return VMStatus{}, node, fmt.Errorf("VM %d is listed on %s, but its status cannot be read there (a migration under way?): %v", vmid, now, err)
		}
		c.log.Info().Int("vmid", vmid).Str("from", node).Str("to", now).Msg("the VM moved since it was listed: acting on the member that runs it")
		node = now
	}
}

// waitUnlocked waits until a VM's config lock (e.g. "create" from a run that
// was interrupted while PVE kept creating) clears or the VM disappears.
func (c *Client) waitUnlocked(ctx context.Context, vmid int, lock string) (exists bool, err error) {
	err = wait.Until(ctx, wait.Spec{What: fmt.Sprintf("VM %d lock %q to clear", vmid, lock), Timeout: c.opts.TaskTimeout, Interval: c.opts.TaskPoll, MaxInterval: c.opts.TaskPollMax, Log: c.log},
		func(ctx context.Context) (bool, string, error) {
			st, err := c.Status(ctx, vmid)
			if IsNotFound(err) {
				exists = false
				return true, "gone", nil
			}
			if err != nil {
				return false, "", err
			}
			exists = true
			return st.Lock == "", "lock " + st.Lock, nil
		})
	return exists, err
}

// AgentPing asks the VM's QEMU guest agent to answer (POST
// …/qemu/{vmid}/agent/ping). Proxmox refuses with "No QEMU guest agent
// configured" when the VM has no agent option, "VM … is not running", or
// "QEMU guest agent is not running" when nothing answers in the guest
// (assert_agent_available in qemu-server src/PVE/QemuServer/Agent.pm at
// 9.2.6; the privilege is VM.GuestAgent.Audit on PVE 9, VM.Monitor before).
// A transient answer (a lock, pveproxy's 503 while a backend restarts)
// is asked again as every other call is: once, it made the nightly's
// guest-agent row warn about an agent that answered the next second.
func (c *Client) AgentPing(ctx context.Context, vmid int) error {
	return retry.Do(ctx, c.opts.Retry, c.log, fmt.Sprintf("VM %d guest agent ping", vmid), func(ctx context.Context) error {
		_, err := c.post(ctx, c.vmPath(vmid)+"/agent/ping", map[string]any{})
		return err
	})
}

// AddToHA makes VM vmid a Proxmox HA resource with the requested state
// started (POST /cluster/ha/resources, Sys.Console on /; pve-ha-manager
// 5.2.0 src/PVE/API2/HA/Resources.pm create): the HA stack then restarts
// it, on another member when its host fails. A resource defined already
// (by an earlier, interrupted run) is fine.
func (c *Client) AddToHA(ctx context.Context, vmid int) error {
	_, err := c.post(ctx, "/cluster/ha/resources", map[string]any{"sid": fmt.Sprintf("vm:%d", vmid), "state": "started"})
	if err != nil && strings.Contains(err.Error(), "already defined") {
		return nil
	}
	if err != nil {
		return fmt.Errorf("adding VM %d to the HA resources: %w", vmid, err)
	}
	return nil
}
