package proxmox

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/lab/pvesim"
)

var vlanBridge = []pvesim.BridgeSpec{{Name: "vmbr0", VLANAware: true, Ports: "enp1s0"}}

func precheckInput(n int) PrecheckInput {
	src := iso
	src.Checksum = isoSum()
	return PrecheckInput{Cluster: "lab", VMs: specs(n), ISO: src}
}

func runPrechecks(t *testing.T, c *Client, in PrecheckInput) map[string]check.Result {
	t.Helper()
	ctx := ctxT(t)
	results := check.RunAll(ctx, Prechecks(c, in), 4)
	var table bytes.Buffer
	_ = check.Table(&table, results)
	t.Logf("\n%s", table.String())
	out := map[string]check.Result{}
	for _, r := range results {
		out[r.Name] = r
	}
	return out
}

func expect(t *testing.T, rs map[string]check.Result, name string, st check.Status, reasonHas ...string) {
	t.Helper()
	r, ok := rs[name]
	if !ok {
		t.Fatalf("no check %q", name)
	}
	if r.Status != st {
		t.Errorf("%s: %s (%s), want %s", name, r.Status, r.Reason, st)
	}
	for _, s := range reasonHas {
		if !strings.Contains(r.Reason, s) {
			t.Errorf("%s: reason %q lacks %q", name, r.Reason, s)
		}
	}
}

func TestPrechecksPassOnAReadyHost(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge})
	rs := runPrechecks(t, e.c, precheckInput(6))
	for name, r := range rs {
		if r.Status != check.Pass {
			t.Errorf("%s: %s %s", name, r.Status, r.Reason)
		}
	}
	expect(t, rs, "proxmox: ISO storage", check.Pass, "will be downloaded")
	expect(t, rs, "proxmox: disk storage", check.Pass, "local-lvm (thin): 120.0 GiB for new disks, 348.0 GiB free, 120.0 GiB of 348.0 GiB committed")
	expect(t, rs, "proxmox: VMIDs and names", check.Pass, "6 to create, 0")
	if n := e.sim.MutatingCalls(); n != 0 {
		t.Errorf("prechecks made changes: %v", e.sim.MutatingCallList())
	}
}

func TestPrecheckNamesEveryMissingPrivilege(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Tokens: []pvesim.Token{{
		ID: "bootstrap@pve!run", Secret: "secret",
		ACL: []pvesim.ACE{
			{Path: "/", Privileges: []string{"Sys.Audit", "Datastore.Audit", "VM.Audit"}},
			{Path: "/vms", Privileges: []string{"VM.Allocate", "VM.Audit", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Options", "VM.Config.HWType", "VM.Config.Disk", "VM.Config.Network"}},
			{Path: "/storage/local-lvm", Privileges: []string{"Datastore.AllocateSpace", "Datastore.Audit"}},
		},
	}}})
	c := e.client(func(o *Options) { o.TokenID, o.TokenSecret = "bootstrap@pve!run", "secret" })
	rs := runPrechecks(t, c, precheckInput(2))
	expect(t, rs, "proxmox: privileges", check.Fail,
		"VM.PowerMgmt on /vms/701, /vms/702",
		"SDN.Use on /sdn/zones/localnetwork/vmbr0/20",
		"Datastore.AllocateTemplate on /storage/local",
		"one of (Sys.Audit+Sys.Modify on / or Sys.AccessNetwork on /nodes/pve)")
	if strings.Contains(rs["proxmox: privileges"].Reason, "VM.Allocate") {
		t.Errorf("granted privileges must not be listed: %s", rs["proxmox: privileges"].Reason)
	}
	expect(t, rs, "proxmox: token", check.Pass)
}

