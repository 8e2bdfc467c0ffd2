package proxmox

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/internal/retry"
	"github.com/homelab/bootstrap/lab/pvesim"
	"github.com/homelab/bootstrap/lab/qcow2"
)

// newCluster starts a pvesim cluster of nodes and a client of its first
// member with the cluster's token.
func newCluster(t *testing.T, o pvesim.Options, nodes []pvesim.NodeSpec, perNode map[string]pvesim.Options) ([]*pvesim.Server, *Client) {
	t.Helper()
	if o.RemoteFiles == nil {
		o.RemoteFiles = map[string]pvesim.RemoteFile{isoURL: {Content: isoBytes},
			imageURL: {Content: append(qcow2.Header(1246<<20), isoBytes...)}}
	}
	ms, err := pvesim.NewCluster(o, nodes, perNode)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, m := range ms {
			_ = m.Close()
		}
	})
	id, secret := ms[0].Token()
	c, err := New(ctxT(t), Options{URL: ms[0].URL(), Node: nodes[0].Name, TokenID: id, TokenSecret: secret, Fingerprint: ms[0].Fingerprint(),
		Log: zerolog.Nop(), Retry: retry.Policy{Attempts: 4}, TaskPoll: 20e6})
	if err != nil {
		t.Fatal(err)
	}
	return ms, c
}

// createOn creates and starts spec s from the ISO on member node.
func createOn(t *testing.T, c *Client, s VMSpec, node string) {
	t.Helper()
	ctx := ctxT(t)
	src := iso
	src.Checksum = isoSum()
	if _, err := c.On(node).EnsureISO(ctx, src); err != nil {
		t.Fatal(err)
	}
	s.Node = node
	vms, err := c.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.PlanVM(ctx, s, vms)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ApplyPlan(ctx, p); err != nil {
		t.Fatal(err)
	}
}

// The boot is judged only on the members that create a VM: create_vm
// imports on the member it runs on (proxyto node), so a member holding
// only a VM that exists, on a storage without 'import', neither blocks
// the disk image nor gets it downloaded.
func TestBootJudgedOnlyWhereAVMIsCreated(t *testing.T) {
	noImport := []pvesim.StorageSpec{
		{Name: "local", Type: "dir", Content: []string{"iso", "vztmpl", "backup"}, TotalBytes: 94 << 30, Path: "/var/lib/vz"},
		{Name: "local-lvm", Type: "lvmthin", Content: []string{"images", "rootdir"}, TotalBytes: 348 << 30},
	}
	_, c := newCluster(t, pvesim.Options{Bridges: vlanBridge, Version: "8.4.21"},
		[]pvesim.NodeSpec{{Name: "pve1"}, {Name: "pve2"}},
		map[string]pvesim.Options{"pve1": {Storages: noImport}, "pve2": {Storages: importStorages}})
	createOn(t, c, spec(1), "pve1")
	in := precheckInput(2)
	in.VMs[0].Node, in.VMs[1].Node = "pve1", "pve2"
	in.Hosts = []string{"pve1", "pve2"}
	var told BootChoice
	in.Boot, in.Booted = BootInput{Want: "auto", Image: image, ISOStorage: "local"}, func(b BootChoice, _ error) { told = b }
	rs := runPrechecks(t, c, in)
	expect(t, rs, BootCheck, check.Pass, "new VMs boot the disk image", "from local (to be downloaded)")
	if told.Mode != BootImage || !slices.Equal(told.Missing, []string{"pve2"}) {
		t.Errorf("boot choice %+v, want the image downloaded to pve2 only", told)
	}

	// Once every VM exists, no member is judged: nothing is chosen.
	createOn(t, c, spec(2), "pve2")
	in.Boot.Want = "image"
	rs = runPrechecks(t, c, in)
	expect(t, rs, BootCheck, check.Pass, "nothing: every VM exists")
	if told.Mode != BootNone {
		t.Errorf("boot choice %+v with every VM there", told)
	}
}

