package proxmox

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/lab/pvesim"
	"github.com/homelab/bootstrap/lab/qcow2"
)

const imageURL = "https://factory.example/image/abc/v1.13.3/nocloud-amd64.qcow2"

// image is the factory's nocloud disk image as the test serves it.
var image = ISOSource{Filename: "talos-v1.13.3-abc-nocloud-amd64.qcow2", URL: imageURL}

// importStorages are pvesim's default storages, local with 'import' too.
var importStorages = []pvesim.StorageSpec{
	{Name: "local", Type: "dir", Content: []string{"iso", "vztmpl", "backup", "import"}, TotalBytes: 94 << 30, Path: "/var/lib/vz"},
	{Name: "local-lvm", Type: "lvmthin", Content: []string{"images", "rootdir"}, TotalBytes: 348 << 30},
}

// bootEnv is a host of version with storages whose token holds privs on /.
func bootEnv(t *testing.T, version string, storages []pvesim.StorageSpec, privs []string) (*env, *Client) {
	t.Helper()
	acl := []pvesim.ACE{{Path: "/", Privileges: privs}}
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Version: version, Storages: storages,
		GuestAgent: func(int) bool { return true },
		RemoteFiles: map[string]pvesim.RemoteFile{isoURL: {Content: isoBytes},
			imageURL: {Content: append(qcow2.Header(1246<<20), isoBytes...)}},
		Users:  []pvesim.User{{ID: "bootstrap@pve", ACL: acl}},
		Tokens: []pvesim.Token{{ID: "bootstrap@pve!run", Secret: "s", ACL: acl}}})
	return e, e.client(func(o *Options) { o.TokenID, o.TokenSecret = "bootstrap@pve!run", "s" })
}

// auto takes the disk image only where the host's pve-storage downloads
// qcow2 images, a storage has the 'import' content type and the token
// may download and read there; otherwise the ISO, saying why. image
// refuses instead.
func TestBootChoiceFollowsTheHost(t *testing.T) {
	without := func(privs []string, p string) []string {
		return slices.DeleteFunc(slices.Clone(privs), func(q string) bool { return q == p })
	}
	for _, tc := range []struct {
		name, version, want string
		storages            []pvesim.StorageSpec
		drop                string
		mode                BootMode
		refused             bool
		reason              string
	}{
		{name: "8.2", version: "8.2.4", want: "auto", mode: BootISO, reason: "PVE 8.2.4 (pve-storage 8.2.3 on pve): no import content type"},
		{name: "8.2.10", version: "8.2.10", want: "auto", storages: importStorages, mode: BootISO, reason: "(pve-storage 8.2.8 on pve): imports .ova only"},
		{name: "8.3", version: "8.3.5", want: "auto", storages: importStorages, mode: BootISO, reason: "the ISO: PVE 8.3.5 (pve-storage 8.2.9 on pve): imports .ova only (disk images from pve-storage 8.3.6, PVE 8.4)"},
		{name: "8.3-image", version: "8.3.5", want: "image", storages: importStorages, mode: BootISO, refused: true, reason: "imports .ova only"},
		{name: "8.4-no-import", version: "8.4.21", want: "auto", mode: BootISO, reason: "the ISO: no storage has the import content type (of those this token sees on pve): enable it on local"},
		{name: "8.4-no-template", version: "8.4.21", want: "auto", storages: importStorages, drop: "Datastore.AllocateTemplate", mode: BootISO, reason: "the token lacks Datastore.AllocateTemplate on /storage/local"},
		{name: "8.4", version: "8.4.21", want: "auto", storages: importStorages, mode: BootImage, reason: "the disk image: Proxmox VE 8.4.21 imports talos-v1.13.3-abc-nocloud-amd64.qcow2 from local (to be downloaded): no install, no reboot"},
		{name: "9.1-image", version: "9.1.19", want: "image", storages: importStorages, mode: BootImage},
		{name: "iso", version: "9.1.19", want: "iso", storages: importStorages, mode: BootISO, reason: "proxmox.boot is iso"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			privs := RunnerPrivileges(testVersion(t, tc.version))
			if tc.drop != "" {
				privs = without(privs, tc.drop)
			}
			_, c := bootEnv(t, tc.version, tc.storages, privs)
			got, err := c.ChooseBoot(ctxT(t), BootInput{Want: tc.want, Image: image, ISOStorage: "local"}, []string{"pve"})
			var refused *BootRefusedError
			if tc.refused != errors.As(err, &refused) || (err != nil && !tc.refused) {
				t.Fatalf("err %v, refused %v", err, tc.refused)
			}
			if got.Mode != tc.mode || !strings.Contains(got.Reason, tc.reason) {
				t.Errorf("%s: %q, want %s: %q", got.Mode, got.Reason, tc.mode, tc.reason)
			}
			if tc.mode == BootImage && got.Image.Storage != "local" {
				t.Errorf("image storage %q", got.Image.Storage)
			}
		})
	}
}

