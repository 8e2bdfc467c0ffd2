package proxmox

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/internal/retry"
	"github.com/homelab/bootstrap/lab/pvesim"
)

// These tests pin what real Proxmox VE does (sources in docs/fidelity.md)
// where the product's earlier assumptions broke on a real host.

// allPrivs is every privilege on /, without those listed.
func allPrivs(without ...string) []string {
	var out []string
	for _, p := range pvesim.AllPrivileges("8.2.4") {
		if !strings.Contains(strings.Join(without, " "), p) {
			out = append(out, p)
		}
	}
	return out
}

// A host with a warm page cache: MemFree is low, MemAvailable is not.
func TestHeadroomCountsThePageCache(t *testing.T) {
	for _, version := range []string{"8.4.1", "9.1.2"} {
		t.Run(version, func(t *testing.T) {
			e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Version: version,
				Node: pvesim.NodeSpec{MemoryBytes: 16 << 30, PageCacheBytes: 12 << 30}})
			in := precheckInput(3)
			for i := range in.VMs {
				in.VMs[i].MemoryMiB = 4096
			}
			rs := runPrechecks(t, e.c, in)
			expect(t, rs, "proxmox: RAM and CPU headroom", check.Pass, "RAM 13.5 GiB of 16.0 GiB after start")
		})
	}
}

// A ZFS host: the ARC is used memory to Linux, but ZFS gives it back to
// VMs. PVE 9 reports its size in the node RRD; PVE 8 does not, so there
// the precheck cannot count it: with a zfspool on the member it warns
// (qemu-server starts VMs without a memory check, and they start), without
// one the shortfall fails.
func TestHeadroomCountsTheZFSARC(t *testing.T) {
	zfs := []pvesim.StorageSpec{
		{Name: "local", Type: "dir", Content: []string{"iso"}, TotalBytes: 94 << 30, Path: "/var/lib/vz"},
		{Name: "local-zfs", Type: "zfspool", Content: []string{"images"}, TotalBytes: 348 << 30, Sparse: true},
	}
	for _, tc := range []struct {
		name, version string
		storages      []pvesim.StorageSpec
		status        check.Status
		want          string
	}{
		// 1.5 GiB host + 6 GiB ARC of 16 GiB: 8.5 GiB available, 12 needed.
		{"9.1.2", "9.1.2", nil, check.Warn, "RAM 13.5 GiB of 16.0 GiB after start (84%), 6 vCPUs on 4 CPUs; ZFS ARC 6.0 GiB not counted as used: the VMs need 3.5 GiB more than is available"},
		{"8.4.1 zfspool", "8.4.1", zfs, check.Warn, "12.0 GiB RAM needed for VMs to start, 8.5 GiB available of 16.0 GiB: the ZFS ARC, which Linux counts as used, may hold the rest, but Proxmox VE 8.4.1 does not report its size"},
		{"8.4.1 no zfspool", "8.4.1", nil, check.Fail, "12.0 GiB RAM needed for VMs to start, only 8.5 GiB available of 16.0 GiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Version: tc.version, Storages: tc.storages,
				Node: pvesim.NodeSpec{MemoryBytes: 16 << 30, PageCacheBytes: 1 << 30, ARCBytes: 6 << 30}})
			in := precheckInput(3)
			for i := range in.VMs {
				in.VMs[i].MemoryMiB = 4096
			}
			if tc.storages != nil {
				in = onStorage(in, "local-zfs")
			}
			rs := runPrechecks(t, e.c, in)
			expect(t, rs, "proxmox: RAM and CPU headroom", tc.status, tc.want)
			if tc.storages != nil {
				// Proxmox starts them: no memory check at start.
				e.provision(ctxT(t), e.c, in.VMs)
				e.checkProvisioned(in.VMs)
				return
			}
			if tc.status == check.Warn {
				// More than the ARC can give back is still a failure.
				in.VMs[0].MemoryMiB = 8192
				rs = runPrechecks(t, e.c, in)
				expect(t, rs, "proxmox: RAM and CPU headroom", check.Fail, "16.0 GiB RAM needed", "even with all of the ZFS ARC (6.0 GiB) given back")
			}
		})
	}
}

