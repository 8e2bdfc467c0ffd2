package proxmox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/internal/retry"
	"github.com/homelab/bootstrap/lab/pvesim"
)

const isoURL = "https://factory.example/image/abc/v1.9.0/nocloud-amd64.iso"

var isoBytes = bytes.Repeat([]byte("talos-nocloud"), 4096)

func isoSum() string {
	s := sha256.Sum256(isoBytes)
	return hex.EncodeToString(s[:])
}

type env struct {
	t   *testing.T
	sim *pvesim.Server
	c   *Client
	log *bytes.Buffer

	mu     sync.Mutex
	starts map[int]pvesim.VMEvent
}

func newEnv(t *testing.T, o pvesim.Options) *env {
	t.Helper()
	if o.RemoteFiles == nil {
		o.RemoteFiles = map[string]pvesim.RemoteFile{isoURL: {Content: isoBytes}}
	}
	sim, err := pvesim.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	e := &env{t: t, sim: sim, log: &bytes.Buffer{}, starts: map[int]pvesim.VMEvent{}}
	sim.OnStart(func(ev pvesim.VMEvent) error {
		e.mu.Lock()
		e.starts[ev.VMID] = ev
		e.mu.Unlock()
		return nil
	})
	e.c = e.client(nil)
	return e
}

