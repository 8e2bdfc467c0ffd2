package proxmox

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/internal/redact"
)

// PrecheckInput is what a run will ask of Proxmox.
type PrecheckInput struct {
	Cluster string
	VMs     []VMSpec
	ISO     ISOSource
	// ISOSizeBytes is the expected download size when the ISO is missing
	// (default 150 MiB, a Talos ISO with some room).
	ISOSizeBytes int64
	// ImageSizeBytes is the disk image's virtual size
	// (factory.DiskImageBytes), the most its qcow2 download can hold; 0
	// when it is not known.
	ImageSizeBytes int64
	// Zones maps a VNet to its SDN zone; bridges not in it belong to
	// localnetwork.
	Zones map[string]string
	// Hosts are the members VMs are spread over (proxmox.hosts); with more
	// than one, the member checks run on each (see Place).
	Hosts []string
	// HA makes every VM a Proxmox HA resource (proxmox.ha).
	HA bool
	// Boot is what proxmox.boot asks; Booted, when set, is told the
	// choice the boot row made (the provision stage then takes it).
	Boot   BootInput
	Booted func(BootChoice, error)
}

func (in PrecheckInput) zone(bridge string) string {
	if z, ok := in.Zones[bridge]; ok {
		return z
	}
	return LocalZone
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

type lazy[T any] struct {
	once sync.Once
	v    T
	err  error
}

func (l *lazy[T]) get(f func() (T, error)) (T, error) {
	l.once.Do(func() { l.v, l.err = f() })
	return l.v, l.err
}

// facts are the reads the checks share, each made once: the cluster's on
// the root, a member's on the facts of that member (see member).
type facts struct {
	c  *Client
	in PrecheckInput
	// root holds the cluster-wide reads; nil on the root itself.
	root    *facts
	version lazy[Version]
	vms     lazy[[]VMSummary]
	plans   lazy[planSet]
	placed  lazy[[]VMSpec]

	storages lazy[[]Storage]
	boot     lazy[bootResult]
	status   lazy[NodeStatus]
	iso      lazy[bool]
	bridges  lazy[[]Bridge]
}

func (f *facts) top() *facts {
	if f.root != nil {
		return f.root
	}
	return f
}

// member is the facts of one cluster member, sharing the cluster's reads.
func (f *facts) member(node string) *facts {
	return &facts{c: f.c.On(node), in: f.in, root: f.top()}
}

// gated is a check that runs only when the API can be used at all (gate).
func (f *facts) gated(name string, run func(context.Context) (check.Status, string)) check.Check {
	return check.Check{Name: name, Run: func(ctx context.Context) (check.Status, string) {
		if st, msg, ok := f.gate(ctx); !ok {
			return st, msg
		}
		return run(ctx)
	}}
}

// getPlaced is every spec with the member it runs on or will (Place).
func (f *facts) getPlaced(ctx context.Context) ([]VMSpec, error) {
	t := f.top()
	return t.placed.get(func() ([]VMSpec, error) {
		vms, err := t.getVMs(ctx)
		if err != nil {
			return nil, err
		}
		return t.c.PlaceVMs(ctx, t.in.VMs, t.in.Hosts, vms)
	})
}

// specs are the VMs on this facts' member.
func (f *facts) specs(ctx context.Context) ([]VMSpec, error) {
	all, err := f.getPlaced(ctx)
	if err != nil {
		return nil, err
	}
	var out []VMSpec
	for _, s := range all {
		if s.Node == f.c.node {
			out = append(out, s)
		}
	}
	return out, nil
}

func (f *facts) getBridges(ctx context.Context) ([]Bridge, error) {
	return f.bridges.get(func() ([]Bridge, error) { return f.c.Bridges(ctx) })
}

type planSet struct {
	plans map[int]Plan
	errs  map[int]error
}

func (f *facts) getVersion(ctx context.Context) (Version, error) {
	t := f.top()
	return t.version.get(func() (Version, error) { return t.c.Version(ctx) })
}

// gate fails a check early when the API cannot be used at all, so one dead
// or misconfigured endpoint yields one explanation and one retry sequence.
func (f *facts) gate(ctx context.Context) (check.Status, string, bool) {
	if _, err := f.getVersion(ctx); err != nil {
		if IsUnauthorized(err) {
			st, msg := check.Skipf("the API rejected the credentials (see proxmox: token)")
			return st, msg, false
		}
		st, msg := check.Skipf("the API is unreachable (see proxmox: API and version)")
		return st, msg, false
	}
	return "", "", true
}

func (f *facts) getVMs(ctx context.Context) ([]VMSummary, error) {
	t := f.top()
	return t.vms.get(func() ([]VMSummary, error) { return t.c.ListVMs(ctx) })
}

func (f *facts) getStorages(ctx context.Context) ([]Storage, error) {
	return f.storages.get(func() ([]Storage, error) { return f.c.Storages(ctx) })
}

// placedPlans is the plan of every VM (getPlans) and every VM placed on
// its member (getPlaced), for the rows that judge what each member gets;
// the error says which of the two failed.
func (f *facts) placedPlans(ctx context.Context) (planSet, []VMSpec, error) {
	ps, err := f.getPlans(ctx)
	if err != nil {
		return planSet{}, nil, fmt.Errorf("cannot list VMs: %w", err)
	}
	placed, err := f.getPlaced(ctx)
	if err != nil {
		return planSet{}, nil, fmt.Errorf("cannot place the VMs: %w", err)
	}
	return ps, placed, nil
}

func (f *facts) getPlans(ctx context.Context) (planSet, error) {
	t := f.top()
	return t.plans.get(func() (planSet, error) {
		vms, err := t.getVMs(ctx)
		if err != nil {
			return planSet{}, err
		}
		placed, err := t.getPlaced(ctx)
		if err != nil {
			return planSet{}, err
		}
		ps := planSet{plans: map[int]Plan{}, errs: map[int]error{}}
		plans, errs := t.c.PlanVMs(ctx, placed, vms)
		for i, s := range placed {
			if errs[i] != nil {
				ps.errs[s.VMID] = errs[i]
			} else {
				ps.plans[s.VMID] = plans[i]
			}
		}
		return ps, nil
	})
}

// bootResult is a boot choice with its refusal (a *BootRefusedError).
type bootResult struct {
	choice  BootChoice
	refusal error
}

// getBoot is the run's boot choice for the members where VMs are created
// (CreatingMembers), made once (ChooseBoot) and told to in.Booted.
func (f *facts) getBoot(ctx context.Context) (bootResult, error) {
	t := f.top()
	return t.boot.get(func() (bootResult, error) {
		placed, err := t.getPlaced(ctx)
		if err != nil {
			return bootResult{}, err
		}
		vms, err := t.getVMs(ctx)
		if err != nil {
			return bootResult{}, err
		}
		choice, err := t.c.chooseBoot(ctx, t.in.Boot, CreatingMembers(placed, vms), bootReads{
			version:  t.getVersion,
			storages: func(ctx context.Context, m string) ([]Storage, error) { return t.member(m).getStorages(ctx) },
		})
		var refused *BootRefusedError
		if err != nil && !errors.As(err, &refused) {
			return bootResult{}, err
		}
		if t.in.Booted != nil {
			t.in.Booted(choice, err)
		}
		return bootResult{choice: choice, refusal: err}, nil
	})
}

// imageBoot is the disk image the run's new VMs import, when it takes one.
func (f *facts) imageBoot(ctx context.Context) (BootChoice, bool) {
	b, err := f.getBoot(ctx)
	return b.choice, err == nil && b.refusal == nil && b.choice.Mode == BootImage
}

// BootCheck names the precheck row that says how new VMs boot.
const BootCheck = "proxmox: boot"

// checkBoot is the boot row: which way new VMs get Talos and why. A
// refused proxmox.boot image fails it only when a VM is to be created.
func (f *facts) checkBoot(ctx context.Context) (check.Status, string) {
	b, err := f.getBoot(ctx)
	if err != nil {
		return check.Failf("%v", err)
	}
	if b.refusal != nil {
		ps, err := f.getPlans(ctx)
		if err != nil {
			return check.Failf("cannot list VMs: %v", err)
		}
		for _, p := range ps.plans {
			if p.Create || p.WaitCreate {
				return check.Failf("%v", b.refusal)
			}
		}
		return check.Passf("no VM to create (proxmox.boot image could not be: %s)", b.choice.Reason)
	}
	return check.Passf("new VMs boot %s", b.choice.Reason)
}

func (f *facts) isoPresent(ctx context.Context) (bool, error) {
	return f.iso.get(func() (bool, error) {
		_, ok, err := f.c.FindISO(ctx, f.in.ISO.Storage, f.in.ISO.Filename)
		return ok, err
	})
}

func gib(b int64) string {
	return strconv.FormatFloat(float64(b)/(1<<30), 'f', 1, 64) + " GiB"
}

// Prechecks returns the Proxmox checks of a run. Each reads only; shared
// reads are made once. All of them run even when an early one fails.
func Prechecks(c *Client, in PrecheckInput) []check.Check {
	f := &facts{c: c, in: in}
	if in.ISOSizeBytes <= 0 {
		in.ISOSizeBytes = 150 << 20
		f.in = in
	}
	checks := []check.Check{
		{Name: "proxmox: API and version", Run: func(ctx context.Context) (check.Status, string) {
			v, err := f.getVersion(ctx)
			switch {
			case IsUnauthorized(err):
				return check.Failf("API at %s answers but rejected the credentials: %v", redact.URL(c.opts.URL), err)
			case err != nil:
				return check.Failf("API at %s unreachable: %v", redact.URL(c.opts.URL), err)
			case v.Major < 7:
				return check.Failf("Proxmox VE %s is too old (8.x or 9.x needed)", v)
			case v.Major == 7:
				return check.Warnf("Proxmox VE %s is end of life and untested; 8.x or 9.x recommended", v)
			}
			return check.Passf("Proxmox VE %s at %s", v, redact.URL(c.opts.URL))
		}},
		{Name: "proxmox: token", Run: func(ctx context.Context) (check.Status, string) {
			who := c.opts.TokenID
			if who == "" {
				who = c.opts.Username
			}
			if _, err := f.getVersion(ctx); err != nil && !IsUnauthorized(err) {
				return check.Skipf("the API is unreachable (see proxmox: API and version)")
			}
			if _, err := c.Permissions(ctx, []string{"/"}); err != nil {
				if IsUnauthorized(err) {
					return check.Failf("%s rejected: %v", who, err)
				}
				return check.Failf("cannot verify %s: %v", who, err)
			}
			return check.Passf("%s accepted", who)
		}},
		f.gated("proxmox: cluster quorum", f.checkQuorum),
		f.gated("proxmox: privileges", func(ctx context.Context) (check.Status, string) {
			// The reads below are independent and shared with other
			// checks: asked at once, the check waits for the slowest
			// instead of their sum; each is read back from its fact.
			var reads sync.WaitGroup
			for _, read := range []func(){
				func() { _, _ = f.getPlans(ctx) },
				func() { _, _ = f.isoPresent(ctx) },
				func() { _, _ = f.getBridges(ctx) },
				func() { _, _ = f.getPlaced(ctx) },
				func() { _, _ = f.getBoot(ctx) },
			} {
				reads.Go(read)
			}
			reads.Wait()
			v, err := f.getVersion(ctx)
			if err != nil {
				return check.Failf("cannot read version: %v", err)
			}
			ps, err := f.getPlans(ctx)
			if err != nil {
				return check.Failf("cannot list VMs: %v", err)
			}
			present, err := f.isoPresent(ctx)
			if err != nil && !IsForbidden(err) {
				return check.Failf("cannot list ISOs on %s: %v", in.ISO.Storage, err)
			}
			bridges, err := f.getBridges(ctx)
			if err != nil {
				return check.Failf("cannot list bridges: %v", err)
			}
			in := in
			in.Zones = map[string]string{}
			for _, b := range bridges {
				if b.VNet {
					in.Zones[b.Name] = b.Zone
				}
			}
			if placed, err := f.getPlaced(ctx); err == nil {
				in.VMs = placed
			}
			download := !present
			if img, ok := f.imageBoot(ctx); ok {
				// The new VMs' disks are imported from the image: the same
				// privileges as the ISO, on the image's storage.
				in.ISO, download = img.Image, len(img.Missing) > 0
			}
			needs := RequiredPrivileges(c.node, v, in, ps.plans, download)
			held, err := c.Permissions(ctx, Paths(needs))
			if err != nil {
				return check.Failf("cannot read the token's permissions: %v", err)
			}
			var required, advisory []Need
			for _, n := range needs {
				if n.Advisory {
					advisory = append(advisory, n)
				} else {
					required = append(required, n)
				}
			}
			if miss := Missing(required, held); len(miss) > 0 {
				return check.Failf("missing %s (README's \"The Proxmox API token\" sets up a role with every privilege this tool uses%s)", describeMissing(miss), pciMissingHint(miss))
			}
			if miss := Missing(advisory, held); len(miss) > 0 {
				return check.Warnf("the run has what it needs, but postcheck's guest-agent row cannot ping the agents without %s", describeMissing(miss))
			}
			return check.Passf("every privilege this run needs is granted (%d requirements on %d paths)", len(needs), len(held))
		}),
	}
	if len(in.Hosts) > 1 {
		for _, h := range in.Hosts {
			checks = append(checks, f.member(h).memberChecks(" ("+h+")")...)
		}
	} else {
		checks = append(checks, f.memberChecks("")...)
	}
	if len(in.Hosts) > 1 {
		checks = append(checks, f.gated(CPUModelsCheck, f.checkCPUModels))
	}
	if wantsNestedVirt(in.VMs) {
		checks = append(checks, f.gated(CPUFlagsCheck, f.checkCPUFlags))
	}
	if in.HA {
		checks = append(checks, f.gated("proxmox: HA", f.checkHA))
	}
	if in.Boot.Want != "" {
		checks = append(checks, f.gated(BootCheck, f.checkBoot))
	}
	if usesPCI(in.VMs) {
		checks = append(checks, f.gated(PCICheck, f.checkPCI))
	}
	return append(checks, []check.Check{
		f.gated("proxmox: tags", f.checkTags),
		f.gated("proxmox: VMIDs and names", func(ctx context.Context) (check.Status, string) {
			ps, err := f.getPlans(ctx)
			if err != nil {
				return check.Failf("cannot list VMs: %v", err)
			}
			var bad []string
			for _, s := range in.VMs {
				if err := ps.errs[s.VMID]; err != nil {
					var fe *ForeignVMError
					if errors.As(err, &fe) {
						bad = append(bad, fe.What)
					} else {
						bad = append(bad, fmt.Sprintf("VM %d %s: %v", s.VMID, s.Name, err))
					}
				}
			}
			if len(bad) > 0 {
				return check.Failf("%s", strings.Join(bad, "; "))
			}
			var created, adopted, waiting int
			for _, p := range ps.plans {
				switch {
				case p.Create:
					created++
				case p.WaitCreate:
					waiting++
				default:
					adopted++
				}
			}
			if waiting > 0 {
				return check.Warnf("%d to create, %d of this cluster's to adopt, %d still being created by Proxmox (interrupted run?)", created, adopted, waiting)
			}
			return check.Passf("%d to create, %d of this cluster's to adopt, none held by other VMs", created, adopted)
		}),
	}...)
}

// memberChecks are the checks of one member's node, storages, bridges
// and room, named with suffix.
func (f *facts) memberChecks(suffix string) []check.Check {
	return []check.Check{
		f.gated("proxmox: node"+suffix, f.checkNode),
		f.gated("proxmox: disk storage"+suffix, f.checkDiskStorage),
		f.gated("proxmox: ISO storage"+suffix, f.checkISOStorage),
		f.gated("proxmox: bridge"+suffix, f.checkBridges),
		f.gated("proxmox: RAM and CPU headroom"+suffix, f.checkCapacity),
	}
}

// checkQuorum fails when the PVE cluster has lost quorum: Proxmox then
// refuses every create, start and migration.
func (f *facts) checkQuorum(ctx context.Context) (check.Status, string) {
	cs, err := f.c.ClusterStatus(ctx)
	switch {
	case IsForbidden(err):
		return check.Warnf("cannot read /cluster/status (it needs Sys.Audit on /): a PVE cluster without quorum would refuse to create and start the VMs")
	case err != nil:
		return check.Failf("cannot read the cluster status: %v", err)
	case !cs.Cluster:
		return check.Passf("standalone node (no PVE cluster)")
	case !cs.Quorate:
		return check.Failf("PVE cluster %s has no quorum (%d of %d members online): Proxmox refuses to create, start or migrate VMs (\"cluster not ready - no quorum?\") until a majority is back; in a two-member cluster with one down, 'pvecm expected 1' on the member left lets it act alone", cs.Name, cs.Online, cs.Members)
	}
	return check.Passf("PVE cluster %s quorate, %d of %d members online", cs.Name, cs.Online, cs.Members)
}

// checkNode: this facts' member is in the cluster and online.
func (f *facts) checkNode(ctx context.Context) (check.Status, string) {
	c := f.c
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return check.Failf("cannot list nodes: %v", err)
	}
	var names []string
	for _, n := range nodes {
		names = append(names, n.Name)
		if n.Name == c.node {
			if !n.Online {
				return check.Failf("node %s is %s", c.node, n.Status)
			}
			return check.Passf("node %s online", c.node)
		}
	}
	return check.Failf("node %s not in the cluster (nodes: %s)", c.node, strings.Join(names, ", "))
}