// /cluster/resources lists containers too, and leaves out guests the token
// cannot audit. (A VM of this cluster on another member is adopted there:
// TestSeveralMembers.)
func TestVMIDsHeldByWhatTheListDoesNotShow(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge,
		Guests: []pvesim.GuestSpec{
			{VMID: 701, Type: "lxc", Name: "pihole"},
			{VMID: 704, Type: "qemu", Name: "vault"},
		},
		Tokens: []pvesim.Token{{ID: "bootstrap@pve!run", Secret: "s", ACL: []pvesim.ACE{
			{Path: "/", Privileges: allPrivs()},
			// No VM.Audit on 704: the list leaves it out.
			{Path: "/vms/704", Privileges: []string{"VM.Config.Options"}},
		}}}})
	c := e.client(func(o *Options) { o.TokenID, o.TokenSecret = "bootstrap@pve!run", "s" })
	rs := runPrechecks(t, c, precheckInput(4))
	expect(t, rs, "proxmox: VMIDs and names", check.Fail,
		"CT 701 exists",
		"VMID 704 is taken by a VM or container this token cannot audit")
}

// pvestatd broadcasts guest status every 10 s; until then a new VM is listed
// without a name and with status unknown, a started one with its old status.
func TestListingLagDoesNotHideNamesOrInventStarts(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Profile: func() pvesim.Profile {
		p := pvesim.Instant()
		p.RRDInterval = time.Hour
		return p
	}()})
	ctx := ctxT(t)
	// A foreign VM created moments ago with the name node-2.
	if err := e.sim.SeedVM(650, map[string]string{"name": "node-2", "scsi0": "local-lvm:8"}, false); err != nil {
		t.Fatal(err)
	}
	vms, err := e.c.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.PlanVM(ctx, spec(2), vms); err == nil || !strings.Contains(err.Error(), "the name node-2 is used by VM 650") {
		t.Fatalf("a new VM's name must be read from its config: %v", err)
	}
	// Our own VM, created and started: the re-run plans no start.
	e.provision(ctx, e.c, specs(1))
	vms, err = e.c.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := e.c.PlanVM(ctx, spec(1), vms)
	if err != nil {
		t.Fatal(err)
	}
	if p.Start || len(p.Changes()) != 0 {
		t.Errorf("a running VM listed with a stale status must not be started again: %v", p.Changes())
	}
}

// A create interrupted (the run killed) while PVE still creates the VM:
// after pvestatd's next broadcast the VM is listed as "VM <vmid>" with the
// create lock, no longer nameless, and the next run still waits for it.
func TestInterruptedCreateAfterTheNextBroadcast(t *testing.T) {
	p := pvesim.Instant()
	p.Create, p.RRDInterval = 3*time.Second, 50*time.Millisecond
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Profile: p})
	if err := e.sim.AddISO(pvesim.ISOSpec{Storage: "local", Name: iso.Filename, Content: isoBytes}); err != nil {
		t.Fatal(err)
	}
	killed, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	defer cancel()
	if _, err := e.c.EnsureVM(killed, spec(1)); err == nil {
		t.Fatal("the create returned before its task ended")
	}
	time.Sleep(200 * time.Millisecond) // past a broadcast
	ctx := ctxT(t)
	vms, err := e.c.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(vms) != 1 || vms[0].Name != "VM 701" || vms[0].Lock != "create" {
		t.Fatalf("PVE lists a VM being created, after a broadcast, as VM 701 with lock create: %+v", vms)
	}
	plan, err := e.c.PlanVM(ctx, spec(1), vms)
	if err != nil || !plan.WaitCreate {
		t.Fatalf("want a wait for the create, got %+v, %v", plan, err)
	}
	if _, err := e.c.EnsureVM(ctx, spec(1)); err != nil {
		t.Fatalf("resuming the create: %v", err)
	}
	st, err := e.c.Status(ctx, 701)
	if err != nil || st.Name != "node-1" || st.Lock != "" {
		t.Fatalf("after the resumed create: %+v %v", st, err)
	}
}