// Starting an HA-managed VM is a 'hastart' task that only sets the
// requested state; the HA stack starts the VM a CRM round later. Start
// returns once the VM runs, not when the task ends.
func TestStartHAManagedVMWaitsUntilItRuns(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge})
	ctx := ctxT(t)
	e.provision(ctx, e.c, specs(1))
	if err := e.sim.SetHAManaged(701, true); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Stop(ctx, 701); err != nil {
		t.Fatal(err)
	}
	before := e.sim.Counts()["POST /nodes/pve/qemu/701/status/start"]
	if err := e.c.Start(ctx, 701); err != nil {
		t.Fatal(err)
	}
	if st, err := e.c.Status(ctx, 701); err != nil || !st.Running() {
		t.Fatalf("after Start: %+v %v", st, err)
	}
	if got := e.sim.Counts()["POST /nodes/pve/qemu/701/status/start"] - before; got != 1 {
		t.Errorf("%d start requests, want 1", got)
	}
}

// The HA row counts the ISO storage only when a VM holds the ISO: new
// VMs created from the disk image have no cdrom, so a local ISO storage
// does not keep HA from moving them.
func TestHARowCountsTheISOOnlyWhenAVMHoldsIt(t *testing.T) {
	shared := []pvesim.StorageSpec{
		{Name: "local", Type: "dir", Content: []string{"iso", "vztmpl", "backup", "import"}, TotalBytes: 94 << 30, Path: "/var/lib/vz"},
		{Name: "nas", Type: "nfs", Content: []string{"images"}, TotalBytes: 2 << 40, Shared: true},
	}
	_, c := newCluster(t, pvesim.Options{Bridges: vlanBridge, Version: "8.4.21", Storages: shared},
		[]pvesim.NodeSpec{{Name: "pve1"}, {Name: "pve2"}}, nil)
	in := precheckInput(2)
	for i := range in.VMs {
		in.VMs[i].DiskStorage = "nas"
	}
	in.Hosts, in.HA = []string{"pve1", "pve2"}, true
	in.Boot = BootInput{Want: "image", Image: image, ISOStorage: "local"}
	rs := runPrechecks(t, c, in)
	expect(t, rs, BootCheck, check.Pass, "the disk image")
	// It warns all the same: PVE 8 cannot keep the two control planes apart.
	expect(t, rs, "proxmox: HA", check.Warn, "its disk and ISO are on shared storage", "PVE 8.4.21 has no HA rule that keeps VMs apart")
	in.Boot.Want = "iso"
	rs = runPrechecks(t, c, in)
	expect(t, rs, "proxmox: HA", check.Warn, "local is not shared")
}

// The image download's room is judged against the image, not the ISO:
// a storage with room for an ISO but less than the image's virtual size
// warns that the download may not fit.
func TestImageRoomJudgedAgainstTheImage(t *testing.T) {
	small := slices.Clone(importStorages)
	small[0].UsedBytes = small[0].TotalBytes - 1<<30 // 1 GiB free
	_, c := bootEnv(t, "8.4.21", small, RunnerPrivileges(testVersion(t, "8.4.21")))
	in := precheckInput(1)
	in.Boot = BootInput{Want: "auto", Image: image, ISOStorage: "local"}
	in.ImageSizeBytes = 4247 << 20
	rs := runPrechecks(t, c, in)
	expect(t, rs, BootCheck, check.Pass, "the disk image")
	expect(t, rs, "proxmox: ISO storage", check.Warn, "1.0 GiB free", "up to 4.1 GiB")
	in.ImageSizeBytes = 0
	rs = runPrechecks(t, c, in)
	expect(t, rs, "proxmox: ISO storage", check.Warn, "its size is not known")
}