// checkHA judges whether HA can do its job for these VMs: it restarts a
// VM of a failed member on another one only when every volume of the VM
// is on shared storage (a local disk went down with its host), and it
// moves VMs only when their cdrom's ISO is shared too (QemuMigrate's
// "local cdrom image", qemu-server 9.2.6 src/PVE/QemuMigrate.pm).
func (f *facts) checkHA(ctx context.Context) (check.Status, string) {
	if len(f.in.Hosts) < 2 {
		return check.Warnf("every VM becomes an HA resource, but with one member in proxmox.hosts HA can only restart a VM where it was")
	}
	var names, local []string
	for _, s := range f.in.VMs {
		if !contains(names, s.DiskStorage) {
			names = append(names, s.DiskStorage)
		}
	}
	// The ISO storage counts only when a VM holds the ISO: a run that
	// installs from it, or a VM that exists with it in its cdrom. A VM
	// created from the disk image has no ide2, and QemuMigrate refuses a
	// cdrom only when it holds a volume on local storage.
	if iso, err := f.isoHeld(ctx); err != nil {
		return check.Failf("cannot list VMs: %v", err)
	} else if iso && !contains(names, f.in.ISO.Storage) {
		names = append(names, f.in.ISO.Storage)
	}
	for _, name := range names {
		st, ok, err := f.storage(ctx, name)
		if err != nil {
			return check.Failf("cannot list storages: %v", err)
		}
		if ok && !st.Shared {
			local = append(local, name)
		}
	}
	// Control planes apart: a negative resource-affinity rule on PVE 9
	// (harules.go), nothing on PVE 8, which is said here.
	apart := ""
	if controlPlanes(f.in.VMs) >= 2 {
		v, err := f.getVersion(ctx)
		if err != nil {
			return check.Failf("cannot read the Proxmox version: %v", err)
		}
		if !SeparationSupported(v) {
			apart = "; " + SeparationUnsupported(v)
		} else {
			apart = "; HA rule " + SeparationRuleID(f.in.Cluster) + " keeps the control planes on separate members"
		}
	}
	if len(local) > 0 {
		verb := "is"
		if len(local) > 1 {
			verb = "are"
		}
		return check.Warnf("every VM becomes an HA resource, but %s %s not shared storage: HA cannot restart a VM of a failed member elsewhere (its disk went down with the host) nor move it (put disks and the ISO on shared storage such as Ceph or NFS)%s", strings.Join(local, " and "), verb, apart)
	}
	if apart != "" && !strings.HasPrefix(apart, "; HA rule") {
		return check.Warnf("every VM becomes an HA resource; its disk and ISO are on shared storage, so HA can restart it on another member%s", apart)
	}
	return check.Passf("every VM becomes an HA resource; its disk and ISO are on shared storage, so HA can restart it on another member%s", apart)
}

