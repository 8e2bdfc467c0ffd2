package stages

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/factory"
	"github.com/homelab/bootstrap/proxmox"
	"github.com/homelab/bootstrap/talos"
	"golang.org/x/sync/errgroup"
)

// ProvisionStage makes the cluster's VMs exist on Proxmox as configured:
// it downloads the Talos ISO when missing, creates or adopts each VM
// (fixing safe drift, refusing unsafe drift and VMs that are not the
// cluster's), starts them in parallel, records each node's VMID, address,
// MAC and disk bus, keeps the control planes on separate members under
// proxmox.ha (PVE 9's HA rule, ensureSeparation), and waits until every
// node's Talos API answers.
type ProvisionStage struct{}

// Name implements Stage.
func (ProvisionStage) Name() string { return Provision }

// VMSpecs turns the config's nodes into VM specs. Every node gets a scsi
// install disk on the SCSI controller, which the guest sees as /dev/sda.
func VMSpecs(cfg *config.Config) ([]proxmox.VMSpec, error) {
	pfx, err := netip.ParsePrefix(cfg.Cluster.Network.CIDR)
	if err != nil {
		return nil, config.Userf("cluster.network.cidr %q: %v", cfg.Cluster.Network.CIDR, err)
	}
	var gw netip.Addr
	if cfg.Cluster.Network.Gateway != "" {
		if gw, err = netip.ParseAddr(cfg.Cluster.Network.Gateway); err != nil {
			return nil, config.Userf("cluster.network.gateway %q: %v", cfg.Cluster.Network.Gateway, err)
		}
	}
	p := cfg.Proxmox
	im := cfg.Images()
	host := func(n config.Node) string {
		if n.Host != "" {
			return n.Host
		}
		if len(p.Hosts) == 0 {
			return p.Node
		}
		return "" // placed by proxmox.Place
	}
	specs := make([]proxmox.VMSpec, 0, len(cfg.Nodes))
	for _, n := range cfg.Nodes {
		ip, err := netip.ParseAddr(n.IP)
		if err != nil {
			return nil, config.Userf("node %s: ip %q: %v", n.Name, n.IP, err)
		}
		shape := cfg.VMShapeOf(n)
		specs = append(specs, proxmox.VMSpec{
			Cluster: cfg.Cluster.Name, Name: n.Name, Role: n.Role, VMID: n.VMID, Node: host(n),
			Cores: n.Cores, MemoryMiB: n.MemoryMiB, CPU: shape.CPU, CPUFlags: shape.CPUFlags, Hardware: hardware(shape), DiskStorage: p.DiskStorage, DiskGiB: n.DiskGiB, DiskBus: "scsi",
			Bridge: p.Bridge, VLAN: p.VLAN, MAC: n.MAC, ISOStorage: p.ISOStorage, ISOFile: im.ISOFileOf(shape.SecureBootOn()), GuestAgent: im.GuestAgent,
			IPv4: netip.PrefixFrom(ip, pfx.Bits()), Gateway: gw, Nameservers: cfg.Cluster.Network.Nameservers,
			Disks: extraDisks(cfg, n), NICs: extraNICs(cfg, n),
		})
	}
	return specs, nil
}

// hardware is a node's proxmox.vm as the VM spec takes it.
func hardware(s config.VMShape) proxmox.Hardware {
	return proxmox.Hardware{BIOS: s.BIOS, Machine: s.Machine, SCSIHW: s.SCSIHW, Cache: s.Cache,
		Ballooning: s.Ballooning == config.On, RNG: s.RNG == config.On, PCI: pciDevices(s.PCI),
		SecureBoot: s.SecureBootOn(), TPM: s.TPMOn()}
}

// pciDevices are a node's pci devices as the VM spec takes them.
func pciDevices(devs []config.PCIDevice) []proxmox.PCIDevice {
	var out []proxmox.PCIDevice
	for _, d := range devs {
		out = append(out, proxmox.PCIDevice{Mapping: d.Mapping, PCIe: d.PCIe, PrimaryGPU: d.PrimaryGPU, ROMBar: d.ROMBar, MDev: d.MDev})
	}
	return out
}