// PVE 8+ lists only the bridges a token may audit or use; a VNet's
// privileges live under its own zone.
func TestBridgesAndVNetsNeedTheirZonesPrivileges(t *testing.T) {
	e := newEnv(t, pvesim.Options{
		Bridges: []pvesim.BridgeSpec{{Name: "vmbr0", VLANAware: true, Ports: "enp1s0"}, {Name: "homelab", Zone: "lab"}},
		Tokens: []pvesim.Token{{ID: "bootstrap@pve!run", Secret: "s", ACL: []pvesim.ACE{
			{Path: "/", Privileges: allPrivs("SDN.Audit", "SDN.Use", "SDN.Allocate")},
			{Path: "/sdn/zones/lab/homelab", Privileges: []string{"SDN.Use", "SDN.Audit"}},
		}}}})
	c := e.client(func(o *Options) { o.TokenID, o.TokenSecret = "bootstrap@pve!run", "s" })
	rs := runPrechecks(t, c, precheckInput(1))
	expect(t, rs, "proxmox: bridge", check.Fail, "bridge vmbr0 is not visible to the token: it needs SDN.Use (or at least SDN.Audit) on /sdn/zones/localnetwork/vmbr0")

	in := precheckInput(1)
	in.VMs[0].Bridge, in.VMs[0].VLAN = "homelab", 0
	rs = runPrechecks(t, c, in)
	expect(t, rs, "proxmox: bridge", check.Pass)
	expect(t, rs, "proxmox: privileges", check.Pass)
	if err := e.sim.AddISO(pvesim.ISOSpec{Storage: "local", Name: iso.Filename, Content: isoBytes}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.EnsureVM(ctxT(t), in.VMs[0]); err != nil {
		t.Fatalf("creating a VM on the VNet: %v", err)
	}
}

// A VLAN works on every kind of bridge PVE has: a VLAN-aware Linux bridge,
// an Open vSwitch bridge (tagged on the port) and a Linux bridge that is
// not VLAN aware (the classic <bridge>v<tag> over <port>.<tag>, built at
// start), which needs a port. The precheck says which, and predicts the
// start.
func TestVLANOnEveryKindOfBridge(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bridge pvesim.BridgeSpec
		status check.Status
		reason string
	}{
		{"vlan-aware", pvesim.BridgeSpec{Name: "vmbr0", VLANAware: true, Ports: "enp1s0"}, check.Pass, "vmbr0 (VLAN-aware, VLAN 20)"},
		{"ovs", pvesim.BridgeSpec{Name: "vmbr0", OVS: true, Ports: "enp1s0 vlan20"}, check.Pass, "vmbr0 (Open vSwitch, VLAN 20 tagged on the VM's port)"},
		{"classic", pvesim.BridgeSpec{Name: "vmbr0", Ports: "enp1s0"}, check.Pass, "vmbr0 (VLAN 20 through vmbr0v20 over enp1s0.20"},
		{"classic without a port", pvesim.BridgeSpec{Name: "vmbr0"}, check.Fail, "no physical interface on bridge 'vmbr0'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, pvesim.Options{Bridges: []pvesim.BridgeSpec{tc.bridge}, Version: "9.2.11"})
			expect(t, runPrechecks(t, e.c, precheckInput(1)), "proxmox: bridge", tc.status, tc.reason)
			if err := e.sim.AddISO(pvesim.ISOSpec{Storage: "local", Name: iso.Filename, Content: isoBytes}); err != nil {
				t.Fatal(err)
			}
			// The create takes any bridge; the start is where PVE plugs the NIC.
			if _, err := e.c.EnsureVM(ctxT(t), spec(1)); err != nil {
				t.Fatal(err)
			}
			err := e.c.Start(ctxT(t), spec(1).VMID)
			if tc.status == check.Pass && err != nil {
				t.Fatalf("the precheck passed, the start failed: %v", err)
			}
			if tc.status == check.Fail && (err == nil || !strings.Contains(err.Error(), "no physical interface on bridge 'vmbr0'")) {
				t.Fatalf("start: want PVE's 'no physical interface', got %v", err)
			}
		})
	}
}