// isoHeld says whether a VM of the run holds the Talos ISO in its cdrom:
// a VM the run creates from the ISO, or one that exists with a volume in
// ide2 (not "none", an ejected drive).
func (f *facts) isoHeld(ctx context.Context) (bool, error) {
	ps, err := f.getPlans(ctx)
	if err != nil {
		return false, err
	}
	b, err := f.getBoot(ctx)
	if err != nil {
		return false, err
	}
	for _, p := range ps.plans {
		switch {
		case (p.Create || p.WaitCreate) && b.choice.Mode != BootImage:
			return true, nil
		case p.Config != nil && p.Config.CDROM != "" && p.Config.CDROM != "none":
			return true, nil
		}
	}
	return false, nil
}

// CPUModelsCheck names the row comparing the members' CPU models.
const CPUModelsCheck = "proxmox: CPU models"

// checkCPUModels compares the CPU models of the members VMs are spread
// over. The VMs get cpu type host, the host's own CPU: pve-docs 9.1.3
// qm.adoc ("CPU Type") says a VM live-migrated to a host with another CPU
// type may stop ("the QEMU process will stop"), and to use host only in a
// homogeneous cluster (same CPU, same microcode); QemuMigrate (qemu-server
// 9.2.6) has no guard of its own. Such a migration is the user's, or HA's
// when a member goes into maintenance.
func (f *facts) checkCPUModels(ctx context.Context) (check.Status, string) {
	var hostVMs []string
	types := map[string]bool{}
	for _, s := range f.in.VMs {
		types[s.CPUType()] = true
		if s.CPUType() == "host" {
			hostVMs = append(hostVMs, s.Name)
		}
	}
	if len(hostVMs) == 0 {
		return check.Passf("new VMs get cpu type %s (proxmox.cpu, vm.cpu), which migrates between members whose CPUs have that level", strings.Join(sortedKeys(types), ", "))
	}
	models := map[string][]string{}
	var order []string
	for _, h := range f.in.Hosts {
		m := f.member(h)
		ns, err := m.status.get(func() (NodeStatus, error) { return m.c.NodeStatus(ctx) })
		if err != nil {
			return check.Failf("cannot read the status of %s: %v", h, err)
		}
		if _, ok := models[ns.CPUModel]; !ok {
			order = append(order, ns.CPUModel)
		}
		models[ns.CPUModel] = append(models[ns.CPUModel], h)
	}
	if len(order) == 1 {
		return check.Passf("every member has a %s: the VMs' cpu type host migrates between them", order[0])
	}
	var parts []string
	for _, m := range order {
		parts = append(parts, fmt.Sprintf("%s on %s", m, strings.Join(models[m], ", ")))
	}
	return check.Warnf("the members' CPUs differ (%s): %s get cpu type host, and a live migration between different CPUs (yours, or HA's when a member goes into maintenance) can stop the guest; set proxmox.cpu (or vm.cpu) to a generic type such as x86-64-v2-AES, which migrates between them (Proxmox's 'CPU Type' documentation)", strings.Join(parts, "; "), strings.Join(hostVMs, ", "))
}