// A VLAN-aware bridge carries on its ports only the VLANs of its
// bridge-vids: a VLAN outside them is refused before a VM starts with no
// way out of the host. PVE starts such a VM all the same (pvesim marks
// its start Isolated, and the lab boots no reachable node for it). VLAN 1
// is the one a VLAN-aware bridge gives an untagged VM too: the ports carry
// it untagged as their PVID, whatever bridge-vids says.
func TestBridgeVIDsHoldTheVLAN(t *testing.T) {
	for _, tc := range []struct {
		vids string
		vlan int
		st   check.Status
		has  string
	}{
		{"10 30", 20, check.Fail, "carry only VLANs 10 30 (bridge-vids), not VLAN 20"},
		{"2-4094", 20, check.Pass, "VLAN-aware, VLAN 20"},
		{"10,15-25", 20, check.Pass, "VLAN-aware, VLAN 20"},
		{"", 20, check.Pass, "VLAN-aware, VLAN 20"},
		{"2-4094", 1, check.Pass, "VLAN-aware, VLAN 1"},
		{"10 30", 1, check.Pass, "VLAN-aware, VLAN 1"},
	} {
		t.Run(fmt.Sprintf("%s/vlan%d", tc.vids, tc.vlan), func(t *testing.T) {
			e := newEnv(t, pvesim.Options{Bridges: []pvesim.BridgeSpec{{Name: "vmbr0", VLANAware: true, VIDs: tc.vids, Ports: "enp1s0"}}})
			in := precheckInput(1)
			in.VMs[0].VLAN = tc.vlan
			expect(t, runPrechecks(t, e.c, in), "proxmox: bridge", tc.st, tc.has)
			e.provision(ctxT(t), e.c, in.VMs)
			e.mu.Lock()
			ev, started := e.starts[701]
			e.mu.Unlock()
			if !started || ev.Isolated != (tc.st == check.Fail) {
				t.Errorf("start: %v, isolated %v", started, ev.Isolated)
			}
		})
	}
}

// A zfspool with 'sparse' creates zvols that reserve nothing: read from
// the storage config where the token may (Datastore.Allocate), it is
// judged thin; where it may not, a shortfall warns, naming the option,
// instead of refusing a run Proxmox would carry out.
func TestSparseZFSPoolIsThin(t *testing.T) {
	storages := []pvesim.StorageSpec{
		{Name: "local", Type: "dir", Content: []string{"iso"}, TotalBytes: 94 << 30, Path: "/var/lib/vz"},
		{Name: "local-zfs", Type: "zfspool", Content: []string{"images"}, TotalBytes: 100 << 30, UsedBytes: 90 << 30, Sparse: true},
	}
	role := RunnerPrivileges(testVersion(t, "8.4.21"))
	for _, tc := range []struct {
		name  string
		privs []string
		has   []string
	}{
		{"Datastore.Allocate", append(slices.Clone(role), "Datastore.Allocate"), []string{"local-zfs (thin): 40.0 GiB for new disks, 10.0 GiB free"}},
		{"README's role", role, []string{"unless the storage is 'sparse', which this token cannot read (Datastore.Allocate on /storage/local-zfs reads it)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acl := []pvesim.ACE{{Path: "/", Privileges: tc.privs}}
			e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Version: "8.4.21", Storages: storages,
				Users:  []pvesim.User{{ID: "bootstrap@pve", ACL: acl}},
				Tokens: []pvesim.Token{{ID: "bootstrap@pve!run", Secret: "s", ACL: acl}}})
			c := e.client(func(o *Options) { o.TokenID, o.TokenSecret = "bootstrap@pve!run", "s" })
			in := onStorage(precheckInput(2), "local-zfs")
			expect(t, runPrechecks(t, c, in), "proxmox: disk storage", check.Warn, tc.has...)
			// And PVE creates them.
			e.provision(ctxT(t), e.c, in.VMs)
			e.checkProvisioned(in.VMs)
		})
	}
}

// A VM migrated since it was listed reads "does not exist" on the member
// listed: the destroy finds it where it runs now and removes it there,
// instead of reporting it gone.
func TestDestroyFollowsAMigratedVM(t *testing.T) {
	ms, c := newCluster(t, pvesim.Options{Bridges: vlanBridge}, []pvesim.NodeSpec{{Name: "pve1"}, {Name: "pve2"}}, nil)
	ctx := ctxT(t)
	createOn(t, c, spec(1), "pve1")
	listed, err := c.FindClusterVMs(ctx, "lab")
	if err != nil || len(listed) != 1 || listed[0].Node != "pve1" {
		t.Fatalf("listed %+v %v", listed, err)
	}
	if err := ms[0].EditVM(701, map[string]string{"ide2": "none,media=cdrom"}); err != nil {
		t.Fatal(err)
	}
	if err := ms[0].Migrate(ctx, 701, "pve2"); err != nil {
		t.Fatal(err)
	}
	if err := c.DestroyClusterVM(ctx, "lab", listed[0]); err != nil {
		t.Fatal(err)
	}
	if node := ms[0].VMNode(701); node != "" {
		t.Fatalf("VM 701 still on %s", node)
	}
}