// ISOSource is the Talos ISO: configured, or derived from the schematic;
// the checksum is "<algorithm>:<hex>".
func ISOSource(cfg *config.Config) proxmox.ISOSource {
	im := cfg.Images()
	src := proxmox.ISOSource{Storage: cfg.Proxmox.ISOStorage, Filename: im.ISOFile, URL: im.ISOURL}
	if algo, sum, ok := strings.Cut(im.ISOChecksum, ":"); ok {
		src.ChecksumAlgorithm, src.Checksum = algo, sum
	}
	return src
}

// factoryChecksum takes the checksum of a derived ISO from the factory
// when the config gives none: an Enterprise factory publishes one, the
// community one does not (the download is then unverified, warned).
func factoryChecksum(ctx context.Context, env *Env, src *proxmox.ISOSource) error {
	if src.Checksum != "" {
		return nil
	}
	c, err := FactoryClient(env)
	if err != nil {
		return err
	}
	sum, ok, err := c.Checksum(ctx, src.URL)
	switch {
	case err != nil:
		return fmt.Errorf("asking %s for the ISO's checksum: %w", c.URL(), err)
	case ok:
		src.ChecksumAlgorithm, src.Checksum = "sha256", sum
	default:
		env.UI.Warn("%s publishes no checksum for %s: the download is not verified (set proxmox.iso.checksum to verify it)", c.URL(), src.Filename)
	}
	return nil
}

// Prechecks implements Prechecker: the Proxmox host can take the VMs.
func (ProvisionStage) Prechecks(ctx context.Context, env *Env) []check.Check {
	c, err := ProxmoxClient(ctx, env)
	if err != nil {
		return []check.Check{{Name: "proxmox: client", Run: func(context.Context) (check.Status, string) {
			return check.Failf("%v", err)
		}}}
	}
	specs, err := VMSpecs(env.Config)
	if err != nil {
		return []check.Check{{Name: "proxmox: VM specs", Run: func(context.Context) (check.Status, string) {
			return check.Failf("%v", err)
		}}}
	}
	return append(proxmox.Prechecks(c, proxmox.PrecheckInput{Cluster: env.Config.Cluster.Name, VMs: specs, ISO: ISOSource(env.Config),
		Hosts: env.Config.Proxmox.Hosts, HA: env.Config.Proxmox.HA, Boot: bootInput(env.Config), Booted: env.setBoot,
		ImageSizeBytes: factory.DiskImageBytes(env.Config.Cluster.TalosVersion)}), factoryCheck(env))
}