func (f *facts) storage(ctx context.Context, name string) (Storage, bool, error) {
	sts, err := f.getStorages(ctx)
	if err != nil {
		return Storage{}, false, err
	}
	for _, s := range sts {
		if s.Name == name {
			return s, true, nil
		}
	}
	return Storage{}, false, nil
}

func (f *facts) checkDiskStorage(ctx context.Context) (check.Status, string) {
	ps, err := f.getPlans(ctx)
	if err != nil {
		return check.Failf("cannot list VMs: %v", err)
	}
	here, err := f.specs(ctx)
	if err != nil {
		return check.Failf("cannot place the VMs: %v", err)
	}
	need := map[string]int64{}
	count := map[string]int{}
	var order []string
	for _, s := range here {
		if _, ok := need[s.DiskStorage]; !ok {
			order = append(order, s.DiskStorage)
			need[s.DiskStorage] = 0
		}
		p, ok := ps.plans[s.VMID]
		switch {
		case !ok || p.Create:
			need[s.DiskStorage] += int64(s.DiskGiB) << 30
			need[s.cloudInitStorage()] += 4 << 20
			count[s.DiskStorage]++
			// The extra disks are judged with the storages they are
			// on, by the same rules (a VM that exists gets none).
			for _, d := range s.Disks {
				if _, ok := need[d.Storage]; !ok {
					order = append(order, d.Storage)
				}
				need[d.Storage] += int64(d.SizeGiB) << 30
				count[d.Storage]++
			}
		case p.GrowDisk > 0 && p.Config != nil && p.Config.Disk != nil:
			need[s.DiskStorage] += p.GrowDisk - p.Config.Disk.SizeBytes
		}
	}
	var parts, warns []string
	for _, name := range order {
		st, ok, err := f.storage(ctx, name)
		switch {
		case err != nil:
			return check.Failf("cannot list storages: %v", err)
		case !ok:
			return check.Failf("storage %s not found on node %s (or the token cannot see it)", name, f.c.node)
		case !st.Enabled || !st.Active:
			return check.Failf("storage %s is not enabled and active", name)
		case !st.HasContent("images"):
			return check.Failf("storage %s does not hold content type images (has %s)", name, strings.Join(st.Content, ","))
		}
		part, warn, fail := f.diskRoom(ctx, st, need[name], count[name])
		if fail != "" {
			return check.Failf("%s", fail)
		}
		parts = append(parts, part)
		warns = append(warns, warn...)
	}
	if len(warns) > 0 {
		return check.Warnf("%s: %s", strings.Join(parts, "; "), strings.Join(warns, "; "))
	}
	return check.Passf("%s", strings.Join(parts, "; "))
}