// A create checks tags only from qemu-server 9.2.0, inside its task, and
// then refuses every tag to a token without Sys.Modify on / unless
// user-tag-access is free (the 'HASH(0x…)' old tag). The precheck predicts
// what the create does, per version.
func TestTagsOnCreateByVersion(t *testing.T) {
	noSysModify := []pvesim.Token{{ID: "bootstrap@pve!run", Secret: "s", ACL: []pvesim.ACE{{Path: "/", Privileges: allPrivs("Sys.Modify")}}}}
	restricted := pvesim.Datacenter{UserTagAccess: "list", UserAllowList: []string{"talos", "controlplane"}}
	// Every tag of the VM is in the allow-list: still refused on 9.2.
	listed := pvesim.Datacenter{UserTagAccess: "list", UserAllowList: []string{"talos", "controlplane", "bootstrap-lab"}}
	registered := pvesim.Datacenter{RegisteredTags: []string{"talos"}}
	for _, tc := range []struct {
		name, version string
		dc            pvesim.Datacenter
		status        check.Status
		reason        string
		createErr     string
	}{
		{"8.4 restricted", "8.4.1", restricted, check.Pass, "does not check the tags", ""},
		{"9.1 restricted", "9.1.2", restricted, check.Pass, "does not check the tags", ""},
		{"9.2 free", "9.2.11", pvesim.Datacenter{}, check.Pass, "may be set", ""},
		{"9.2 listed", "9.2.11", listed, check.Fail, "user-tag-access list", "Sys.Modify for modifying tag 'HASH(0x"},
		{"9.2 registered", "9.2.11", registered, check.Fail, "registered tags need Sys.Modify: talos", "Sys.Modify for modifying tag 'talos'"},
		// pve-manager 9.2.4 came out before qemu-server 9.2.0: such a host
		// may run 9.1.19, whose create checks no tag.
		{"9.2 manager on qemu-server 9.1.19", "9.2.4/9.1.19", listed, check.Pass, "qemu-server 9.1.19 on pve does not check", ""},
		{"9.2 manager on qemu-server 9.2.0", "9.2.4/9.2.0", listed, check.Fail, "qemu-server 9.2.0 on pve checks tags", "Sys.Modify for modifying tag 'HASH(0x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			version, qemuServer, _ := strings.Cut(tc.version, "/")
			e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Version: version, QemuServer: qemuServer, Datacenter: tc.dc, Tokens: noSysModify})
			c := e.client(func(o *Options) { o.TokenID, o.TokenSecret = "bootstrap@pve!run", "s" })
			expect(t, runPrechecks(t, c, precheckInput(1)), "proxmox: tags", tc.status, tc.reason)
			if err := e.sim.AddISO(pvesim.ISOSpec{Storage: "local", Name: iso.Filename, Content: isoBytes}); err != nil {
				t.Fatal(err)
			}
			_, err := c.EnsureVM(ctxT(t), spec(1))
			switch {
			case tc.createErr == "" && err != nil:
				t.Fatalf("the precheck passed, the create failed: %v", err)
			case tc.createErr != "" && (err == nil || !strings.Contains(err.Error(), tc.createErr)):
				t.Fatalf("create: want %q, got %v", tc.createErr, err)
			}
		})
	}
	// Sys.Modify on / sets any tag, on any version.
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Version: "9.2.11", Datacenter: listed})
	expect(t, runPrechecks(t, e.c, precheckInput(1)), "proxmox: tags", check.Pass, "Sys.Modify on /")
	if err := e.sim.AddISO(pvesim.ISOSpec{Storage: "local", Name: iso.Filename, Content: isoBytes}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.EnsureVM(ctxT(t), spec(1)); err != nil {
		t.Fatal(err)
	}
}

// An adopted VM that lost a tag gets it back through PUT config, and
// $update_vm_api checks every added tag on every version (qemu-server
// 8.4.10 and 9.2.6, assert_tag_permissions): the precheck judges those
// tags too, not only the created VMs'.
func TestTagsAddedToAnAdoptedVMAreChecked(t *testing.T) {
	noSysModify := []pvesim.Token{{ID: "bootstrap@pve!run", Secret: "s", ACL: []pvesim.ACE{{Path: "/", Privileges: allPrivs("Sys.Modify")}}},
		{ID: "root@pam!admin", Secret: "a", ACL: pvesim.Admin("8.4.1")}}
	for _, tc := range []struct {
		name      string
		dc        pvesim.Datacenter
		status    check.Status
		reason    string
		updateErr string
	}{
		{"free", pvesim.Datacenter{}, check.Pass, "tags controlplane may be set", ""},
		{"list without the tag", pvesim.Datacenter{UserTagAccess: "list", UserAllowList: []string{"talos"}}, check.Fail,
			"does not let the token set the tag(s) controlplane", "Sys.Modify for modifying tag 'controlplane'"},
		{"registered", pvesim.Datacenter{RegisteredTags: []string{"controlplane"}}, check.Fail,
			"registered tags need Sys.Modify: controlplane", "Sys.Modify for modifying tag 'controlplane'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Version: "8.4.1", Datacenter: tc.dc, Tokens: noSysModify})
			admin := e.client(func(o *Options) { o.TokenID, o.TokenSecret = "root@pam!admin", "a" })
			if err := e.sim.AddISO(pvesim.ISOSpec{Storage: "local", Name: iso.Filename, Content: isoBytes}); err != nil {
				t.Fatal(err)
			}
			s := spec(1)
			if _, err := admin.EnsureVM(ctxT(t), s); err != nil {
				t.Fatal(err)
			}
			// Someone took the role tag off.
			var kept []string
			for _, tag := range s.Tags() {
				if tag != "controlplane" {
					kept = append(kept, tag)
				}
			}
			if _, err := admin.put(ctxT(t), admin.vmPath(s.VMID)+"/config", map[string]any{"tags": strings.Join(kept, ";")}); err != nil {
				t.Fatal(err)
			}
			c := e.client(func(o *Options) { o.TokenID, o.TokenSecret = "bootstrap@pve!run", "s" })
			expect(t, runPrechecks(t, c, precheckInput(1)), "proxmox: tags", tc.status, tc.reason)
			_, err := c.EnsureVM(ctxT(t), s)
			switch {
			case tc.updateErr == "" && err != nil:
				t.Fatalf("the precheck passed, the update failed: %v", err)
			case tc.updateErr != "" && (err == nil || !strings.Contains(err.Error(), tc.updateErr)):
				t.Fatalf("update: want %q, got %v", tc.updateErr, err)
			}
		})
	}
}