// client connects to the simulator pinned by fingerprint; mod adjusts options.
func (e *env) client(mod func(*Options)) *Client {
	e.t.Helper()
	id, secret := e.sim.Token()
	o := Options{
		URL: e.sim.URL(), Node: e.sim.NodeName(), TokenID: id, TokenSecret: secret, Fingerprint: e.sim.Fingerprint(),
		Log:      zerolog.New(&syncWriter{buf: e.log}).Level(zerolog.DebugLevel),
		Retry:    retry.Policy{Attempts: 8, Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		TaskPoll: 20 * time.Millisecond, TaskTimeout: 20 * time.Second,
	}
	if mod != nil {
		mod(&o)
	}
	c, err := New(context.Background(), o)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

type syncWriter struct {
	mu  sync.Mutex
	buf *bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func spec(i int) VMSpec {
	role := "worker"
	if i <= 3 {
		role = "controlplane"
	}
	return VMSpec{
		Cluster: "lab", Name: fmt.Sprintf("node-%d", i), Role: role, VMID: 700 + i,
		Cores: 2, MemoryMiB: 2048, DiskStorage: "local-lvm", DiskGiB: 20, Bridge: "vmbr0", VLAN: 20,
		ISOStorage: "local", ISOFile: "talos-nocloud-amd64.iso", GuestAgent: true,
		IPv4:        netip.MustParsePrefix(fmt.Sprintf("10.0.20.%d/24", 10+i)),
		Gateway:     netip.MustParseAddr("10.0.20.1"),
		Nameservers: []string{"10.0.20.1", "1.1.1.1"},
	}
}

func specs(n int) []VMSpec {
	out := make([]VMSpec, n)
	for i := range out {
		out[i] = spec(i + 1)
	}
	return out
}

var iso = ISOSource{Storage: "local", Filename: "talos-nocloud-amd64.iso", URL: isoURL, ChecksumAlgorithm: "sha256"}

// provision is what the provision stage does with the domain API: ISO,
// then create and start every VM in parallel.
func (e *env) provision(ctx context.Context, c *Client, ss []VMSpec) []Result {
	e.t.Helper()
	src := iso
	src.Checksum = isoSum()
	if _, err := c.EnsureISO(ctx, src); err != nil {
		e.t.Fatalf("ISO: %v", err)
	}
	results := make([]Result, len(ss))
	errs := make([]error, len(ss))
	var wg sync.WaitGroup
	for i, s := range ss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.EnsureVM(ctx, s)
			if err == nil {
				err = c.Start(ctx, s.VMID)
			}
			results[i], errs[i] = r, err
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		e.t.Fatalf("provision: %v", err)
	}
	return results
}

func (e *env) checkProvisioned(ss []VMSpec) {
	e.t.Helper()
	for _, s := range ss {
		vm, ok := e.sim.VM(s.VMID)
		if !ok {
			e.t.Fatalf("VM %d missing", s.VMID)
		}
		if vm.Status != "running" {
			e.t.Errorf("VM %d is %s", s.VMID, vm.Status)
		}
		ev := vm.Event
		if ev.Name != s.Name || ev.IPv4 != s.IPv4 || ev.MAC != s.EffectiveMAC() || ev.VLAN != 20 ||
			len(ev.Disks) != 1 || ev.Disks[0].Bus != "scsi" || ev.Disks[0].SizeBytes != 20<<30 {
			e.t.Errorf("VM %d as the guest sees it: %+v", s.VMID, ev)
		}
		if got := strings.Join(ev.Tags, ";"); got != strings.Join(s.Tags(), ";") {
			e.t.Errorf("VM %d tags %q, want %q", s.VMID, got, s.Tags())
		}
		if vm.Config["ide2"] != "local:iso/talos-nocloud-amd64.iso,media=cdrom,size="+fmt.Sprint(len(isoBytes)) &&
			!strings.HasPrefix(vm.Config["ide2"], "local:iso/talos-nocloud-amd64.iso,media=cdrom") {
			e.t.Errorf("VM %d ide2 %q", s.VMID, vm.Config["ide2"])
		}
		if vm.Config["boot"] != "order=scsi0;ide2" || vm.Config["cpu"] != "host" {
			e.t.Errorf("VM %d boot/cpu: %v", s.VMID, vm.Config)
		}
		// Talos' baseline VM: OVMF with a 4m EFI disk without
		// pre-enrolled keys (numbered after the install disk, as
		// qemu-server creates it), q35, VirtIO SCSI (not single, so no
		// IO thread), write-through cache, no balloon device.
		c := vm.Config
		if c["bios"] != "ovmf" || c["machine"] != "q35" || c["scsihw"] != "virtio-scsi-pci" || c["balloon"] != "0" ||
			!strings.HasPrefix(c["scsi0"], fmt.Sprintf("%s:vm-%d-disk-0,cache=writethrough,", s.DiskStorage, s.VMID)) || strings.Contains(c["scsi0"], "iothread") ||
			!strings.HasPrefix(c["efidisk0"], fmt.Sprintf("%s:vm-%d-disk-1,efitype=4m,pre-enrolled-keys=0,size=", s.DiskStorage, s.VMID)) {
			e.t.Errorf("VM %d is not Talos' baseline VM: %v", s.VMID, c)
		}
		e.mu.Lock()
		_, started := e.starts[s.VMID]
		e.mu.Unlock()
		if !started {
			e.t.Errorf("VM %d start hook did not fire", s.VMID)
		}
	}
}

func TestHappyPathOneVM(t *testing.T) {
	e := newEnv(t, pvesim.Options{})
	ctx := ctxT(t)
	res := e.provision(ctx, e.c, specs(1))
	if !res[0].Created || res[0].DiskBus != "scsi" || res[0].InstallDisk != "/dev/sda" || res[0].IP != "10.0.20.11" {
		t.Fatalf("result %+v", res[0])
	}
	e.checkProvisioned(specs(1))
	if n := e.sim.TaskCount("download"); n != 1 {
		t.Errorf("downloads: %d", n)
	}
}

func TestHappyPathSixVMsInParallel(t *testing.T) {
	e := newEnv(t, pvesim.Options{Profile: pvesim.N100(), TimeScale: 0.02})
	ctx := ctxT(t)
	ss := specs(6)
	start := time.Now()
	e.provision(ctx, e.c, ss)
	took := time.Since(start)
	e.checkProvisioned(ss)
	if got := e.sim.VMIDs(); len(got) != 6 {
		t.Fatalf("VMIDs %v", got)
	}
	if n := e.sim.Count("POST", "/nodes/pve/qemu"); n != 6 {
		t.Errorf("create calls: %d (a VMID collision would show as retries)", n)
	}
	// VMIDs come from the config: nextid only asserts each new one is free
	// cluster-wide (it sees guests the token cannot audit).
	if n := e.sim.Count("GET", "/cluster/nextid"); n != 6 {
		t.Errorf("nextid: %d calls, want one check per new VM", n)
	}
	// Sequential would be 6×(create 60ms + start 30ms) plus the download.
	if took > 2*time.Second {
		t.Errorf("six VMs took %s; creates do not run in parallel?", took)
	}
}

func TestRerunMakesNoMutatingCalls(t *testing.T) {
	e := newEnv(t, pvesim.Options{})
	ctx := ctxT(t)
	ss := specs(3)
	e.provision(ctx, e.c, ss)
	e.sim.ResetCounters()
	res := e.provision(ctx, e.client(nil), ss)
	if n := e.sim.MutatingCalls(); n != 0 {
		t.Fatalf("re-run made %d mutating calls: %v", n, e.sim.MutatingCallList())
	}
	for _, r := range res {
		if r.Created || !r.Adopted || len(r.Changed) != 0 {
			t.Errorf("re-run result %+v", r)
		}
	}
}

func TestDryRunMakesNoMutatingCalls(t *testing.T) {
	e := newEnv(t, pvesim.Options{})
	ctx := ctxT(t)
	if err := e.sim.SeedVM(702, map[string]string{"name": "node-2", "tags": "talos;bootstrap-lab", "cores": "1", "memory": "2048",
		"scsi0": "local-lvm:20", "net0": "virtio=" + spec(2).EffectiveMAC() + ",bridge=vmbr0,tag=20", "ipconfig0": spec(2).ipconfig0(), "agent": "1"}, true); err != nil {
		t.Fatal(err)
	}
	e.sim.ResetCounters()
	vms, err := e.c.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var changes []string
	for _, s := range specs(3) {
		p, err := e.c.PlanVM(ctx, s, vms)
		if err != nil {
			t.Fatal(err)
		}
		changes = append(changes, p.Changes()...)
		if p.Start {
			changes = append(changes, fmt.Sprintf("start VM %d", s.VMID))
		}
	}
	if _, ok, err := e.c.FindISO(ctx, iso.Storage, iso.Filename); err != nil || ok {
		t.Fatalf("ISO present=%v err=%v", ok, err)
	}
	if n := e.sim.MutatingCalls(); n != 0 {
		t.Fatalf("planning made %d mutating calls: %v", n, e.sim.MutatingCallList())
	}
	want := []string{"create VM 701 node-1", "update VM 702 node-2: cores 1 → 2, start at boot 0 → 1, tags talos;bootstrap-lab → ", "create VM 703 node-3", "start VM 701", "start VM 703"}
	all := strings.Join(changes, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("plan lacks %q:\n%s", w, all)
		}
	}
	if strings.Contains(all, "start VM 702") {
		t.Errorf("running VM 702 must not be started:\n%s", all)
	}
}

// seedOf is the config a VM created from s holds, for pvesim.SeedVM,
// without the keys named.
func seedOf(s VMSpec, without ...string) map[string]string {
	seed := map[string]string{}
	for k, v := range s.createParams() {
		if k != "vmid" && !slices.Contains(without, k) {
			seed[k] = fmt.Sprint(v)
		}
	}
	return seed
}

// A VM that exists is adopted, not created, and left as it is: its
// ejected cdrom drive is no drift.
func TestAdoptExistingVM(t *testing.T) {
	e := newEnv(t, pvesim.Options{})
	ctx := ctxT(t)
	s := spec(1)
	seed := seedOf(s)
	seed["ide2"] = "none,media=cdrom"
	if err := e.sim.SeedVM(s.VMID, seed, false); err != nil {
		t.Fatal(err)
	}
	res := e.provision(ctx, e.c, []VMSpec{s})
	if res[0].Created || !res[0].Adopted {
		t.Fatalf("result %+v", res[0])
	}
	if n := e.sim.Count("POST", "/nodes/pve/qemu"); n != 0 {
		t.Errorf("adopting must not create: %d creates", n)
	}
	// An empty cdrom drive is what the talos stage leaves once Talos is
	// installed (EjectISO): no drift to report, nothing to change.
	for _, d := range res[0].Drift {
		if d.Field == "ISO" {
			t.Errorf("the ejected ISO is reported: %+v", d)
		}
	}
	if vm, _ := e.sim.VM(s.VMID); vm.Status != "running" || vm.Config["ide2"] != "none,media=cdrom" {
		t.Errorf("adopted VM: %s ide2=%q", vm.Status, vm.Config["ide2"])
	}
}

// A VM created before the baseline (what bootstrap created until it
// followed Talos' guide: SeaBIOS, the default i440fx machine, VirtIO SCSI
// single with an IO thread, a balloon device) is adopted as it is: each
// difference reported with how to change it, nothing sent to change it.
func TestOldShapeVMIsAdoptedUnchanged(t *testing.T) {
	e := newEnv(t, pvesim.Options{})
	ctx := ctxT(t)
	s := spec(1)
	seed := seedOf(s, "bios", "machine", "efidisk0", "balloon")
	seed["ide2"] = "none,media=cdrom"
	seed["scsihw"] = "virtio-scsi-single"
	seed["scsi0"] = strings.Replace(seed["scsi0"], ",cache=writethrough", "", 1) + ",iothread=1"
	if err := e.sim.SeedVM(s.VMID, seed, false); err != nil {
		t.Fatal(err)
	}
	before, _ := e.sim.VM(s.VMID)
	res := e.provision(ctx, e.c, []VMSpec{s})
	if res[0].Created || !res[0].Adopted {
		t.Fatalf("result %+v", res[0])
	}
	want := map[string]string{"firmware": "ovmf/seabios", "machine type": "q35/pc", "SCSI controller": "virtio-scsi-pci/virtio-scsi-single", "ballooning": "off/on"}
	for _, d := range res[0].Drift {
		if w, ok := want[d.Field]; ok {
			if d.Kind != DriftReport || d.Want+"/"+d.Have != w || !strings.Contains(d.Why, "bootstrap node replace "+s.Name) {
				t.Errorf("%s: %+v, want a report %s with how to change it", d.Field, d, w)
			}
			delete(want, d.Field)
		}
	}
	if len(want) > 0 {
		t.Errorf("not reported: %v (drift %+v)", want, res[0].Drift)
	}
	if n := e.sim.Count("PUT", "/nodes/pve/qemu/701/config") + e.sim.Count("POST", "/nodes/pve/qemu/701/config"); n != 0 {
		t.Errorf("adopting an old-shape VM changed its config %d times", n)
	}
	after, _ := e.sim.VM(s.VMID)
	for _, k := range []string{"bios", "machine", "scsihw", "balloon", "efidisk0", "scsi0"} {
		if before.Config[k] != after.Config[k] {
			t.Errorf("%s changed: %q → %q", k, before.Config[k], after.Config[k])
		}
	}
}

func TestDriftReportedAndFixed(t *testing.T) {
	e := newEnv(t, pvesim.Options{})
	ctx := ctxT(t)
	s := spec(1)
	e.provision(ctx, e.c, []VMSpec{s})
	// Someone edits the running VM by hand.
	if err := e.sim.EditVM(s.VMID, map[string]string{"cores": "1", "memory": "1024", "tags": "bootstrap-lab;mine", "nameserver": "9.9.9.9"}); err != nil {
		t.Fatal(err)
	}
	s.DiskGiB = 24
	vms, _ := e.c.ListVMs(ctx)
	p, err := e.c.PlanVM(ctx, s, vms)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]DriftKind{}
	for _, d := range p.Drift {
		kinds[d.Field] = d.Kind
	}
	for f, k := range map[string]DriftKind{"cores": DriftFix, "memory": DriftFix, "tags": DriftFix, "disk size": DriftFix, "nameservers": DriftReport} {
		if kinds[f] != k {
			t.Errorf("drift %s: %q, want %q (all: %+v)", f, kinds[f], k, p.Drift)
		}
	}
	if _, err := e.c.ApplyPlan(ctx, p); err != nil {
		t.Fatal(err)
	}
	vm, _ := e.sim.VM(s.VMID)
	// The VM runs, so CPU and memory wait for its restart; tags apply now.
	if vm.Pending["cores"] != "2" || vm.Pending["memory"] != "2048" || vm.Config["tags"] != "bootstrap-lab;controlplane;mine;talos" {
		t.Errorf("after fix: config %v pending %v", vm.Config, vm.Pending)
	}
	if !strings.Contains(vm.Config["scsi0"], "size=24G") || vm.Config["nameserver"] != "9.9.9.9" {
		t.Errorf("disk must grow and nameserver stay: %q %q", vm.Config["scsi0"], vm.Config["nameserver"])
	}
	// Running again changes nothing: pending values count as done.
	e.sim.ResetCounters()
	vms, _ = e.c.ListVMs(ctx)
	p, err = e.c.PlanVM(ctx, s, vms)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Update) != 0 || p.GrowDisk != 0 {
		t.Fatalf("second plan still wants %v grow %d", p.Update, p.GrowDisk)
	}
	if _, err := e.c.ApplyPlan(ctx, p); err != nil || e.sim.MutatingCalls() != 0 {
		t.Fatalf("second apply: %v, %v", err, e.sim.MutatingCallList())
	}
	pending := 0
	for _, d := range p.Drift {
		if d.Pending {
			pending++
		}
	}
	if pending != 2 {
		t.Errorf("cores and memory should show as pending: %+v", p.Drift)
	}
}