// Run implements Stage.
func (ProvisionStage) Run(ctx context.Context, env *Env) error {
	cfg := env.Config
	c, err := ProxmoxClient(ctx, env)
	if err != nil {
		return err
	}
	specs, err := VMSpecs(cfg)
	if err != nil {
		return err
	}

	// 1. Where each VM runs: where it is when it exists, else the
	// config's host or the placement over proxmox.hosts. The listing is
	// also what the plans below read.
	vms, err := c.ListVMs(ctx)
	if err != nil {
		return err
	}
	warnLeftNodes(env, proxmox.ClusterVMs(vms, cfg.Cluster.Name))
	// A control plane etcd cannot add now gets no VM; a member whose VM
	// is stopped is started by this stage, or booting already.
	stopped := map[string]bool{}
	for _, v := range proxmox.ClusterVMs(vms, cfg.Cluster.Name) {
		stopped[v.Name] = v.Status == "stopped"
	}
	if err := refuseEtcdJoin(ctx, env, func(v talos.Voter) bool {
		return v.Stage == talos.StageBooting || !v.Answers && slices.ContainsFunc(cfg.ControlPlanes(), func(n config.Node) bool { return n.IP == v.IP && stopped[n.Name] })
	}); err != nil {
		return err
	}
	if specs, err = c.PlaceVMs(ctx, specs, cfg.Proxmox.Hosts, vms); err != nil {
		return err
	}
	if len(cfg.Proxmox.Hosts) > 1 {
		env.UI.OK("placement: %s", describePlacement(specs))
	}

	// 2. How new VMs get Talos (proxmox.boot) and the file they boot from
	// on each member that runs one: the disk image their disks are
	// imported from, or the ISO they install from; 3. beside it, the plan
	// of every VM before any is changed: a VMID held by another VM or
	// unsafe drift stops the stage with no VM half done. The plans only
	// read, and a download is a task on the member that goes on whatever
	// the plans say, so the stage waits for both and reports both.
	var (
		boot    proxmox.BootChoice
		refusal error
		fileErr error
		files   sync.WaitGroup
	)
	// The boot is chosen, and the disk image downloaded, only where a VM
	// is created: a member holding only VMs that exist imports nothing.
	hosts, creating := usedHosts(specs), proxmox.CreatingMembers(specs, vms)
	files.Go(func() {
		if boot, refusal, fileErr = chooseBoot(ctx, env, c, creating); fileErr != nil || refusal != nil {
			return
		}
		if fileErr = ensureBootFile(ctx, env, c, hosts, creating, boot); fileErr != nil {
			return
		}
		fileErr = ensureSecureBootISO(ctx, env, c, specs)
	})
	plans, planErrs := c.PlanVMs(ctx, specs, vms)
	files.Wait()
	if fileErr != nil {
		return fileErr
	}
	if refusal != nil {
		// proxmox.boot image, and the host cannot: refused before any
		// change when a VM is to be created, else the VMs there are kept
		// as they are (with the ISO ISO-booted ones may need).
		for i, p := range plans {
			if planErrs[i] == nil && (p.Create || p.WaitCreate) {
				return config.Userf("%v; nothing was changed", refusal)
			}
		}
		if err := ensureFiles(ctx, env, c, hosts, isoFile(cfg)); err != nil {
			return err
		}
		if err := ensureSecureBootISO(ctx, env, c, specs); err != nil {
			return err
		}
	}
	if boot.Mode == proxmox.BootImage {
		for i := range plans {
			if plans[i].Spec.Hardware.SecureBoot {
				continue // the Secure Boot ISO enrolls the keys (secureboot.go)
			}
			plans[i].Spec.Image = proxmox.ImportVolID(boot.Image.Storage, boot.Image.Filename)
		}
	}
	var problems []error
	for i, s := range specs {
		p, err := plans[i], planErrs[i]
		if err == nil {
			err = p.Refused()
		}
		if err != nil {
			problems = append(problems, err)
			continue
		}
		if p.Elsewhere != "" {
			env.UI.Warn("VM %d %s runs on %s, not on %s where the config puts it: adopted where it is (migrate it to %s to follow the config)", s.VMID, s.Name, p.Spec.Node, p.Elsewhere, p.Elsewhere)
		}
		for _, d := range p.Drift {
			switch {
			case d.Pending:
				env.UI.Warn("VM %d %s: %s", s.VMID, s.Name, d)
			case d.Kind == proxmox.DriftReport:
				env.UI.Warn("VM %d %s differs from the config, left as is: %s", s.VMID, s.Name, d)
			}
		}
	}
	if len(problems) > 0 {
		return errors.Join(problems...)
	}

	// 4. Create or adopt, then start, a bounded number of VMs at a time.
	if err := forEach(env, len(plans), max(cfg.Proxmox.Parallelism, 1), func(i int) error {
		return provisionVM(ctx, env, c, plans[i])
	}); err != nil {
		return err
	}
	// 5. HA keeps the control planes apart, now that they are HA resources.
	if err := ensureSeparation(ctx, env, c, specs); err != nil {
		return err
	}
	if env.DryRun {
		return nil
	}

	// 6. Every node up in Talos maintenance mode (or already configured).
	nodes := map[string]string{}
	for _, s := range specs {
		nodes[s.Name] = s.IPv4.Addr().String()
	}
	if err := proxmox.WaitTalosAPI(ctx, proxmox.TalosWait{Nodes: nodes, Timeout: cfg.Proxmox.BootTimeout.D(), Log: env.Log}); err != nil {
		return fmt.Errorf("%w (is the VLAN/bridge right, and does the %s boot?)", err, bootWhat(boot))
	}
	env.UI.OK("Talos API answers on all %d node(s)", len(nodes))
	return nil
}