// A 403 says what PVE's own message names (here SDN.Use on the VLAN the
// NIC asks for), not a privilege guessed from the call.
func TestForbiddenNamesTheMissingPrivilege(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Tokens: []pvesim.Token{{
		ID: "bootstrap@pve!run", Secret: "secret",
		ACL: []pvesim.ACE{
			{Path: "/", Privileges: []string{"Sys.Audit", "Datastore.Audit", "VM.Audit"}},
			{Path: "/vms", Privileges: []string{"VM.Allocate", "VM.Audit", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Options", "VM.Config.HWType", "VM.Config.Disk", "VM.Config.Network", "VM.Config.CDROM", "VM.Config.Cloudinit"}},
			{Path: "/storage", Privileges: []string{"Datastore.AllocateSpace", "Datastore.Audit"}},
		},
	}}, ISOs: []pvesim.ISOSpec{{Storage: "local", Name: "talos-nocloud-amd64.iso", Size: 100 << 20}}})
	c := e.client(func(o *Options) { o.TokenID, o.TokenSecret = "bootstrap@pve!run", "secret" })
	_, err := c.EnsureVM(ctxT(t), spec(1))
	want := "the token needs SDN.Use on /sdn/zones/localnetwork/vmbr0/20"
	if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "needs VM.Allocate") {
		t.Fatalf("create without SDN.Use: %v\nwant it to say %q", err, want)
	}
	var ae *APIError
	if !errors.As(err, &ae) {
		t.Fatalf("%T", err)
	}
	if path, privs, ok := ae.MissingPrivilege(); !ok || path != "/sdn/zones/localnetwork/vmbr0/20" || len(privs) != 1 || privs[0] != "SDN.Use" {
		t.Errorf("MissingPrivilege: %q %q %v", path, privs, ok)
	}
	if _, ok := e.sim.VM(701); ok {
		t.Error("a VM was created")
	}
}

// thinAndThick is a host with every kind of disk storage the precheck
// judges differently.
var thinAndThick = []pvesim.StorageSpec{
	{Name: "local", Type: "dir", Content: []string{"iso", "images"}, TotalBytes: 94 << 30, Path: "/var/lib/vz"},
	{Name: "local-lvm", Type: "lvmthin", Content: []string{"images"}, TotalBytes: 100 << 30},
	{Name: "thick", Type: "lvm", Content: []string{"images"}, TotalBytes: 100 << 30},
	{Name: "local-zfs", Type: "zfspool", Content: []string{"images"}, TotalBytes: 100 << 30},
}

func onStorage(in PrecheckInput, storage string) PrecheckInput {
	for i := range in.VMs {
		in.VMs[i].DiskStorage = storage
	}
	return in
}

func TestPrecheckCatchesFullStorage(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Storages: thinAndThick})
	for _, st := range []string{"thick", "local-zfs", "local-lvm"} {
		if err := e.sim.SetStorageUsed(st, 52<<30); err != nil {
			t.Fatal(err)
		}
	}
	// Thick storage must hold the disks now; a zfspool too unless it is
	// sparse (TestSparseZFSPoolIsThin).
	rs := runPrechecks(t, e.c, onStorage(precheckInput(3), "thick"))
	expect(t, rs, "proxmox: disk storage", check.Fail, "storage thick: 60.0 GiB needed for 3 new disk(s), only 48.0 GiB free")
	rs = runPrechecks(t, e.c, onStorage(precheckInput(3), "local-zfs"))
	expect(t, rs, "proxmox: disk storage", check.Fail, "storage local-zfs: 60.0 GiB needed", "the storage is not 'sparse'")
	// A thin pool creates them anyway: a warning.
	rs = runPrechecks(t, e.c, onStorage(precheckInput(3), "local-lvm"))
	expect(t, rs, "proxmox: disk storage", check.Warn, "local-lvm (thin): 60.0 GiB for new disks, 48.0 GiB free",
		"local-lvm has 48.0 GiB free, less than the 60.0 GiB the new disks may hold")
	if err := e.sim.SetStorageUsed("local", 94<<30); err != nil {
		t.Fatal(err)
	}
	rs = runPrechecks(t, e.c, precheckInput(1))
	expect(t, rs, "proxmox: ISO storage", check.Fail, "must be downloaded but local has only 0.0 GiB free")
}