// diskRoom judges one storage's room for need bytes of new disks. Thick
// storage must have them free now. Thin storage creates them anyway, so a
// shortfall is a warning, as is a pool whose disks' virtual sizes (those
// already there and the new ones) exceed it: once a thin pool fills,
// every guest on it gets write errors.
func (f *facts) diskRoom(ctx context.Context, st Storage, need int64, disks int) (part string, warns []string, fail string) {
	switch st.Provisioning() {
	case ThickProvisioned:
		if need > st.Avail {
			return "", nil, fmt.Sprintf("storage %s: %s needed for %d new disk(s), only %s free", st.Name, gib(need), disks, gib(st.Avail))
		}
		return fmt.Sprintf("%s: %s needed, %s free", st.Name, gib(need), gib(st.Avail)), nil, ""
	case MaybeThin:
		// A zvol reserves its whole size unless the storage is 'sparse'
		// (zfs create -s, pve-storage 9.1.7 ZFSPoolPlugin.pm
		// zfs_create_zvol), which only the storage config says.
		sparse, known, err := f.c.StorageSparse(ctx, st.Name)
		switch {
		case err != nil:
			return "", nil, fmt.Sprintf("storage %s: cannot read its config: %v", st.Name, err)
		case sparse:
			// Thin: judged below.
		case !known && need > st.Avail:
			return fmt.Sprintf("%s: %s needed, %s free", st.Name, gib(need), gib(st.Avail)),
				[]string{fmt.Sprintf("%s has %s free, less than the %s the new disks take unless the storage is 'sparse', which this token cannot read (Datastore.Allocate on /storage/%s reads it): a %s zvol reserves its whole size, and Proxmox then fails the create", st.Name, gib(st.Avail), gib(need), st.Name, st.Type)}, ""
		case need > st.Avail:
			return "", nil, fmt.Sprintf("storage %s: %s needed for %d new disk(s), only %s free (a %s zvol reserves its whole size: the storage is not 'sparse')", st.Name, gib(need), disks, gib(st.Avail), st.Type)
		default:
			return fmt.Sprintf("%s: %s needed, %s free", st.Name, gib(need), gib(st.Avail)), nil, ""
		}
	}
	part = fmt.Sprintf("%s (thin): %s for new disks, %s free", st.Name, gib(need), gib(st.Avail))
	if need > st.Avail {
		warns = append(warns, fmt.Sprintf("%s has %s free, less than the %s the new disks may hold", st.Name, gib(st.Avail), gib(need)))
	}
	// The content index hides images the token may not access: without
	// Datastore.Audit on the storage it lists none, and a committed sum
	// would count only the new disks.
	vis, err := f.c.ImagesVisible(ctx, st.Name)
	if err != nil {
		return part + fmt.Sprintf(", committed size unknown (%v)", err), warns, ""
	}
	if vis == ImagesHidden {
		return part + fmt.Sprintf(", committed size unknown: Proxmox lists the disks on %s only to a token with Datastore.Audit on /storage/%s (grant it to have overcommitment checked)", st.Name, st.Name), warns, ""
	}
	virtual, _, err := f.c.ImagesSize(ctx, st.Name)
	if err != nil {
		return part + fmt.Sprintf(", committed size unknown (%v)", err), warns, ""
	}
	if vis == ImagesOfSomeVMs {
		part += " (counting only the disks of VMs the token holds VM.Config.Disk on)"
	}
	committed := virtual + need
	if st.Total > 0 {
		pct := float64(committed) * 100 / float64(st.Total)
		part += fmt.Sprintf(", %s of %s committed (%.0f%%)", gib(committed), gib(st.Total), pct)
		if committed > st.Total {
			warns = append(warns, fmt.Sprintf("%s is overcommitted: its disks may hold %s, the storage has %s; when it fills, every VM on it gets write errors", st.Name, gib(committed), gib(st.Total)))
		}
	}
	return part, warns, ""
}