// provisionVM creates or updates one VM as planned, records its facts and
// starts it.
func provisionVM(ctx context.Context, env *Env, c *proxmox.Client, p proxmox.Plan) error {
	s := p.Spec
	changes := p.Changes()
	if len(changes) > 0 {
		if err := env.Wet(strings.Join(changes, "; "), func() error {
			_, err := c.ApplyPlan(ctx, p)
			return err
		}); err != nil {
			return err
		}
	} else {
		env.UI.OK("VM %d %s matches the config", s.VMID, s.Name)
	}
	if !env.DryRun {
		n := env.Node(s.Name)
		n.Role, n.VMID, n.IP, n.MAC, n.DiskBus, n.Host = s.Role, s.VMID, s.IPv4.Addr().String(), s.EffectiveMAC(), s.Bus(), s.Node
		env.SetNode(n)
		if err := env.SaveState(); err != nil {
			return fmt.Errorf("writing state: %w", err)
		}
	}
	if p.Start {
		if err := env.Wet(fmt.Sprintf("start VM %d %s", s.VMID, s.Name), func() error {
			return c.On(s.Node).Start(ctx, s.VMID)
		}); err != nil {
			return err
		}
	}
	if !env.Config.Proxmox.HA || p.HAManaged {
		return nil
	}
	// After the start: HA's requested state "started" then matches, and
	// the start was a plain one (an HA-managed VM's start only queues a
	// request for the HA stack).
	return env.Wet(fmt.Sprintf("add VM %d %s to the Proxmox HA resources", s.VMID, s.Name), func() error {
		return c.AddToHA(ctx, s.VMID)
	})
}

// ensureSeparation keeps the control planes on separate members under
// proxmox.ha: placement puts them apart, but HA moves VMs later (failover,
// maintenance mode, the CRS rebalancer). PVE 9 has a rule for it
// (proxmox/harules.go), created or set here; where there is none (PVE 8,
// fewer members than control planes) the run warns.
func ensureSeparation(ctx context.Context, env *Env, c *proxmox.Client, specs []proxmox.VMSpec) error {
	if !env.Config.Proxmox.HA {
		return nil
	}
	var cps []int
	for _, s := range specs {
		if s.Role == config.RoleControlPlane {
			cps = append(cps, s.VMID)
		}
	}
	if len(cps) < 2 {
		return nil
	}
	p, err := c.PlanSeparation(ctx, env.Config.Cluster.Name, cps)
	if err != nil {
		return err
	}
	if why := p.Skip(); why != "" {
		env.UI.Warn("control planes under HA: %s", why)
		return nil
	}
	if p.Converged() {
		env.UI.OK("HA rule %s keeps the control planes on separate members", p.ID)
		return nil
	}
	return env.Wet(p.Change(), func() error { return c.ApplySeparation(ctx, p) })
}

// bootFile is the file new VMs boot from, kept on each member that
// creates one: the Talos ISO, or the factory's disk image on an import
// storage.
type bootFile struct {
	what  string // "ISO", "disk image"
	src   proxmox.ISOSource
	find  func(ctx context.Context, c *proxmox.Client) (bool, error)
	fetch func(c *proxmox.Client, ctx context.Context, src proxmox.ISOSource) error
	// derived: the file comes from the schematic (the factory builds it
	// only for a schematic it holds, and may publish its checksum).
	derived bool
}

// isoFile is the Talos ISO as a bootFile.
func isoFile(cfg *config.Config) bootFile {
	return bootFile{what: "ISO", src: ISOSource(cfg), derived: cfg.Images().ISODerived,
		find: func(ctx context.Context, c *proxmox.Client) (bool, error) {
			_, ok, err := c.FindISO(ctx, ISOSource(cfg).Storage, ISOSource(cfg).Filename)
			return ok, err
		},
		fetch: (*proxmox.Client).FetchISO,
	}
}

// imageFile is the disk image of a boot choice as a bootFile.
func imageFile(img proxmox.ISOSource) bootFile {
	return bootFile{what: "disk image", src: img, derived: true,
		find: func(ctx context.Context, c *proxmox.Client) (bool, error) {
			return c.FindImage(ctx, img.Storage, img.Filename)
		},
		fetch: (*proxmox.Client).FetchImage,
	}
}