// A thin pool holds what guests write, not the sizes of their disks: the
// disks are created past its free space, and a pool whose disks may hold
// more than it has is a warning (when it fills, every VM on it fails).
func TestThinPoolOvercommit(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Storages: thinAndThick})
	ctx := ctxT(t)
	// Two VMs of someone else's with 29 GiB disks, nearly empty.
	for id, name := range map[int]string{650: "nas", 651: "media"} {
		if err := e.sim.SeedVM(id, map[string]string{"name": name, "scsi0": "local-lvm:29"}, false); err != nil {
			t.Fatal(err)
		}
	}
	in := onStorage(precheckInput(2), "local-lvm")
	rs := runPrechecks(t, e.c, in)
	expect(t, rs, "proxmox: disk storage", check.Pass, "local-lvm (thin): 40.0 GiB for new disks, 100.0 GiB free, 98.0 GiB of 100.0 GiB committed (98%)")
	in = onStorage(precheckInput(3), "local-lvm")
	rs = runPrechecks(t, e.c, in)
	expect(t, rs, "proxmox: disk storage", check.Warn, "118.0 GiB of 100.0 GiB committed (118%)",
		"local-lvm is overcommitted: its disks may hold 118.0 GiB, the storage has 100.0 GiB")
	// And PVE creates them.
	e.provision(ctx, e.c, in.VMs)
	e.checkProvisioned(in.VMs)
}

// Ceph RBD images take nothing from the pool when created (rbd create
// --size): a nearly full pool warns and the VMs are created; ZFS over
// iSCSI is like a zfspool, thin only with 'sparse'.
func TestRBDIsThin(t *testing.T) {
	storages := []pvesim.StorageSpec{
		{Name: "local", Type: "dir", Content: []string{"iso"}, TotalBytes: 94 << 30, Path: "/var/lib/vz"},
		{Name: "ceph", Type: "rbd", Content: []string{"images"}, TotalBytes: 100 << 30, UsedBytes: 90 << 30, Shared: true},
		{Name: "iscsi", Type: "zfs", Content: []string{"images"}, TotalBytes: 100 << 30, UsedBytes: 90 << 30, Shared: true},
	}
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Storages: storages})
	in := onStorage(precheckInput(3), "ceph")
	expect(t, runPrechecks(t, e.c, in), "proxmox: disk storage", check.Warn, "ceph (thin): 60.0 GiB for new disks, 10.0 GiB free",
		"ceph has 10.0 GiB free, less than the 60.0 GiB the new disks may hold")
	e.provision(ctxT(t), e.c, in.VMs)
	e.checkProvisioned(in.VMs)
	e = newEnv(t, pvesim.Options{Bridges: vlanBridge, Storages: storages})
	expect(t, runPrechecks(t, e.c, onStorage(precheckInput(1), "iscsi")), "proxmox: disk storage", check.Fail,
		"a zfs zvol reserves its whole size: the storage is not 'sparse'")
}

// The content index shows a VM's image only with Datastore.Audit on the
// storage and VM.Config.Disk on the VM (or Datastore.Allocate): with the
// README's role, which has neither storage privilege, every image is
// hidden and the committed size is unknown rather than the new disks'
// alone; with Datastore.Audit the overcommitment shows.
func TestThinPoolCommittedNeedsDatastoreAudit(t *testing.T) {
	role := RunnerPrivileges(testVersion(t, "8.2.4"))
	for _, tc := range []struct {
		name   string
		privs  []string
		status check.Status
		reason []string
	}{
		{"README role", role, check.Pass, []string{"committed size unknown", "Datastore.Audit on /storage/local-lvm"}},
		{"README role and Datastore.Audit", append(slices.Clone(role), "Datastore.Audit"), check.Warn,
			[]string{"118.0 GiB of 100.0 GiB committed (118%)", "local-lvm is overcommitted"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acl := []pvesim.ACE{{Path: "/", Privileges: tc.privs}}
			e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Storages: thinAndThick,
				Users:  []pvesim.User{{ID: "bootstrap@pve", ACL: acl}},
				Tokens: []pvesim.Token{{ID: "bootstrap@pve!run", Secret: "s", ACL: acl}, {ID: "root@pam!admin", Secret: "a", ACL: pvesim.Admin("8.2.4")}}})
			for id, name := range map[int]string{650: "nas", 651: "media"} {
				if err := e.sim.SeedVM(id, map[string]string{"name": name, "scsi0": "local-lvm:29"}, false); err != nil {
					t.Fatal(err)
				}
			}
			c := e.client(func(o *Options) { o.TokenID, o.TokenSecret = "bootstrap@pve!run", "s" })
			expect(t, runPrechecks(t, c, onStorage(precheckInput(3), "local-lvm")), "proxmox: disk storage", tc.status, tc.reason...)
		})
	}
}