func (f *facts) checkISOStorage(ctx context.Context) (check.Status, string) {
	if img, ok := f.imageBoot(ctx); ok {
		// No ISO is needed: the disk image's storage was judged by the
		// boot choice, which downloads the image where it is missing.
		st, found, err := f.storage(ctx, img.Image.Storage)
		switch {
		case err != nil:
			return check.Failf("cannot list storages: %v", err)
		case !found:
			return check.Failf("storage %s not found on node %s (or the token cannot see it)", img.Image.Storage, f.c.node)
		case contains(img.Missing, f.c.node) && f.in.ImageSizeBytes <= 0:
			// download-url writes the whole file to the storage before
			// the import (pve-common 9.2.1 src/PVE/Tools.pm
			// download_file_from_url): its size is the room it needs.
			return check.Warnf("no ISO needed; the disk image %s will be downloaded to %s (%s free), but its size is not known here: the download fails if it does not fit", img.Image.Filename, st.Name, gib(st.Avail))
		case contains(img.Missing, f.c.node) && st.Avail < f.in.ImageSizeBytes:
			// The qcow2 holds the image's allocated clusters: up to its
			// virtual size, how much less is not known before the
			// download, so a storage with less room may still take it.
			return check.Warnf("no ISO needed; the disk image %s will be downloaded to %s, which has %s free: the image holds up to %s (its virtual size), and the download fails with \"No space left on device\" if it does not fit (free room on %s, or set proxmox.boot to iso)", img.Image.Filename, st.Name, gib(st.Avail), gib(f.in.ImageSizeBytes), st.Name)
		case contains(img.Missing, f.c.node) && img.Image.Checksum == "":
			return check.Warnf("no ISO needed; the disk image %s will be downloaded to %s without a checksum to verify it", img.Image.Filename, st.Name)
		case contains(img.Missing, f.c.node):
			return check.Passf("no ISO needed; the disk image %s will be downloaded to %s (%s free)", img.Image.Filename, st.Name, gib(st.Avail))
		}
		return check.Passf("no ISO needed; the disk image %s is on %s", img.Image.Filename, st.Name)
	}
	status, reason := f.isoOnStorage(ctx)
	st, ok, err := f.storage(ctx, f.in.ISO.Storage)
	if status == check.Pass && len(f.in.Hosts) > 1 && err == nil && ok && !st.Shared {
		// QemuMigrate refuses a VM whose cdrom holds an image on storage
		// that is not shared ("local cdrom image", qemu-server 9.2.6
		// src/PVE/QemuMigrate.pm), and the VMs keep the Talos ISO in
		// theirs: neither the user nor HA can move them between members.
		return check.Warnf("%s; %s is not shared, so Proxmox refuses to migrate a VM with the ISO in its cdrom drive (\"local cdrom image\"): put the ISO on shared storage (proxmox.isoStorage) to move VMs between members", reason, f.in.ISO.Storage)
	}
	return status, reason
}