func TestUnsafeDriftRefused(t *testing.T) {
	e := newEnv(t, pvesim.Options{})
	ctx := ctxT(t)
	s := spec(1)
	e.provision(ctx, e.c, []VMSpec{s})
	s.DiskGiB = 10
	s.Bridge = "vmbr1"
	e.sim.ResetCounters()
	_, err := e.c.EnsureVM(ctx, s)
	var ue *UnsafeDriftError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "disk size: have 20G, want 10G") || !strings.Contains(err.Error(), "bridge: have vmbr0, want vmbr1") {
		t.Fatalf("want unsafe drift refused, got %v", err)
	}
	if n := e.sim.MutatingCalls(); n != 0 {
		t.Errorf("refusal made changes: %v", e.sim.MutatingCallList())
	}
}

func TestForeignVMIDAndNameRefused(t *testing.T) {
	e := newEnv(t, pvesim.Options{})
	ctx := ctxT(t)
	if err := e.sim.SeedVM(701, map[string]string{"name": "pihole", "tags": "dns", "scsi0": "local-lvm:8"}, true); err != nil {
		t.Fatal(err)
	}
	if err := e.sim.SeedVM(650, map[string]string{"name": "node-2", "scsi0": "local-lvm:8"}, false); err != nil {
		t.Fatal(err)
	}
	e.sim.ResetCounters()
	_, err := e.c.EnsureVM(ctx, spec(1))
	var fe *ForeignVMError
	if !errors.As(err, &fe) || fe.Other.VMID != 701 || !strings.Contains(err.Error(), `vmid 701 is used by VM "pihole"`) {
		t.Fatalf("foreign VMID: %v", err)
	}
	_, err = e.c.EnsureVM(ctx, spec(2))
	if !errors.As(err, &fe) || fe.Other.VMID != 650 || !strings.Contains(err.Error(), "name node-2 is used by VM 650") {
		t.Fatalf("foreign name: %v", err)
	}
	if n := e.sim.MutatingCalls(); n != 0 {
		t.Errorf("refusals made changes: %v", e.sim.MutatingCallList())
	}
	if vm, _ := e.sim.VM(701); vm.Status != "running" || vm.Config["name"] != "pihole" {
		t.Errorf("foreign VM touched: %+v", vm)
	}
}