// The cloud-init volume needs no Datastore.AllocateSpace, and
// Sys.AccessNetwork is offered only where it exists.
func TestPrivilegesAsProxmoxChecksThem(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Version: "8.1.4",
		Storages: []pvesim.StorageSpec{
			{Name: "local", Type: "dir", Content: []string{"iso"}, TotalBytes: 94 << 30, Path: "/var/lib/vz"},
			{Name: "local-lvm", Type: "lvmthin", Content: []string{"images"}, TotalBytes: 348 << 30},
			{Name: "ci", Type: "lvmthin", Content: []string{"images"}, TotalBytes: 8 << 30},
		},
		Tokens: []pvesim.Token{{ID: "bootstrap@pve!run", Secret: "s", ACL: []pvesim.ACE{
			{Path: "/", Privileges: allPrivs("Sys.Modify")},
			{Path: "/storage/ci", Privileges: []string{"Datastore.Audit"}},
		}}}})
	c := e.client(func(o *Options) { o.TokenID, o.TokenSecret = "bootstrap@pve!run", "s" })
	in := precheckInput(1)
	in.VMs[0].CloudInitStorage = "ci"
	in.ISO.URL = isoURL
	rs := runPrechecks(t, c, in)
	r := rs["proxmox: privileges"]
	if strings.Contains(r.Reason, "/storage/ci") || strings.Contains(r.Reason, "Sys.AccessNetwork") || !strings.Contains(r.Reason, "Sys.Modify on /") {
		t.Errorf("privileges: %s %s (want only Sys.Modify on / for the download: no AllocateSpace for cloud-init, no Sys.AccessNetwork before PVE 8.2)", r.Status, r.Reason)
	}
}

// Login tickets last two hours: a long run renews its ticket.
func TestPasswordTicketIsRenewed(t *testing.T) {
	p := pvesim.Instant()
	p.TicketLifetime = 400 * time.Millisecond
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Profile: p,
		Users: []pvesim.User{{ID: "bootstrap@pve", Password: "pw", ACL: pvesim.Admin("8.2.4")}}})
	c := e.client(func(o *Options) {
		o.TokenID, o.TokenSecret, o.Username, o.Password = "", "", "bootstrap@pve", "pw"
		o.TicketRenewAfter = 200 * time.Millisecond
	})
	ctx := ctxT(t)
	deadline := time.Now().Add(1200 * time.Millisecond)
	for time.Now().Before(deadline) {
		if _, err := c.Version(ctx); err != nil {
			t.Fatalf("after the first ticket's lifetime: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := e.sim.Count("POST", "/access/ticket"); n < 3 {
		t.Errorf("%d logins in 1.2 s of a 0.4 s ticket: not renewed", n)
	}
}

// Only the lock texts PVE emits are retried.
func TestLockTextsAreProxmoxs(t *testing.T) {
	for msg, lock := range map[string]bool{
		"VM is locked (create)": true,
		"can't lock file '/var/lock/qemu-server/lock-701.conf' - got timeout": true,
		"cfs-lock 'file-user_cfg' error: got lock request timeout":            true,
		"resource busy": false,
	} {
		if got := IsLockError(&APIError{Status: 500, Message: msg}); got != lock {
			t.Errorf("%q: lock error %v, want %v", msg, got, lock)
		}
	}
}

// A privilege-separated token holds what both its own ACL and its user's
// grant.
func TestPrivsepTokenLackingOnePrivilege(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge,
		Users:  []pvesim.User{{ID: "bootstrap@pve", ACL: []pvesim.ACE{{Path: "/", Privileges: allPrivs("VM.Allocate")}}}},
		Tokens: []pvesim.Token{{ID: "bootstrap@pve!run", Secret: "s", ACL: pvesim.Admin("8.2.4")}}})
	c := e.client(func(o *Options) { o.TokenID, o.TokenSecret = "bootstrap@pve!run", "s" })
	rs := runPrechecks(t, c, precheckInput(1))
	expect(t, rs, "proxmox: privileges", check.Fail, "VM.Allocate on /vms/701")
	_, err := c.EnsureVM(ctxT(t), spec(1))
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 403 || !strings.Contains(err.Error(), "VM.Allocate") {
		t.Fatalf("create with the privsep token: %v", err)
	}
}

