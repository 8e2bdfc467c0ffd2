package proxmox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/homelab/bootstrap/internal/retry"
	"golang.org/x/sync/errgroup"
)

// DriftKind says what ensure does about a difference between spec and VM.
type DriftKind string

// The drift kinds.
const (
	// DriftFix differences are safe to change and are changed.
	DriftFix DriftKind = "fix"
	// DriftReport differences are shown and left alone (harmless once the
	// node is installed: ISO, nameservers, CPU model, ...).
	DriftReport DriftKind = "report"
	// DriftRefuse differences would break the node or lose data (disk
	// shrink, other storage, other network identity); ensure stops.
	DriftRefuse DriftKind = "refuse"
)

// Drift is one difference between the spec and the existing VM.
type Drift struct {
	Field string
	Want  string
	Have  string
	Kind  DriftKind
	// Pending means the wanted value is already set and waits for the VM's
	// next restart.
	Pending bool
	Why     string
}

func (d Drift) String() string {
	s := fmt.Sprintf("%s: have %s, want %s", d.Field, d.Have, d.Want)
	if d.Pending {
		s = fmt.Sprintf("%s: %s set, applies at next restart (running with %s)", d.Field, d.Want, d.Have)
	}
	if d.Why != "" {
		s += " (" + d.Why + ")"
	}
	return s
}

// ForeignVMError means a VMID or name the spec needs is held by a VM that
// is not this cluster's (or not this node's).
type ForeignVMError struct {
	Spec  VMSpec
	Other VMSummary
	What  string
}

func (e *ForeignVMError) Error() string {
	return fmt.Sprintf("VM %s (vmid %d): %s; refusing to touch it", e.Spec.Name, e.Spec.VMID, e.What)
}

// UnsafeDriftError lists differences ensure will not change by itself.
type UnsafeDriftError struct {
	Spec  VMSpec
	Drift []Drift
}

func (e *UnsafeDriftError) Error() string {
	parts := make([]string, len(e.Drift))
	for i, d := range e.Drift {
		parts[i] = d.String()
	}
	return fmt.Sprintf("VM %d %s differs from the config in ways bootstrap will not change by itself: %s; change the VM in Proxmox to match, or fix the config (bootstrap never deletes or recreates a VM on its own)",
		e.Spec.VMID, e.Spec.Name, strings.Join(parts, "; "))
}

// Plan is what ensuring one VM would do. Computing it only reads.
type Plan struct {
	Spec VMSpec
	// Create: the VM does not exist yet.
	Create bool
	// Adopt: a VM of this cluster with the spec's VMID and name exists.
	Adopt bool
	// WaitCreate: PVE is still creating the VM (lock "create"), e.g. for a
	// run that was interrupted; apply waits and plans again.
	WaitCreate bool
	// Update holds config options to change (PUT .../config).
	Update map[string]string
	// GrowDisk is the new install disk size in bytes (0: unchanged).
	GrowDisk int64
	// Start: the VM exists (or will) and is not running.
	Start  bool
	Drift  []Drift
	Status string
	Config *VMConfig
	// HAManaged: the VM is already a Proxmox HA resource.
	HAManaged bool
	// Elsewhere names the member the spec asked for when this cluster's
	// VM was found running on another one (migrated by the user or by
	// HA): the VM is adopted where it is (Spec.Node), never created again.
	Elsewhere string
}