var talosISO = []pvesim.ISOSpec{{Storage: "local", Name: "talos-nocloud-amd64.iso", Size: 100 << 20}}

func TestLockedVMAnd5xxRetriedToSuccess(t *testing.T) {
	e := newEnv(t, pvesim.Options{ISOs: talosISO})
	ctx := ctxT(t)
	s := spec(1)
	e.sim.InjectFault(pvesim.Fault{Kind: pvesim.FaultStatus, Method: "POST", Path: "/nodes/*/qemu", Status: 500, Message: "pvedaemon worker busy", Times: 2})
	e.sim.InjectFault(pvesim.Fault{Kind: pvesim.FaultStatus, Method: "GET", Path: "/cluster/resources", Status: 503, Message: "Service Unavailable", Times: 1})
	if _, err := e.c.EnsureVM(ctx, s); err != nil {
		t.Fatalf("ensure through 5xx: %v", err)
	}
	if got := e.sim.FaultsFired(); got != 3 {
		t.Errorf("faults fired %d, want 3", got)
	}
	// A backup holds the VM's lock for a while: start fails with "VM is
	// locked (backup)" until it is released, then succeeds.
	if err := e.sim.SetLock(s.VMID, "backup", 150*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Start(ctx, s.VMID); err != nil {
		t.Fatalf("start through lock: %v", err)
	}
	if e.sim.TaskCount("qmstart") < 2 {
		t.Errorf("start should have been retried, tasks: %d", e.sim.TaskCount("qmstart"))
	}
	if !strings.Contains(e.log.String(), "VM is locked (backup)") {
		t.Errorf("retries must be logged with the lock text")
	}
	if vm, _ := e.sim.VM(s.VMID); vm.Status != "running" {
		t.Errorf("VM %s", vm.Status)
	}
}

func TestFatalErrorsAreNotRetried(t *testing.T) {
	e := newEnv(t, pvesim.Options{ISOs: talosISO})
	ctx := ctxT(t)
	e.sim.InjectFault(pvesim.Fault{Kind: pvesim.FaultStatus, Method: "POST", Path: "/nodes/*/qemu", Status: 400, Message: "Parameter verification failed."})
	_, err := e.c.EnsureVM(ctx, spec(1))
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 400 || ae.Message != "Parameter verification failed." || retry.IsRetryable(err) {
		t.Fatalf("4xx: %v", err)
	}
	if n := e.sim.Count("POST", "/nodes/pve/qemu"); n != 1 {
		t.Errorf("4xx must not be retried: %d attempts", n)
	}
	bad := e.client(func(o *Options) { o.TokenSecret = "wrong" })
	_, err = bad.Version(ctx)
	if !IsUnauthorized(err) || !strings.Contains(err.Error(), "Authentication failed!") {
		t.Fatalf("401: %v", err)
	}
}

func TestKilledAfterCreateResumesAndConverges(t *testing.T) {
	e := newEnv(t, pvesim.Options{})
	ctx := ctxT(t)
	ss := specs(2)
	src := iso
	src.Checksum = isoSum()
	// First run: ISO and creates done, then the process dies before any start.
	if _, err := e.c.EnsureISO(ctx, src); err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		if _, err := e.c.EnsureVM(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range ss {
		if vm, _ := e.sim.VM(s.VMID); vm.Status != "stopped" {
			t.Fatalf("precondition: VM %d %s", s.VMID, vm.Status)
		}
	}
	// Second run, new process.
	res := e.provision(ctx, e.client(nil), ss)
	for _, r := range res {
		if r.Created || !r.Adopted {
			t.Errorf("resume result %+v", r)
		}
	}
	e.checkProvisioned(ss)
	if n := e.sim.TaskCount("qmcreate"); n != 2 {
		t.Errorf("creates: %d", n)
	}
}

func TestKilledDuringCreateResumesAndConverges(t *testing.T) {
	e := newEnv(t, pvesim.Options{Profile: pvesim.N100(), TimeScale: 0.1, ISOs: talosISO})
	s := spec(1)
	// The run dies 50ms into a 300ms create task; PVE finishes it anyway.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err := e.c.EnsureVM(ctx, s)
	cancel()
	if err == nil {
		t.Fatal("the interrupted run should have failed")
	}
	vm, ok := e.sim.VM(s.VMID)
	if !ok || vm.Config["lock"] != "create" {
		t.Fatalf("precondition: VM should be mid-create: %+v", vm)
	}
	ctx = ctxT(t)
	e.provision(ctx, e.client(nil), []VMSpec{s})
	e.checkProvisioned([]VMSpec{s})
	if n := e.sim.TaskCount("qmcreate"); n != 1 {
		t.Errorf("creates: %d", n)
	}
}

// timedStart seeds a stopped VM and returns how long c took to start it
// (the start task, polled to its end).
func timedStart(t *testing.T, ctx context.Context, e *env, c *Client) time.Duration {
	t.Helper()
	s := spec(1)
	if err := e.sim.SeedVM(s.VMID, map[string]string{"name": s.Name, "scsi0": "local-lvm:8", "memory": "1024"}, false); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	if err := c.Start(ctx, s.VMID); err != nil {
		t.Fatal(err)
	}
	return time.Since(begin)
}

func TestTaskCompletionNoticedQuickly(t *testing.T) {
	e := newEnv(t, pvesim.Options{Profile: pvesim.N100(), TimeScale: 0.2})
	ctx := ctxT(t)
	c := e.client(func(o *Options) { o.TaskPoll = 0 }) // the default poll
	took := timedStart(t, ctx, e, c)
	task := 300 * time.Millisecond // 1.5s start at scale 0.2
	if took < task || took > task+500*time.Millisecond {
		t.Fatalf("start took %s for a %s task: completion must be noticed within 0.5s", took, task)
	}
}

// A long task is polled ever less often, and its end is still noticed
// within an eighth of the time it took.
func TestLongTaskPolledWithBackoff(t *testing.T) {
	p := pvesim.Instant()
	p.Start = 2 * time.Second
	e := newEnv(t, pvesim.Options{Profile: p})
	ctx := ctxT(t)
	c := e.client(nil) // 20 ms first poll
	took := timedStart(t, ctx, e, c)
	polls := e.sim.Count("GET", "/nodes/pve/tasks/*/status")
	// Every 20 ms would be 100 polls; every eighth of the time waited
	// (every 20 ms for the first 160) is about 30.
	if polls > 40 || polls < 5 {
		t.Errorf("%d status polls for a 2 s task", polls)
	}
	if took > p.Start*9/8+100*time.Millisecond {
		t.Errorf("a 2 s task's end noticed after %s", took)
	}
}

func TestTLSVerification(t *testing.T) {
	e := newEnv(t, pvesim.Options{})
	ctx := ctxT(t)
	other, _ := pvesim.New(pvesim.Options{})
	defer other.Close()

	_, err := e.client(func(o *Options) { o.Fingerprint = other.Fingerprint() }).Version(ctx)
	var pe *PinError
	if !errors.As(err, &pe) || pe.Got != e.sim.Fingerprint() || retry.IsRetryable(err) {
		t.Fatalf("wrong pin: %v", err)
	}
	_, err = e.client(func(o *Options) { o.Fingerprint = "" }).Version(ctx)
	var ue *UnknownAuthorityError
	if !errors.As(err, &ue) || ue.Fingerprint != e.sim.Fingerprint() {
		t.Fatalf("unverified certificate must fail and name its fingerprint: %v", err)
	}
	caFile := filepath.Join(t.TempDir(), "pve-root-ca.pem")
	if err := os.WriteFile(caFile, e.sim.CACertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client(func(o *Options) { o.Fingerprint, o.CAFile = "", caFile }).Version(ctx); err != nil {
		t.Fatalf("CA file: %v", err)
	}
	id, secret := e.sim.Token()
	if _, err := New(ctx, Options{URL: e.sim.URL(), Node: "pve", TokenID: id, TokenSecret: secret, CAFile: filepath.Join(t.TempDir(), "x.pem")}); err == nil {
		t.Fatal("missing CA file must fail")
	}
	e.log.Reset()
	if _, err := e.client(func(o *Options) { o.Fingerprint, o.Insecure = "", true }).Version(ctx); err != nil {
		t.Fatalf("insecure: %v", err)
	}
	if !strings.Contains(e.log.String(), "TLS verification is DISABLED") || !strings.Contains(e.log.String(), `"level":"warn"`) {
		t.Errorf("insecure must warn loudly: %s", e.log.String())
	}
	if _, err := New(ctx, Options{URL: e.sim.URL(), Node: "pve", TokenID: id, TokenSecret: secret, Fingerprint: "12:34"}); err == nil {
		t.Fatal("a short fingerprint must be rejected")
	}
}

func TestDestroyOnlyTouchesClusterVMs(t *testing.T) {
	e := newEnv(t, pvesim.Options{})
	ctx := ctxT(t)
	e.provision(ctx, e.c, specs(2))
	if err := e.sim.SeedVM(650, map[string]string{"name": "pihole", "scsi0": "local-lvm:8"}, true); err != nil {
		t.Fatal(err)
	}
	if err := e.c.DestroyClusterVM(ctx, "lab", VMSummary{VMID: 650}); err == nil || !strings.Contains(err.Error(), "no tag bootstrap-lab") {
		t.Fatalf("foreign destroy: %v", err)
	}
	vms, err := e.c.FindClusterVMs(ctx, "lab")
	if err != nil || len(vms) != 2 {
		t.Fatalf("cluster VMs %v %v", vms, err)
	}
	for _, v := range vms {
		if err := e.c.DestroyClusterVM(ctx, "lab", v); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.sim.VMIDs(); len(got) != 1 || got[0] != 650 {
		t.Fatalf("left: %v", got)
	}
	if err := e.c.DestroyClusterVM(ctx, "lab", VMSummary{VMID: 701}); err != nil {
		t.Fatalf("destroying a gone VM: %v", err)
	}
}

func TestDeriveMAC(t *testing.T) {
	a, b := DeriveMAC("lab", "cp-1"), DeriveMAC("lab", "cp-2")
	if a == b || a != DeriveMAC("lab", "cp-1") {
		t.Fatalf("MACs %s %s", a, b)
	}
	m, err := normalizeMAC(a)
	if err != nil || m != a {
		t.Fatal(err)
	}
	var first byte
	fmt.Sscanf(a[:2], "%02X", &first)
	if first&0x02 == 0 || first&0x01 != 0 {
		t.Fatalf("%s is not locally administered unicast", a)
	}
}

func TestTicketLogin(t *testing.T) {
	e := newEnv(t, pvesim.Options{Users: []pvesim.User{{ID: "root@pam", Password: "hunter22"}}, ISOs: talosISO})
	ctx := ctxT(t)
	c := e.client(func(o *Options) { o.TokenID, o.TokenSecret, o.Username, o.Password = "", "", "root@pam", "hunter22" })
	if _, err := c.EnsureVM(ctx, spec(1)); err != nil {
		t.Fatalf("writes with a ticket (CSRF token): %v", err)
	}
	id, secret := e.sim.Token()
	_, err := New(ctx, Options{URL: e.sim.URL(), Node: "pve", Username: "root@pam", Password: "wrong", Fingerprint: e.sim.Fingerprint(),
		Retry: retry.Policy{Attempts: 2, Initial: time.Millisecond}})
	if err == nil || !strings.Contains(err.Error(), "authentication failure") || strings.Contains(err.Error(), secret) || id == "" {
		t.Fatalf("bad password: %v", err)
	}
}