// README's role is enough for the image path too: the precheck passes,
// the image downloads as content import, a VM's disk is imported from it
// and grown before the first start, and the VM has no ISO; the precheck
// of a converged cluster asks nothing more of it, nor judges the boot.
func TestRunnerRoleImportsTheImage(t *testing.T) {
	const version = "8.4.21"
	e, c := bootEnv(t, version, importStorages, RunnerPrivileges(testVersion(t, version)))
	ctx := ctxT(t)
	in := precheckInput(2)
	var told BootChoice
	in.Boot, in.Booted = BootInput{Want: "auto", Image: image, ISOStorage: "local"}, func(b BootChoice, _ error) { told = b }
	rs := runPrechecks(t, c, in)
	for name, r := range rs {
		if r.Status != check.Pass && !(name == "proxmox: ISO storage" && r.Status == check.Warn) {
			t.Errorf("%s: %s %s", name, r.Status, r.Reason)
		}
	}
	expect(t, rs, "proxmox: boot", check.Pass, "new VMs boot the disk image")
	expect(t, rs, "proxmox: ISO storage", check.Warn, "no ISO needed; the disk image talos-v1.13.3-abc-nocloud-amd64.qcow2 will be downloaded to local")
	if told.Mode != BootImage || told.Image.Storage != "local" {
		t.Fatalf("the boot row told %+v", told)
	}
	if err := c.FetchImage(ctx, told.Image); err != nil {
		t.Fatal(err)
	}
	ss := specs(2)
	for i := range ss {
		ss[i].Image = ImportVolID(told.Image.Storage, told.Image.Filename)
		if _, err := c.EnsureVM(ctx, ss[i]); err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx, ss[i].VMID); err != nil {
			t.Fatal(err)
		}
		vm, _ := e.sim.VM(ss[i].VMID)
		d := vm.Event.Disks
		if len(d) != 1 || d[0].SizeBytes != 20<<30 || d[0].ImportURL != imageURL || vm.Config["ide2"] != "" || vm.Config["boot"] != "order=scsi0" {
			t.Errorf("VM %d: disks %+v, ide2 %q, boot %q", ss[i].VMID, d, vm.Config["ide2"], vm.Config["boot"])
		}
	}
	// Adopted as they are: nothing to change, no ISO drift to report.
	vms, err := c.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		p, err := c.PlanVM(ctx, s, vms)
		if err != nil || len(p.Changes()) > 0 || len(p.Drift) > 0 {
			t.Errorf("VM %d replanned: %v %v %v", s.VMID, p.Changes(), p.Drift, err)
		}
	}
	// Nothing is created any more: no member is judged for the boot.
	if r := runPrechecks(t, c, in)["proxmox: boot"]; r.Status != check.Pass || !strings.Contains(r.Reason, "nothing: every VM exists") {
		t.Errorf("boot row once every VM exists: %s %s", r.Status, r.Reason)
	}
}

// Adoption and drift do not depend on how a VM got Talos: a VM created
// from the image is adopted by an ISO config with no ISO drift, one
// installed from the ISO by an image config as it is, and a VM whose
// create ended before its resize (a killed run) has its disk grown when it
// is adopted.
func TestAdoptionEitherBootMode(t *testing.T) {
	const version = "8.4.21"
	e, c := bootEnv(t, version, importStorages, RunnerPrivileges(testVersion(t, version)))
	ctx := ctxT(t)
	if err := c.FetchImage(ctx, ISOSource{Storage: "local", Filename: image.Filename, URL: image.URL}); err != nil {
		t.Fatal(err)
	}
	src := iso
	src.Checksum = isoSum()
	if _, err := c.EnsureISO(ctx, src); err != nil {
		t.Fatal(err)
	}
	ss := specs(3)
	vol := ImportVolID("local", image.Filename)
	ss[0].Image = vol // from the image
	// ss[1] from the ISO
	ss[2].Image = vol // from the image, its resize failing
	e.sim.InjectFault(pvesim.Fault{Kind: pvesim.FaultTaskError, Method: "PUT", Path: "/nodes/*/qemu/" + strconv.Itoa(ss[2].VMID) + "/resize", Message: "resize interrupted", Times: 1})
	for i, s := range ss {
		_, err := c.EnsureVM(ctx, s)
		if (err != nil) != (i == 2) {
			t.Fatalf("VM %d: %v", s.VMID, err)
		}
	}
	if vm, _ := e.sim.VM(ss[2].VMID); len(vm.Event.Disks) != 1 || vm.Event.Disks[0].SizeBytes != 1246<<20 {
		t.Fatalf("VM %d after a failed resize: disks %+v", ss[2].VMID, vm.Event.Disks)
	}
	vms, err := c.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The other mode's config: ISO for the image VM, image for the ISO VM.
	swapped := []VMSpec{ss[0], ss[1]}
	swapped[0].Image, swapped[1].Image = "", vol
	for _, s := range swapped {
		p, err := c.PlanVM(ctx, s, vms)
		if err != nil || p.Create || len(p.Changes()) > 0 || len(p.Drift) > 0 {
			t.Errorf("VM %d (image %q) planned: create %v, %v, drift %v, %v", s.VMID, s.Image, p.Create, p.Changes(), p.Drift, err)
		}
	}
	p, err := c.PlanVM(ctx, ss[2], vms)
	if err != nil || p.Create || p.GrowDisk != 20<<30 {
		t.Fatalf("VM %d not grown: %+v %v", ss[2].VMID, p, err)
	}
	if _, err := c.EnsureVM(ctx, ss[2]); err != nil {
		t.Fatal(err)
	}
	if vm, _ := e.sim.VM(ss[2].VMID); len(vm.Event.Disks) != 1 || vm.Event.Disks[0].SizeBytes != 20<<30 || vm.Event.Disks[0].ImportedFrom != vol {
		t.Errorf("VM %d adopted: disks %+v", ss[2].VMID, vm.Event.Disks)
	}
}