// With several members the VMs' cpu type host is compared across them:
// differing CPU models are named, with a generic type that migrates.
func TestCPUModelsCompared(t *testing.T) {
	_, c := newCluster(t, pvesim.Options{Bridges: vlanBridge},
		[]pvesim.NodeSpec{{Name: "pve1"}, {Name: "pve2", CPUModel: "AMD Ryzen 7 5800U"}, {Name: "pve3"}}, nil)
	in := precheckInput(3)
	in.Hosts = []string{"pve1", "pve2", "pve3"}
	expect(t, runPrechecks(t, c, in), CPUModelsCheck, check.Warn,
		"Intel(R) N100 on pve1, pve3; AMD Ryzen 7 5800U on pve2", "to a generic type such as x86-64-v2-AES", "node-1, node-2, node-3 get cpu type host")
	// proxmox.cpu x86-64-v2-AES: the row passes and new VMs get that type;
	// an adopted VM of another type is reported, not changed.
	for i := range in.VMs {
		in.VMs[i].CPU = "x86-64-v2-AES"
	}
	expect(t, runPrechecks(t, c, in), CPUModelsCheck, check.Pass, "new VMs get cpu type x86-64-v2-AES")
	ctx := ctxT(t)
	createOn(t, c, in.VMs[0], "pve2")
	cfg, err := c.On("pve2").VMConfig(ctx, 701)
	if err != nil || cfg.CPU != "x86-64-v2-AES" {
		t.Fatalf("created VM cpu %q, %v", cfg.CPU, err)
	}
	vms, err := c.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	host := in.VMs[0]
	host.CPU, host.Node = "", "pve2"
	p, err := c.PlanVM(ctx, host, vms)
	if err != nil || len(p.Changes()) > 0 || len(p.Drift) != 1 || p.Drift[0].Field != "CPU type" || p.Drift[0].Kind != DriftReport {
		t.Errorf("adopting a VM of another CPU type: changes %v, drift %+v, %v", p.Changes(), p.Drift, err)
	}
	_, c = newCluster(t, pvesim.Options{Bridges: vlanBridge}, []pvesim.NodeSpec{{Name: "pve1"}, {Name: "pve2"}}, nil)
	in = precheckInput(3)
	in.Hosts = []string{"pve1", "pve2"}
	expect(t, runPrechecks(t, c, in), CPUModelsCheck, check.Pass, "every member has a Intel(R) N100")
}

// A VM installed from the ISO keeps it in its cdrom drive, which keeps
// Proxmox from migrating it off a local ISO storage; once Talos runs from
// the disk the talos stage ejects it (EjectISO), the VM migrates, and the
// next plan sees no drift.
func TestEjectedISOLetsTheVMMigrate(t *testing.T) {
	ms, c := newCluster(t, pvesim.Options{Bridges: vlanBridge}, []pvesim.NodeSpec{{Name: "pve1"}, {Name: "pve2"}}, nil)
	ctx := ctxT(t)
	s := spec(1)
	createOn(t, c, s, "pve1")
	if err := ms[0].Migrate(ctx, 701, "pve2"); err == nil || !strings.Contains(err.Error(), "can't migrate VM") {
		t.Fatalf("migration with the ISO in the cdrom: %v", err)
	}
	if ejected, err := c.On("pve1").EjectISO(ctx, 701); err != nil || !ejected {
		t.Fatalf("eject: %v %v", ejected, err)
	}
	if ejected, err := c.On("pve1").EjectISO(ctx, 701); err != nil || ejected {
		t.Fatalf("second eject: %v %v", ejected, err)
	}
	if err := ms[0].Migrate(ctx, 701, "pve2"); err != nil {
		t.Fatalf("migration once the ISO is ejected: %v", err)
	}
	vms, err := c.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Node = "pve2"
	p, err := c.PlanVM(ctx, s, vms)
	if err != nil || len(p.Drift) > 0 || len(p.Changes()) > 0 {
		t.Errorf("plan after the eject: drift %v, changes %v, %v", p.Drift, p.Changes(), err)
	}
}