// ensureFiles makes f present on every member in hosts. Members fetch
// their own copies at the same time: a download is a task on the member
// that runs it (download_url is proxyto node and forks a "download"
// worker there, pve-storage 9.1.7 src/PVE/API2/Storage/Status.pm). On a
// shared storage the first member's copy serves the others, so they look
// for it once that one is done. A dry run lists them in order.
func ensureFiles(ctx context.Context, env *Env, c *proxmox.Client, hosts []string, f bootFile) error {
	// Where the file already is, and whether its storage is shared, are
	// independent reads: asked at once, the download starts after the
	// slowest of them instead of their sum.
	present := make([]bool, len(hosts))
	shared := false
	var g errgroup.Group
	for i, h := range hosts {
		g.Go(func() error {
			ok, err := f.find(ctx, c.On(h))
			if err != nil {
				return fmt.Errorf("looking for %s on %s: %w", f.src.Filename, fileWhere(env, f, h), err)
			}
			present[i] = ok
			return nil
		})
	}
	if len(hosts) > 1 {
		g.Go(func() error {
			shared = storageShared(ctx, c.On(hosts[0]), f.src.Storage)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	var missing []string
	for i, h := range hosts {
		if present[i] {
			env.UI.OK("%s %s present on %s", f.what, f.src.Filename, fileWhere(env, f, h))
		} else {
			missing = append(missing, h)
		}
	}
	first, rest := missing, []string(nil)
	if shared && len(missing) > 1 {
		first, rest = missing[:1], missing[1:]
	}
	if err := forEach(env, len(first), 0, func(i int) error {
		return fetchFile(ctx, env, c.On(first[i]), f)
	}); err != nil {
		return err
	}
	return forEach(env, len(rest), 0, func(i int) error {
		return ensureFile(ctx, env, c.On(rest[i]), f)
	})
}

// forEach calls f for 0…n-1, limit at a time (0: all at once), and joins
// their errors. A dry run only records, in order, so the plan reads like
// the config.
func forEach(env *Env, n, limit int, f func(i int) error) error {
	errs := make([]error, n)
	if env.DryRun {
		for i := range n {
			errs[i] = f(i)
		}
		return errors.Join(errs...)
	}
	if limit < 1 {
		limit = n
	}
	sem := make(chan struct{}, max(limit, 1))
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// storageShared says whether the member sees storage as shared; one it
// cannot list counts as shared, the order that is safe either way.
func storageShared(ctx context.Context, c *proxmox.Client, storage string) bool {
	sts, err := c.Storages(ctx)
	if err != nil {
		return true
	}
	for _, st := range sts {
		if st.Name == storage {
			return st.Shared
		}
	}
	return false
}

// ensureFile makes f present on c's member: found, or fetched.
func ensureFile(ctx context.Context, env *Env, c *proxmox.Client, f bootFile) error {
	if present, err := f.find(ctx, c); err != nil {
		return fmt.Errorf("looking for %s on %s: %w", f.src.Filename, fileWhere(env, f, c.Node()), err)
	} else if present {
		env.UI.OK("%s %s present on %s", f.what, f.src.Filename, fileWhere(env, f, c.Node()))
		return nil
	}
	return fetchFile(ctx, env, c, f)
}

// fetchFile downloads f, which its caller found missing on c's member,
// registering the schematic first when the factory builds the file: it
// builds nothing for an ID it does not hold.
func fetchFile(ctx context.Context, env *Env, c *proxmox.Client, f bootFile) error {
	src := f.src
	where := fileWhere(env, f, c.Node())
	if src.URL == "" {
		return config.Userf("%s %s is not on storage %s and proxmox.iso.url is empty", f.what, src.Filename, where)
	}
	if f.derived {
		if err := ensureSchematic(ctx, env); err != nil {
			return err
		}
		if err := factoryChecksum(ctx, env, &src); err != nil {
			return err
		}
	}
	verify := "unverified"
	if src.Checksum != "" {
		verify = src.ChecksumAlgorithm + " verified"
	}
	return env.Wet(fmt.Sprintf("download %s to %s from %s (%s)", src.Filename, where, src.URL, verify), func() error {
		return f.fetch(c, ctx, src)
	})
}

// fileWhere names f's storage, and the member when there are several.
func fileWhere(env *Env, f bootFile, host string) string {
	where := f.src.Storage
	if len(env.Config.Proxmox.Hosts) > 1 {
		where += " on " + host
	}
	return where
}

// usedHosts lists the members the specs run on, in first-use order.
func usedHosts(specs []proxmox.VMSpec) []string {
	var out []string
	seen := map[string]bool{}
	for _, s := range specs {
		if !seen[s.Node] {
			seen[s.Node] = true
			out = append(out, s.Node)
		}
	}
	return out
}

// describePlacement is "cp-1 → pve1, cp-2 → pve2, ...".
func describePlacement(specs []proxmox.VMSpec) string {
	parts := make([]string, 0, len(specs))
	for _, s := range specs {
		parts = append(parts, s.Name+" → "+s.Node)
	}
	return strings.Join(parts, ", ")
}