// Refused returns the unsafe drift as an error, or nil.
func (p Plan) Refused() error {
	var bad []Drift
	for _, d := range p.Drift {
		if d.Kind == DriftRefuse {
			bad = append(bad, d)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return &UnsafeDriftError{Spec: p.Spec, Drift: bad}
}

// Changes describes the mutations apply would make (start not included),
// one line each, for dry runs and change records.
func (p Plan) Changes() []string {
	s := p.Spec
	var out []string
	switch {
	case p.Create && s.Image != "":
		out = append(out, fmt.Sprintf("create VM %d %s (%d cores, %d MiB, %s disk on %s imported from %s and grown to %d GiB, %s on %s%s, MAC %s)",
			s.VMID, s.Name, s.Cores, s.MemoryMiB, s.Bus(), s.DiskStorage, s.Image, s.DiskGiB, s.IPv4, s.Bridge, vlanSuffix(s.VLAN), s.EffectiveMAC()))
	case p.Create:
		out = append(out, fmt.Sprintf("create VM %d %s (%d cores, %d MiB, %d GiB %s disk on %s, %s on %s%s, MAC %s)",
			s.VMID, s.Name, s.Cores, s.MemoryMiB, s.DiskGiB, s.Bus(), s.DiskStorage, s.IPv4, s.Bridge, vlanSuffix(s.VLAN), s.EffectiveMAC()))
	}
	if p.Create {
		out = append(out, s.extrasChanges()...)
	}
	switch {
	case p.WaitCreate:
		out = append(out, fmt.Sprintf("wait for PVE to finish creating VM %d %s, then adopt it", s.VMID, s.Name))
	}
	if len(p.Update) > 0 {
		var parts []string
		for _, d := range p.Drift {
			if d.Kind == DriftFix && !d.Pending && d.Field != "disk size" {
				parts = append(parts, fmt.Sprintf("%s %s → %s", d.Field, d.Have, d.Want))
			}
		}
		out = append(out, fmt.Sprintf("update VM %d %s: %s", s.VMID, s.Name, strings.Join(parts, ", ")))
	}
	if p.GrowDisk > 0 {
		out = append(out, fmt.Sprintf("grow VM %d %s disk %s to %s", s.VMID, s.Name, s.DiskSlot(), sizeString(p.GrowDisk)))
	}
	return out
}

func vlanSuffix(v int) string {
	if v == 0 {
		return ""
	}
	return fmt.Sprintf(" VLAN %d", v)
}

// PlanVMs plans every spec (PlanVM); plans[i] and errs[i] are specs[i]'s.
// Each plan is its own reads (a new VM's VMID question, an existing one's
// config and status): asked a few at a time, the plans take about the
// slowest one's time, not one plan per VM in a row.
func (c *Client) PlanVMs(ctx context.Context, specs []VMSpec, vms []VMSummary) ([]Plan, []error) {
	plans, errs := make([]Plan, len(specs)), make([]error, len(specs))
	var g errgroup.Group
	g.SetLimit(planConcurrency)
	for i, s := range specs {
		g.Go(func() error {
			plans[i], errs[i] = c.PlanVM(ctx, s, vms)
			return nil
		})
	}
	_ = g.Wait() // each plan's error is in errs
	return plans, errs
}

// planConcurrency bounds the VM plans asked at once.
const planConcurrency = 8

// PlanVM decides how to bring one VM to spec, reading only. vms is the
// cluster-wide VM list (ListVMs), shared between the specs of one run.
func (c *Client) PlanVM(ctx context.Context, spec VMSpec, vms []VMSummary) (Plan, error) {
	c = c.On(spec.Node)
	spec.Node = c.node
	p := Plan{Spec: spec}
	if err := spec.Validate(); err != nil {
		return p, err
	}
	tag := ClusterTag(spec.Cluster)
	var byID *VMSummary
	for i := range vms {
		v := vms[i]
		if v.VMID == spec.VMID {
			byID = &vms[i]
			continue
		}
		if v.Type != "qemu" {
			continue
		}
		name, err := c.guestName(ctx, v)
		if err != nil {
			return p, err
		}
		if name == spec.Name {
			if v.HasTag(tag) {
				return p, &ForeignVMError{Spec: spec, Other: v, What: fmt.Sprintf("this cluster's VM named %s already exists with vmid %d; set that vmid in the config or destroy VM %d", spec.Name, v.VMID, v.VMID)}
			}
			return p, &ForeignVMError{Spec: spec, Other: v, What: fmt.Sprintf("the name %s is used by VM %d, which is not part of cluster %s (no tag %s)", spec.Name, v.VMID, spec.Cluster, tag)}
		}
	}
	if byID == nil {
		// /cluster/resources leaves out guests the token cannot VM.Audit;
		// /cluster/nextid?vmid= checks the whole cluster's VMID list for
		// any user (pve-manager PVE/API2/Cluster.pm nextid).
		if taken, err := c.VMIDTaken(ctx, spec.VMID); err != nil {
			return p, err
		} else if taken {
			return p, &ForeignVMError{Spec: spec, What: fmt.Sprintf("VMID %d is taken by a VM or container this token cannot audit (it needs VM.Audit on /vms/%d to see which); pick another vmid", spec.VMID, spec.VMID)}
		}
		p.Create, p.Start = true, true
		return p, nil
	}
	if byID.Type == "lxc" {
		return p, &ForeignVMError{Spec: spec, Other: *byID, What: fmt.Sprintf("CT %d exists (container %q on node %s): a container holds the vmid; pick another vmid", byID.VMID, byID.Name, byID.Node)}
	}
	if byID.Node != "" && byID.Node != c.node {
		if byID.HasTag(tag) {
			// Moved by a migration (the user's or HA's): every call about
			// it goes to the member that runs it now.
			moved := spec
			moved.Node = byID.Node
			mp, err := c.On(byID.Node).PlanVM(ctx, moved, vms)
			mp.Elsewhere = c.node
			return mp, err
		}
		return p, &ForeignVMError{Spec: spec, Other: *byID, What: fmt.Sprintf("vmid %d is used by VM %q on node %s, which is not part of cluster %s; pick another vmid", byID.VMID, byID.Name, byID.Node, spec.Cluster)}
	}
	if !byID.HasTag(tag) {
		// A VM PVE is still creating holds only the create lock: listed
		// without a name until pvestatd's next broadcast (10 s), then as
		// "VM <vmid>", the name vmstatus gives a VM without one
		// (qemu-server src/PVE/QemuServer.pm). Either is ours to wait for.
		if byID.Lock == "create" && (byID.Name == "" || byID.Name == fmt.Sprintf("VM %d", byID.VMID)) {
			p.WaitCreate, p.Start = true, true
			return p, nil
		}
		return p, &ForeignVMError{Spec: spec, Other: *byID, What: fmt.Sprintf("vmid %d is used by VM %q (tags %q), which is not part of cluster %s (no tag %s); pick another vmid", byID.VMID, byID.Name, strings.Join(byID.Tags, ";"), spec.Cluster, tag)}
	}
	cfg, err := c.VMConfig(ctx, spec.VMID)
	if err != nil {
		return p, fmt.Errorf("reading VM %d config: %w", spec.VMID, err)
	}
	// The listed status lags the VM by up to one pvestatd broadcast (10 s);
	// status/current is the VM's own.
	st, err := c.Status(ctx, spec.VMID)
	if err != nil {
		return p, fmt.Errorf("reading VM %d status: %w", spec.VMID, err)
	}
	p.Adopt, p.Config, p.Status, p.HAManaged = true, cfg, st.Status, st.HAManaged
	p.Start = !st.Running()
	p.Drift, p.Update, p.GrowDisk = diff(spec, cfg)
	return p, nil
}

// guestName is a listed VM's name; a VM not yet in a pvestatd broadcast
// is listed without one, so its config tells.
func (c *Client) guestName(ctx context.Context, v VMSummary) (string, error) {
	if v.Name != "" {
		return v.Name, nil
	}
	st, err := c.On(v.Node).Status(ctx, v.VMID)
	if err != nil {
		if IsNotFound(err) {
			return "", nil // gone since it was listed
		}
		return "", fmt.Errorf("reading the name of VM %d: %w", v.VMID, err)
	}
	return st.Name, nil
}

// VMIDTaken reports whether any guest in the cluster holds vmid, whether or
// not this token may see it.
func (c *Client) VMIDTaken(ctx context.Context, vmid int) (bool, error) {
	_, err := c.getData(ctx, fmt.Sprintf("/cluster/nextid?vmid=%d", vmid))
	if err == nil {
		return false, nil
	}
	// raise_param_exc({vmid => "VM <id> already exists"}): a 400.
	if pe := (*APIError)(nil); errors.As(err, &pe) && strings.Contains(pe.Params["vmid"], "already exists") {
		return true, nil
	}
	return false, fmt.Errorf("checking whether VMID %d is free: %w", vmid, err)
}

// diff compares spec with the VM's effective config.
func diff(s VMSpec, cfg *VMConfig) ([]Drift, map[string]string, int64) {
	var drift []Drift
	update := map[string]string{}
	// fix compares the effective value (with pending changes) and notes
	// when the wanted value only waits for a restart, so a re-run of a
	// running VM does not send the same change again.
	fix := func(field, key, want string, norm func(string) string) {
		cur, eff := norm(cfg.Current[key]), norm(cfg.Effective[key])
		switch {
		case eff == want && cur == want:
		case eff == want:
			drift = append(drift, Drift{Field: field, Want: want, Have: cur, Kind: DriftFix, Pending: true})
		default:
			drift = append(drift, Drift{Field: field, Want: want, Have: eff, Kind: DriftFix})
			update[key] = want
		}
	}
	same := func(v string) string { return v }
	intOr := func(def int) func(string) string {
		return func(v string) string { return strconv.Itoa(atoiOr(strings.TrimPrefix(v, "current="), def)) }
	}
	agentOn := func(v string) string {
		if v == "" || v == "0" || strings.HasPrefix(v, "0,") || strings.Contains(v, "enabled=0") {
			return "0"
		}
		return "1"
	}
	report := func(field, want, have, why string) {
		if want != have {
			drift = append(drift, Drift{Field: field, Want: want, Have: have, Kind: DriftReport, Why: why})
		}
	}
	refuse := func(field, want, have, why string) {
		if want != have {
			drift = append(drift, Drift{Field: field, Want: want, Have: have, Kind: DriftRefuse, Why: why})
		}
	}

	fix("name", "name", s.Name, same)
	fix("cores", "cores", strconv.Itoa(s.Cores), intOr(1))
	fix("memory", "memory", strconv.Itoa(s.MemoryMiB), intOr(512))
	fix("qemu agent", "agent", s.agent(), agentOn)
	// onboot is a PVE boolean: 1, yes, on or true (pve-common JSONSchema).
	fix("start at boot", "onboot", "1", func(v string) string {
		switch strings.ToLower(v) {
		case "1", "yes", "on", "true":
			return "1"
		}
		return "0"
	})
	// Required tags must be present; tags someone added by hand stay.
	have := map[string]bool{}
	for _, t := range cfg.Tags {
		have[strings.ToLower(t)] = true
	}
	union := append([]string(nil), cfg.Tags...)
	missing := false
	for _, t := range s.Tags() {
		if !have[t] {
			union = append(union, t)
			missing = true
		}
	}
	if missing {
		sort.Strings(union)
		drift = append(drift, Drift{Field: "tags", Want: strings.Join(union, ";"), Have: strings.Join(cfg.Tags, ";"), Kind: DriftFix})
		update["tags"] = strings.Join(union, ";")
	}

	var grow int64
	want := int64(s.DiskGiB) << 30
	switch d := cfg.Disk; {
	case d == nil:
		refuse("install disk", s.DiskSlot(), "none", "the VM has no disk")
	case d.Slot != s.DiskSlot():
		refuse("install disk", s.DiskSlot(), d.Slot, "another bus changes the device Talos installs to")
	default:
		refuse("disk storage", s.DiskStorage, d.Storage, "moving a disk is not done automatically")
		switch {
		case d.SizeBytes > want:
			refuse("disk size", sizeString(want), sizeString(d.SizeBytes), "disks are never shrunk")
		case d.SizeBytes < want && d.Storage == s.DiskStorage:
			drift = append(drift, Drift{Field: "disk size", Want: sizeString(want), Have: sizeString(d.SizeBytes), Kind: DriftFix})
			grow = want
		}
	}
	refuse("MAC", s.EffectiveMAC(), cfg.Net.MAC, "the node's network identity")
	refuse("bridge", s.Bridge, cfg.Net.Bridge, "the node's network")
	refuse("VLAN", strconv.Itoa(s.VLAN), strconv.Itoa(cfg.Net.VLAN), "the node's network")
	refuse("ipconfig0", s.ipconfig0(), cfg.IPConfig0, "the node's address")
	report("nameservers", strings.Join(s.Nameservers, " "), strings.Join(cfg.Nameservers, " "), "only read by a node without config")
	// A VM created from the disk image has no ISO drive: nothing to say.
	// Nor for one whose ISO was ejected once Talos was installed (EjectISO).
	if cfg.CDROM != "" && cfg.CDROM != "none" {
		report("ISO", s.ISOStorage+":iso/"+s.ISOFile, cfg.CDROM, "only used until Talos is installed")
	}
	// cpu is a property string ([cputype=]<type>,flags=+a;-b); without
	// one the type is kvm64 (qemu-server 9.2.6 CPUConfig.pm $cpu_fmt).
	cpu := parseDriveString(cfg.CPU)
	report("CPU type", s.CPUType(), cmp.Or(cpu.file, cpu.opts["cputype"], "kvm64"), "a VM keeps the CPU type it was created with; change it in Proxmox (it applies at the VM's next start) or replace the node (bootstrap node replace "+s.Name+")")
	report("CPU flags", flagSet(strings.Join(s.CPUFlags, ";")), flagSet(cpu.opts["flags"]), "a VM keeps the CPU flags it was created with; change them in Proxmox (qm set <vmid> --cpu <type>,flags=…; they apply at the VM's next start) or replace the node")
	reportHardware(s.Name, s.Hardware, cfg, report)
	reportExtras(s, cfg, report)
	reportPCI(s, cfg, report)
	reportSecurity(s, cfg, report, refuse)
	return drift, update, grow
}

// flagSet is a cpu option's flags in one order, so that the same flags
// given in another order are no difference.
func flagSet(flags string) string {
	if flags == "" {
		return ""
	}
	fs := strings.Split(flags, ";")
	slices.Sort(fs)
	return strings.Join(fs, ";")
}

// reportHardware reports where an existing VM's hardware differs from
// proxmox.vm: a VM keeps what it was created with (adopting one never
// changes it), and the report says how to change it. The values compared
// are Proxmox's defaults where the config leaves a key out (qemu-server's
// schema: bios seabios, machine pc, scsihw lsi; no balloon key keeps the
// balloon device).
func reportHardware(name string, hw Hardware, cfg *VMConfig, report func(field, want, have, why string)) {
	replace := "bootstrap node replace " + name
	keep := "a VM keeps the hardware it was created with; change it in Proxmox (it applies at the VM's next start) or replace the node (" + replace + ")"
	e := cfg.Effective
	// Talos picks its bootloader by the firmware it was installed under
	// (systemd-boot under UEFI, GRUB otherwise: bootloader.go NewAuto at
	// v1.13.3); whether it boots after a switch is unverified.
	report("firmware", hw.BIOSType(), cmp.Or(e["bios"], "seabios"), "Talos installed the bootloader of the firmware it booted with: replace the node ("+replace+") rather than switch the firmware under it")
	// machine is a property string from PVE 8 on ([type=]<type>,viommu=…).
	m := parseDriveString(cmp.Or(e["machine"], "pc"))
	machine := cmp.Or(m.file, m.opts["type"])
	report("machine type", hw.MachineType(), machine, keep)
	report("SCSI controller", hw.Controller(), cmp.Or(cfg.SCSIHW, "lsi"), keep)
	onOff := func(on bool) string {
		if on {
			return "on"
		}
		return "off"
	}
	report("ballooning", onOff(hw.Ballooning), onOff(e["balloon"] != "0"), keep)
	report("RNG", onOff(hw.RNG), onOff(e["rng0"] != ""), keep)
}

func sizeString(b int64) string {
	if b%(1<<30) == 0 {
		return fmt.Sprintf("%dG", b>>30)
	}
	return fmt.Sprintf("%dM", b>>20)
}

// Result is the outcome of ensuring one VM.
type Result struct {
	VMID        int
	Name        string
	MAC         string
	IP          string
	DiskBus     string
	InstallDisk string
	Created     bool
	Adopted     bool
	// Changed lists what was changed, one line each.
	Changed []string
	Drift   []Drift
}

func resultFor(p Plan) Result {
	return Result{VMID: p.Spec.VMID, Name: p.Spec.Name, MAC: p.Spec.EffectiveMAC(), IP: p.Spec.IPv4.Addr().String(),
		DiskBus: p.Spec.Bus(), InstallDisk: p.Spec.InstallDisk(), Drift: p.Drift}
}

// ApplyPlan carries out a plan's create or update (not the start); it
// refuses unsafe drift. Safe to repeat: a lost answer to a create is
// recovered by adopting the VM it made.
func (c *Client) ApplyPlan(ctx context.Context, p Plan) (Result, error) {
	c = c.On(p.Spec.Node)
	unlock, err := c.lockVM(ctx, p.Spec.VMID)
	if err != nil {
		return Result{}, err
	}
	defer unlock()
	return c.applyLocked(ctx, p, 0)
}

func (c *Client) applyLocked(ctx context.Context, p Plan, depth int) (Result, error) {
	res := resultFor(p)
	if depth > 2 {
		return res, fmt.Errorf("VM %d %s: state keeps changing under bootstrap; giving up", p.Spec.VMID, p.Spec.Name)
	}
	replan := func() (Result, error) {
		vms, err := c.ListVMs(ctx)
		if err != nil {
			return res, err
		}
		np, err := c.PlanVM(ctx, p.Spec, vms)
		if err != nil {
			return res, err
		}
		return c.applyLocked(ctx, np, depth+1)
	}
	if p.WaitCreate {
		c.log.Info().Int("vmid", p.Spec.VMID).Msg("PVE is still creating this VM (interrupted run?); waiting for it")
		if _, err := c.waitUnlocked(ctx, p.Spec.VMID, "create"); err != nil {
			return res, err
		}
		return replan()
	}
	if err := p.Refused(); err != nil {
		return res, err
	}
	s := p.Spec
	if p.Create {
		what := fmt.Sprintf("VM %d %s create", s.VMID, s.Name)
		err := retry.Do(ctx, c.opts.Retry, c.log, what, func(ctx context.Context) error {
			upid, err := c.post(ctx, "/nodes/"+c.node+"/qemu", s.createParams())
			if err != nil {
				return err
			}
			return c.waitTask(ctx, upid, what, c.opts.TaskTimeout)
		})
		if IsAlreadyExists(err) {
			// Our earlier attempt may have created it with its answer lost,
			// or another VM took the ID since we listed: look again.
			c.log.Warn().Int("vmid", s.VMID).Msg("VMID already taken at create; checking whose VM it is")
			if _, werr := c.waitUnlocked(ctx, s.VMID, "create"); werr != nil {
				return res, werr
			}
			return replan()
		}
		var ae *APIError
		if errors.As(err, &ae) && ae.Status == 403 {
			if _, _, named := ae.MissingPrivilege(); !named {
				// create_vm's own check raises a bare "Permission check
				// failed" when VM.Allocate is missing on /vms/<id> and
				// the pool (qemu-server 9.2.6 src/PVE/API2/Qemu.pm);
				// other 403s name their privilege themselves.
				return res, fmt.Errorf("creating VM %d %s: %w (creating a VM needs VM.Allocate on /vms/%d; precheck lists every missing privilege)", s.VMID, s.Name, err, s.VMID)
			}
		}
		if err != nil {
			return res, fmt.Errorf("creating VM %d %s: %w", s.VMID, s.Name, err)
		}
		if s.Image != "" {
			// The imported disk has the image's size: Talos puts STATE
			// and EPHEMERAL on it at its first boot, so it is grown first
			// (a run killed before this grows it when it adopts the VM).
			if err := c.growDisk(ctx, s, int64(s.DiskGiB)<<30); err != nil {
				return res, err
			}
		}
		res.Created = true
		res.Changed = append(res.Changed, p.Changes()...)
		return res, nil
	}
	res.Adopted = true
	if len(p.Update) > 0 {
		params := map[string]any{}
		for k, v := range p.Update {
			params[k] = v
		}
		what := fmt.Sprintf("VM %d %s config update", s.VMID, s.Name)
		err := retry.Do(ctx, c.opts.Retry, c.log, what, func(ctx context.Context) error {
			upid, err := c.put(ctx, c.vmPath(s.VMID)+"/config", params)
			if err != nil {
				return err
			}
			return c.waitTask(ctx, upid, what, c.opts.TaskTimeout)
		})
		if err != nil {
			return res, fmt.Errorf("updating VM %d %s: %w", s.VMID, s.Name, err)
		}
	}
	if p.GrowDisk > 0 {
		if err := c.growDisk(ctx, s, p.GrowDisk); err != nil {
			return res, err
		}
	}
	res.Changed = append(res.Changed, p.Changes()...)
	return res, nil
}

// growDisk resizes the VM's install disk to size bytes (PUT …/resize with
// an absolute size, so a repeat asks for the same).
func (c *Client) growDisk(ctx context.Context, s VMSpec, size int64) error {
	what := fmt.Sprintf("VM %d %s disk resize", s.VMID, s.Name)
	params := map[string]any{"disk": s.DiskSlot(), "size": sizeString(size)}
	err := retry.Do(ctx, c.opts.Retry, c.log, what, func(ctx context.Context) error {
		upid, err := c.put(ctx, c.vmPath(s.VMID)+"/resize", params)
		if err != nil {
			return err
		}
		return c.waitTask(ctx, upid, what, c.opts.TaskTimeout)
	})
	if err != nil {
		return fmt.Errorf("growing VM %d %s disk: %w", s.VMID, s.Name, err)
	}
	return nil
}

// EnsureVM plans and applies one spec (without starting the VM).
func (c *Client) EnsureVM(ctx context.Context, spec VMSpec) (Result, error) {
	vms, err := c.ListVMs(ctx)
	if err != nil {
		return Result{}, err
	}
	p, err := c.PlanVM(ctx, spec, vms)
	if err != nil {
		return resultFor(p), err
	}
	return c.ApplyPlan(ctx, p)
}

// ISOSource is the Talos ISO a run needs on a storage.
type ISOSource struct {
	Storage           string
	Filename          string
	URL               string
	Checksum          string
	ChecksumAlgorithm string
}

// EnsureISO downloads the ISO unless it is already on the storage; it
// reports whether it downloaded.
func (c *Client) EnsureISO(ctx context.Context, src ISOSource) (bool, error) {
	_, ok, err := c.FindISO(ctx, src.Storage, src.Filename)
	if err != nil {
		return false, err
	}
	if ok {
		return false, nil
	}
	err = c.FetchISO(ctx, src)
	return err == nil, err
}

// FetchISO downloads an ISO its caller has just found missing (EnsureISO
// without the look). A file another task stored meanwhile counts as
// fetched.
func (c *Client) FetchISO(ctx context.Context, src ISOSource) error {
	return c.fetchFile(ctx, src, "iso", "ISO", func(ctx context.Context) (bool, error) {
		_, ok, err := c.FindISO(ctx, src.Storage, src.Filename)
		return ok, err
	})
}

// FetchImage downloads the Talos disk image its caller has just found
// missing on the image's storage, as content import (FetchISO's rules).
func (c *Client) FetchImage(ctx context.Context, src ISOSource) error {
	return c.fetchFile(ctx, src, "import", "disk image", func(ctx context.Context) (bool, error) {
		return c.FindImage(ctx, src.Storage, src.Filename)
	})
}

// fetchFile downloads src as content; found looks for the file.
func (c *Client) fetchFile(ctx context.Context, src ISOSource, content, what string, found func(context.Context) (bool, error)) error {
	if src.URL == "" {
		return fmt.Errorf("%s %s is not on storage %s and no download URL is configured", what, src.Filename, src.Storage)
	}
	err := c.DownloadISO(ctx, DownloadRequest{Storage: src.Storage, URL: src.URL, Filename: src.Filename, Checksum: src.Checksum, ChecksumAlgorithm: src.ChecksumAlgorithm, Content: content})
	if err != nil && strings.Contains(err.Error(), "refusing to override existing file") {
		// Another download task (a killed run's, which goes on on the
		// host) stored the file after our look and before our task
		// started: without a checksum Proxmox refuses a file that exists
		// as the task starts (pve-common 9.2.1 src/PVE/Tools.pm
		// download_file_from_url checks -f $dest once, first). A task that
		// was already running when the other finished renames its own
		// temporary file over it and succeeds. Either way the file is
		// there, which is what this call is for.
		if ok, ferr := found(ctx); ferr == nil && ok {
			c.log.Info().Str("file", src.Filename).Msgf("another download task stored the %s first; keeping its file", what)
			return nil
		}
	}
	return err
}