func TestPrecheckHostProblems(t *testing.T) {
	e := newEnv(t, pvesim.Options{Node: pvesim.NodeSpec{MemoryBytes: 8 << 30}})
	if err := e.sim.SeedVM(702, map[string]string{"name": "pihole", "scsi0": "local-lvm:8"}, false); err != nil {
		t.Fatal(err)
	}
	in := precheckInput(3)
	in.VMs[2].Cores = 8
	e.sim.SetNodeOnline(false)
	rs := runPrechecks(t, e.c, in)
	expect(t, rs, "proxmox: node", check.Fail, "node pve is offline")
	e.sim.SetNodeOnline(true)
	rs = runPrechecks(t, e.c, in)
	expect(t, rs, "proxmox: bridge", check.Pass, "vmbr0 (VLAN 20 through vmbr0v20 over enp1s0.20")
	expect(t, rs, "proxmox: VMIDs and names", check.Fail, `vmid 702 is used by VM "pihole"`)
	expect(t, rs, "proxmox: RAM and CPU headroom", check.Fail, "VM node-3 wants 8 cores, the node has 4 CPUs")
	in.VMs[2].Cores = 2
	rs = runPrechecks(t, e.c, in)
	// 1.5 GiB host + 3×2 GiB of 8 GiB.
	expect(t, rs, "proxmox: RAM and CPU headroom", check.Warn, "above 90%")
	in.VMs[0].MemoryMiB = 4096
	rs = runPrechecks(t, e.c, in)
	expect(t, rs, "proxmox: RAM and CPU headroom", check.Fail, "8.0 GiB RAM needed for VMs to start, only 6.5 GiB available")
}

func TestPrecheckAuthAndReachability(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge})
	bad := e.client(func(o *Options) { o.TokenSecret = "nope" })
	rs := runPrechecks(t, bad, precheckInput(1))
	expect(t, rs, "proxmox: token", check.Fail, "rejected", "Authentication failed!")
	_ = e.sim.Close()
	rs = runPrechecks(t, e.c, precheckInput(1))
	expect(t, rs, "proxmox: API and version", check.Fail, "unreachable")
	// One cause, one failure: every other Proxmox row is skipped because
	// of it, naming it.
	for name, r := range rs {
		switch {
		case name == "proxmox: API and version":
		case r.Status != check.Skip:
			t.Errorf("%s is %s against a dead API, want skip: %s", name, r.Status, r.Reason)
		case !strings.Contains(r.Reason, "see proxmox: API and version"):
			t.Errorf("%s skipped without naming the cause: %s", name, r.Reason)
		}
	}
}

func TestPrecheckAfterProvisionAdoptsAndNeedsLess(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge})
	e.provision(context.Background(), e.c, specs(2))
	rs := runPrechecks(t, e.c, precheckInput(2))
	expect(t, rs, "proxmox: VMIDs and names", check.Pass, "0 to create, 2 of this cluster's to adopt")
	expect(t, rs, "proxmox: ISO storage", check.Pass, "present on local")
	expect(t, rs, "proxmox: disk storage", check.Pass, "local-lvm (thin): 0.0 GiB for new disks, 348.0 GiB free, 40.0 GiB of 348.0 GiB committed")
	expect(t, rs, "proxmox: RAM and CPU headroom", check.Pass)
}