// The VMs start with the host: pve-guests' startall at boot starts only
// guests with onboot set (pve-manager PVE/API2/Nodes.pm
// get_start_stop_list). A created VM has it; an adopted VM without it is
// fixed.
func TestVMsStartWithTheHost(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge})
	if err := e.sim.AddISO(pvesim.ISOSpec{Storage: "local", Name: iso.Filename, Content: isoBytes}); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	onboot := func(vmid int) string {
		cfg, err := e.c.VMConfig(ctx, vmid)
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Effective["onboot"]
	}
	if _, err := e.c.EnsureVM(ctx, spec(1)); err != nil {
		t.Fatal(err)
	}
	if v := onboot(701); v != "1" {
		t.Fatalf("created VM onboot=%q, want 1", v)
	}
	// Someone turned it off: the next run turns it on again.
	if err := e.sim.EditVM(701, map[string]string{"onboot": "0"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.EnsureVM(ctx, spec(1)); err != nil {
		t.Fatal(err)
	}
	if v := onboot(701); v != "1" {
		t.Fatalf("adopted VM onboot=%q, want 1", v)
	}
}

// An HA-managed VM: its stop is a 'hastop' task that only queues the
// request, and its delete needs purge. With Sys.Console on / the VM is
// taken out of HA first; without, HA stops it and the delete purges it.
func TestDestroyHAManagedVM(t *testing.T) {
	for _, tc := range []struct {
		name  string
		privs []string
	}{{"with Sys.Console", allPrivs()}, {"without Sys.Console", allPrivs("Sys.Console")}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, pvesim.Options{Bridges: vlanBridge,
				Tokens: []pvesim.Token{{ID: "bootstrap@pve!run", Secret: "s", ACL: []pvesim.ACE{{Path: "/", Privileges: tc.privs}}}}})
			c := e.client(func(o *Options) { o.TokenID, o.TokenSecret = "bootstrap@pve!run", "s" })
			ctx := ctxT(t)
			e.provision(ctx, e.c, specs(1))
			if err := e.sim.SetHAManaged(701, true); err != nil {
				t.Fatal(err)
			}
			if st, err := c.Status(ctx, 701); err != nil || !st.HAManaged || !st.Running() {
				t.Fatalf("status: %+v %v", st, err)
			}
			// The guest powers itself off (a Talos reset): HA starts it
			// again a CRM round later, and the destroy still removes it.
			if err := e.sim.GuestPowerOff(701); err != nil {
				t.Fatal(err)
			}
			if st, err := c.Status(ctx, 701); err != nil || st.Running() {
				t.Fatalf("after the guest's power-off: %+v %v", st, err)
			}
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if st, err := c.Status(ctx, 701); err == nil && st.Running() {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("HA did not start the VM again")
				}
			}
			if err := c.DestroyClusterVM(ctx, "lab", VMSummary{VMID: 701, Node: "pve"}); err != nil {
				t.Fatal(err)
			}
			if _, ok := e.sim.VM(701); ok || e.sim.HAManaged(701) {
				t.Fatalf("VM 701 left (HA resource: %v)", e.sim.HAManaged(701))
			}
		})
	}
}