// isoOnStorage judges the ISO storage and the ISO on this member.
func (f *facts) isoOnStorage(ctx context.Context) (check.Status, string) {
	in := f.in
	st, ok, err := f.storage(ctx, in.ISO.Storage)
	switch {
	case err != nil:
		return check.Failf("cannot list storages: %v", err)
	case !ok:
		return check.Failf("storage %s not found on node %s (or the token cannot see it)", in.ISO.Storage, f.c.node)
	case !st.HasContent("iso"):
		return check.Failf("storage %s does not hold content type iso (has %s)", in.ISO.Storage, strings.Join(st.Content, ","))
	}
	present, err := f.isoPresent(ctx)
	switch {
	case err != nil:
		return check.Failf("cannot list ISOs on %s: %v", in.ISO.Storage, err)
	case present:
		return check.Passf("%s present on %s", in.ISO.Filename, in.ISO.Storage)
	case in.ISO.URL == "":
		return check.Failf("%s is not on %s and no download URL is configured", in.ISO.Filename, in.ISO.Storage)
	case st.Avail < in.ISOSizeBytes:
		return check.Failf("%s must be downloaded but %s has only %s free (about %s needed)", in.ISO.Filename, in.ISO.Storage, gib(st.Avail), gib(in.ISOSizeBytes))
	case in.ISO.Checksum == "":
		return check.Warnf("%s will be downloaded to %s without a checksum to verify it", in.ISO.Filename, in.ISO.Storage)
	}
	return check.Passf("%s will be downloaded to %s (%s free)", in.ISO.Filename, in.ISO.Storage, gib(st.Avail))
}