// An offline storage for VM disks (an NFS share whose server is down)
// makes PVE's destroy with destroy-unreferenced-disks fail after it
// deleted the VM's disks; the delete leaves that flag out then.
func TestDestroyWithAnOfflineStorage(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Storages: []pvesim.StorageSpec{
		{Name: "local", Type: "dir", Content: []string{"iso"}, TotalBytes: 94 << 30, Path: "/var/lib/vz"},
		{Name: "local-lvm", Type: "lvmthin", Content: []string{"images"}, TotalBytes: 348 << 30},
		{Name: "nas", Type: "nfs", Content: []string{"images", "backup"}, TotalBytes: 2 << 40, Shared: true},
	}})
	ctx := ctxT(t)
	e.provision(ctx, e.c, specs(1))
	if err := e.sim.SetStorageOffline("nas", true); err != nil {
		t.Fatal(err)
	}
	if err := e.c.DestroyClusterVM(ctx, "lab", VMSummary{VMID: 701}); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.sim.VM(701); ok {
		t.Fatal("VM 701 left")
	}
}

// Answers that describe a state are not retried: a node name the cluster
// cannot resolve, a path PVE has no handler for (501).
func TestPermanentErrorsAreNotRetried(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge})
	c := e.client(func(o *Options) { o.Node = "pve3" })
	ctx := ctxT(t)
	before := e.sim.Counts()["GET /nodes/pve3/qemu/701/status/current"]
	_, err := c.Status(ctx, 701)
	if err == nil || !strings.Contains(err.Error(), "hostname lookup 'pve3' failed") || retry.IsRetryable(err) {
		t.Fatalf("want a permanent hostname lookup error, got %v", err)
	}
	if n := e.sim.Counts()["GET /nodes/pve3/qemu/701/status/current"] - before; n != 1 {
		t.Fatalf("the call was made %d times", n)
	}
	_, err = e.c.getMap(ctx, "/nodes/pve/no-such-path")
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 501 || retry.IsRetryable(err) {
		t.Fatalf("want a permanent 501, got %v", err)
	}
}

// A destroy deletes the VM's own ACL entries (remove_vm_access): a token
// granted on /vms/<vmid> cannot create the VM again. VMGrants tells it
// before: the grant differs from /vms, and /vms lacks the create
// privileges (node replace refuses on it before the node leaves).
func TestDestroyDeletesTheVMsGrants(t *testing.T) {
	base := []string{"Sys.Audit", "Datastore.AllocateSpace", "Datastore.Audit", "Datastore.AllocateTemplate", "SDN.Use", "Sys.AccessNetwork", "VM.Audit"}
	acl := []pvesim.ACE{{Path: "/", Privileges: base}, {Path: "/vms/701", Privileges: CreatePrivileges()}}
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge,
		Users:  []pvesim.User{{ID: "bootstrap@pve", ACL: acl}},
		Tokens: []pvesim.Token{{ID: "bootstrap@pve!run", Secret: "s", ACL: acl}, {ID: "root@pam!admin", Secret: "a", ACL: pvesim.Admin("8.2.4")}}})
	if err := e.sim.AddISO(pvesim.ISOSpec{Storage: "local", Name: iso.Filename, Content: isoBytes}); err != nil {
		t.Fatal(err)
	}
	c := e.client(func(o *Options) { o.TokenID, o.TokenSecret = "bootstrap@pve!run", "s" })
	ctx := ctxT(t)
	s := spec(1)
	if _, err := c.EnsureVM(ctx, s); err != nil {
		t.Fatalf("the per-VM grant creates the VM: %v", err)
	}
	perVM, lack, err := c.VMGrants(ctx, s.VMID)
	if err != nil || !perVM || len(lack) == 0 || !slices.Contains(lack, "VM.Allocate") {
		t.Fatalf("VMGrants: %v %v %v", perVM, lack, err)
	}
	vms, err := c.FindClusterVMs(ctx, s.Cluster)
	if err != nil || len(vms) != 1 {
		t.Fatalf("%v %v", vms, err)
	}
	if err := c.DestroyClusterVM(ctx, s.Cluster, vms[0]); err != nil {
		t.Fatal(err)
	}
	if perVM, _, err := c.VMGrants(ctx, s.VMID); err != nil || perVM {
		t.Errorf("after the destroy the grant is still there: %v %v", perVM, err)
	}
	if _, err := c.EnsureVM(ctx, s); err == nil || !strings.Contains(err.Error(), "403 Permission check failed") {
		t.Fatalf("re-create without the grant: %v", err)
	}
}