func (f *facts) checkBridges(ctx context.Context) (check.Status, string) {
	bridges, err := f.getBridges(ctx)
	if err != nil {
		return check.Failf("cannot list bridges: %v", err)
	}
	here, err := f.specs(ctx)
	if err != nil {
		return check.Failf("cannot place the VMs: %v", err)
	}
	v, err := f.getVersion(ctx)
	if err != nil {
		return check.Failf("cannot read version: %v", err)
	}
	have := map[string]Bridge{}
	for _, b := range bridges {
		have[b.Name] = b
	}
	seen := map[string]bool{}
	var parts []string
	// Every NIC's bridge and VLAN: net0's and the extra NICs' (extras.go).
	var uses []bridgeUse
	for _, s := range here {
		uses = append(uses, s.nicBridges()...)
	}
	var mtuWarns []string
	for _, s := range uses {
		if b, ok := have[s.Bridge]; ok {
			fail, warn := mtuProblem(s, b)
			if fail != "" {
				return check.Failf("%s", fail)
			}
			if warn != "" {
				mtuWarns = append(mtuWarns, warn)
			}
		}
		key := s.Bridge + "/" + strconv.Itoa(s.VLAN)
		if seen[key] {
			continue
		}
		seen[key] = true
		b, ok := have[s.Bridge]
		switch {
		case !ok && v.Major >= 8:
			// PVE 8+ lists only the bridges the token may audit or use:
			// tell a missing privilege from a missing bridge.
			path := "/sdn/zones/" + LocalZone + "/" + s.Bridge
			held, err := f.c.Permissions(ctx, []string{path})
			if err == nil && !held[path]["SDN.Audit"] && !held[path]["SDN.Use"] {
				return check.Failf("bridge %s is not visible to the token: it needs SDN.Use (or at least SDN.Audit) on %s (Proxmox VE 8+ lists only the bridges a token may use)", s.Bridge, path)
			}
			return check.Failf("bridge %s not found on node %s", s.Bridge, f.c.node)
		case !ok:
			return check.Failf("bridge %s not found on node %s", s.Bridge, f.c.node)
		case b.VNet && b.Zone == "":
			return check.Warnf("%s is an SDN VNet whose zone the token cannot read (SDN.Audit on its zone): the SDN.Use it needs was not checked", s.Bridge)
		case s.VLAN != 0 && b.VNet && !b.VLANAware:
			return check.Failf("SDN VNet %s is not VLAN aware but VLAN %d is configured (enable 'VLAN aware' on the VNet, or give the VMs a VNet of that VLAN)", s.Bridge, s.VLAN)
		case !b.Carries(s.VLAN):
			return check.Failf("bridge %s is VLAN aware but its ports carry only VLANs %s (bridge-vids), not VLAN %d: the VMs would start and reach nothing beyond this host (add %d to bridge-vids of %s in /etc/network/interfaces and run ifreload -a, or use a VLAN it carries)", s.Bridge, b.VIDs, s.VLAN, s.VLAN, s.Bridge)
		case s.VLAN != 0 && !b.VNet && !b.OVS && !b.VLANAware && len(b.Ports) == 0:
			// activate_bridge_vlan (pve-common src/PVE/Network.pm) builds
			// <bridge>v<tag> over <port>.<tag> of the bridge's ports, at VM
			// start: without a port the start fails.
			return check.Failf("bridge %s is not VLAN aware and has no port to carry VLAN %d: Proxmox would fail the VM start with \"no physical interface on bridge '%s'\" (enable 'VLAN aware' on it, or give it its uplink port)", s.Bridge, s.VLAN, s.Bridge)
		}
		switch {
		case s.VLAN == 0:
			parts = append(parts, s.Bridge)
		case b.OVS:
			parts = append(parts, fmt.Sprintf("%s (Open vSwitch, VLAN %d tagged on the VM's port)", s.Bridge, s.VLAN))
		case b.VLANAware:
			parts = append(parts, fmt.Sprintf("%s (VLAN-aware, VLAN %d)", s.Bridge, s.VLAN))
		default:
			parts = append(parts, fmt.Sprintf("%s (VLAN %d through %sv%d over %s.%d, which Proxmox creates at VM start)", s.Bridge, s.VLAN, s.Bridge, s.VLAN, b.Ports[0], s.VLAN))
		}
	}
	if len(mtuWarns) > 0 {
		return check.Warnf("%s present; %s", strings.Join(parts, ", "), strings.Join(mtuWarns, "; "))
	}
	return check.Passf("%s present", strings.Join(parts, ", "))
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// hasZFSPool says whether the member has an enabled zfspool storage: a
// ZFS pool whose ARC may hold memory the node status counts as used.
func (f *facts) hasZFSPool(ctx context.Context) bool {
	sts, err := f.getStorages(ctx)
	if err != nil {
		return false
	}
	for _, st := range sts {
		if st.Type == "zfspool" && st.Enabled {
			return true
		}
	}
	return false
}

func (f *facts) versionText(ctx context.Context) string {
	v, err := f.getVersion(ctx)
	if err != nil {
		return "(unknown)"
	}
	return v.String()
}

func (f *facts) checkCapacity(ctx context.Context) (check.Status, string) {
	ns, err := f.status.get(func() (NodeStatus, error) { return f.c.NodeStatus(ctx) })
	if err != nil {
		return check.Failf("cannot read node status: %v", err)
	}
	vms, err := f.getVMs(ctx)
	if err != nil {
		return check.Failf("cannot list VMs: %v", err)
	}
	here, err := f.specs(ctx)
	if err != nil {
		return check.Failf("cannot place the VMs: %v", err)
	}
	running := map[int]bool{}
	for _, v := range vms {
		running[v.VMID] = v.Status == "running"
	}
	var needMem int64
	vcpus := 0
	for _, s := range here {
		if s.Cores > ns.CPUs {
			return check.Failf("VM %s wants %d cores, the node has %d CPUs", s.Name, s.Cores, ns.CPUs)
		}
		vcpus += s.Cores
		if !running[s.VMID] {
			needMem += int64(s.MemoryMiB) << 20
		}
	}
	// The ZFS ARC is counted as used, yet ZFS shrinks it when VMs need the
	// memory (down to zfs_arc_min, which PVE does not report): RAM the
	// VMs can have only once the ARC shrinks is a warning, not a failure.
	arc, arcKnown, arcErr := f.c.ZFSARC(ctx)
	if arcErr != nil {
		arc, arcKnown = 0, false
	}
	if needMem > ns.MemoryAvailable+arc && !arcKnown && needMem <= ns.MemoryTotal && f.hasZFSPool(ctx) {
		// PVE 8 reports no ARC size (its pve2-node RRD has no arcsize;
		// pve-common 8.3.8 read_meminfo: used = total - MemAvailable,
		// which leaves the ARC out), and qemu-server checks no free
		// memory at start (vm_start_nolock): on a ZFS member the VMs
		// start and ZFS gives the ARC back, so this warns.
		return check.Warnf("%s RAM needed for VMs to start, %s available of %s: the ZFS ARC, which Linux counts as used, may hold the rest, but Proxmox VE %s does not report its size (PVE 9 does); Proxmox starts VMs without checking memory and ZFS gives the ARC back down to zfs_arc_min (cap it with zfs_arc_max)",
			gib(needMem), gib(ns.MemoryAvailable), gib(ns.MemoryTotal), f.versionText(ctx))
	}
	if needMem > ns.MemoryAvailable+arc {
		msg := fmt.Sprintf("%s RAM needed for VMs to start, only %s available of %s", gib(needMem), gib(ns.MemoryAvailable), gib(ns.MemoryTotal))
		if arc > 0 {
			msg += fmt.Sprintf(" even with all of the ZFS ARC (%s) given back", gib(arc))
		}
		return check.Failf("%s", msg)
	}
	after := ns.MemoryUsed - arc + needMem
	pct := float64(after) * 100 / float64(ns.MemoryTotal)
	reason := fmt.Sprintf("RAM %s of %s after start (%.0f%%), %d vCPUs on %d CPUs", gib(after), gib(ns.MemoryTotal), pct, vcpus, ns.CPUs)
	if arc > 0 {
		reason += fmt.Sprintf("; ZFS ARC %s not counted as used", gib(arc))
	} else if !arcKnown && arcErr != nil {
		reason += "; ZFS ARC unknown (" + arcErr.Error() + ")"
	}
	switch {
	case needMem > ns.MemoryAvailable:
		return check.Warnf("%s: the VMs need %s more than is available, which the ZFS ARC must give back (it shrinks only down to zfs_arc_min; cap it with zfs_arc_max)", reason, gib(needMem-ns.MemoryAvailable))
	case pct > 90:
		return check.Warnf("%s: above 90%% leaves the host little room", reason)
	case vcpus > 4*ns.CPUs:
		return check.Warnf("%s: more than 4× CPU overcommit", reason)
	}
	return check.Passf("%s", reason)
}
