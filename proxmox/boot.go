package proxmox

import (
	"context"
	"fmt"
	"net/url"
	"slices"

	"github.com/homelab/bootstrap/internal/retry"
)

// How a new VM gets Talos: the ISO (booted, then installed to the disk and
// rebooted) or the Image Factory's nocloud disk image, imported as the
// VM's disk, which boots an installed Talos at once. What Proxmox needs
// for the image, read from its sources:
//
//   - pve-storage 8.3.6 (commit 76f695f2, which pve-manager 8.4.0 depends
//     on) lets download-url store a .qcow2, .raw or .vmdk as content
//     'import', checked as an untrusted image and never decompressed
//     (src/PVE/API2/Storage/Status.pm download_url, src/PVE/Storage.pm
//     $UPLOAD_IMPORT_EXT_RE_1); 8.2.8 to 8.3.5 take .ova only (40df25d),
//     and file-based storages (dir, NFS, CIFS, …) take the 'import'
//     content type from 8.2.8 (d955a46, 974081c); before, only the ESXi
//     importer's storage had it (bf45353, a171036, 8.1.1).
//     The storage needs 'import' in its content types (an operator's
//     setting) and a path (a file-based storage).
//   - qemu-server 8.2.7 and later create a disk from an import volume with
//     `<storage>:0,import-from=<volid>` (commit 0d41c7f5; before, "has wrong
//     type 'import' - not an image"); the disk has the image's size until
//     PUT …/resize grows it (qemu-server 9.2.6 src/PVE/API2/Qemu.pm
//     create_disks, resize_vm).
//   - Privileges: what the ISO path needs on its storage (Datastore.Audit
//     or Datastore.AllocateSpace to read the volume, check_volume_access in
//     pve-storage 9.1.7 src/PVE/Storage.pm; Datastore.AllocateTemplate and
//     Sys.AccessNetwork, or Sys.Audit+Sys.Modify, to download it),
//     Datastore.AllocateSpace on the disk storage and VM.Config.Disk for the
//     resize, all already in the create's privileges.

// BootMode is how the run's new VMs get Talos.
type BootMode string

// The boot modes.
const (
	// BootISO boots the nocloud ISO and installs Talos to the disk.
	BootISO BootMode = "iso"
	// BootImage imports the factory's nocloud disk image as the disk.
	BootImage BootMode = "image"
	// BootNone is the choice of a run that creates no VM: no member needs
	// the ISO or the disk image, so none is judged or downloaded.
	BootNone BootMode = "none"
)

// The package versions that bring the image path (see above).
var (
	importContentSince = [3]int{8, 2, 8}
	imageImportSince   = [3]int{8, 3, 6}
	qemuImportSince    = [3]int{8, 2, 7}
)

// BootInput is what the config asks of the boot.
type BootInput struct {
	// Want is proxmox.boot: "auto", "image" or "iso".
	Want string
	// Image is the factory's disk image (its Storage is chosen here); an
	// empty URL means it is not known, and Unknown says why.
	Image   ISOSource
	Unknown string
	// ISOStorage is proxmox.isoStorage: the storage the image goes to when
	// it has the 'import' content type too, and the one to suggest.
	ISOStorage string
}

// BootChoice is the boot mode a run takes for its new VMs, and why.
type BootChoice struct {
	Mode BootMode
	// Image is the disk image with its storage (Mode image).
	Image ISOSource
	// Missing lists the members the image must be downloaded to.
	Missing []string
	// Reason is the precheck row's text: which mode and why.
	Reason string
}

// BootRefusedError is proxmox.boot image on a host that cannot import the
// disk image: a run refuses instead of falling back to the ISO.
type BootRefusedError struct{ Reason string }

func (e *BootRefusedError) Error() string {
	return "proxmox.boot is image, but " + e.Reason + " (set proxmox.boot to auto or iso to install from the ISO)"
}

// ImportVolID is the volume ID of a file on a storage's import content.
func ImportVolID(storage, file string) string { return storage + ":import/" + file }

// fileBased says whether a storage type has a path download-url can write
// to (pve-storage's file-based plugins; others refuse "not a file based
// storage").
func fileBased(typ string) bool {
	switch typ {
	case "dir", "nfs", "cifs", "cephfs", "glusterfs", "btrfs":
		return true
	}
	return false
}

// bootReads are the reads a boot choice makes, so the precheck can share
// its cached ones.
type bootReads struct {
	version  func(ctx context.Context) (Version, error)
	storages func(ctx context.Context, member string) ([]Storage, error)
}

// CreatingMembers lists, in first-use order, the members where a placed
// spec's VM is to be created: its VMID is not listed, or PVE is still
// creating it (lock create). Only they import the disk image: create_vm
// is proxyto node and imports in create_disks → $import_from_volid on
// that member (qemu-server 9.2.6 src/PVE/API2/Qemu.pm); a member that
// only holds VMs that exist neither imports nor installs.
func CreatingMembers(specs []VMSpec, vms []VMSummary) []string {
	listed := map[int]VMSummary{}
	for _, v := range vms {
		listed[v.VMID] = v
	}
	var out []string
	for _, s := range specs {
		v, ok := listed[s.VMID]
		if (!ok || v.Lock == "create") && !slices.Contains(out, s.Node) {
			out = append(out, s.Node)
		}
	}
	return out
}

// ChooseBoot decides how VMs created on members get Talos: the disk image
// when proxmox.boot allows it and every member can import it, else the
// ISO with the reason; proxmox.boot image refuses with a
// *BootRefusedError instead.
func (c *Client) ChooseBoot(ctx context.Context, in BootInput, members []string) (BootChoice, error) {
	return c.chooseBoot(ctx, in, members, bootReads{
		version:  c.Version,
		storages: func(ctx context.Context, m string) ([]Storage, error) { return c.On(m).Storages(ctx) },
	})
}

func (c *Client) chooseBoot(ctx context.Context, in BootInput, members []string, r bootReads) (BootChoice, error) {
	if len(members) == 0 {
		return BootChoice{Mode: BootNone, Reason: "nothing: every VM exists, none is created"}, nil
	}
	if in.Want == "iso" {
		return BootChoice{Mode: BootISO, Reason: "the ISO: proxmox.boot is iso"}, nil
	}
	why, choice, err := c.imageBlocked(ctx, in, members, r)
	if err != nil {
		return BootChoice{}, err
	}
	if why == "" {
		return choice, nil
	}
	if in.Want == "image" {
		return BootChoice{Mode: BootISO, Reason: why}, &BootRefusedError{Reason: why}
	}
	// The row reads "new VMs boot the ISO: <why>": the choice first, then
	// its reason, as every other row of the precheck does.
	return BootChoice{Mode: BootISO, Reason: "the ISO: " + why}, nil
}

// imageBlocked says why the disk image cannot be used on every member
// ("" when it can, with the choice); err is a read that failed.
func (c *Client) imageBlocked(ctx context.Context, in BootInput, members []string, r bootReads) (string, BootChoice, error) {
	if in.Image.URL == "" {
		return in.Unknown, BootChoice{}, nil
	}
	v, err := r.version(ctx)
	if err != nil {
		return "", BootChoice{}, fmt.Errorf("reading the Proxmox VE version: %w", err)
	}
	img := in.Image
	var missing []string
	for _, m := range members {
		if why := c.importSupport(ctx, v, m); why != "" {
			return why, BootChoice{}, nil
		}
		sts, err := r.storages(ctx, m)
		if err != nil {
			return "", BootChoice{}, fmt.Errorf("listing the storages of %s: %w", m, err)
		}
		if img.Storage == "" {
			img.Storage = pickImportStorage(sts, in.ISOStorage)
			if img.Storage == "" {
				suggest := in.ISOStorage
				if suggest == "" {
					suggest = "local"
				}
				return fmt.Sprintf("no storage has the import content type (of those this token sees on %s): enable it on %s (Datacenter → Storage → %s → Edit → Content: Import) to skip the install", m, suggest, suggest), BootChoice{}, nil
			}
		} else if !slices.ContainsFunc(sts, func(s Storage) bool { return s.Name == img.Storage && importable(s) }) {
			return fmt.Sprintf("storage %s, which holds the disk image on %s, has no import content type on %s: enable it there too", img.Storage, members[0], m), BootChoice{}, nil
		}
		present, err := c.On(m).FindImage(ctx, img.Storage, img.Filename)
		if err != nil {
			return "", BootChoice{}, fmt.Errorf("looking for %s on %s: %w", img.Filename, m, err)
		}
		if !present {
			missing = append(missing, m)
		}
	}
	if lack, err := c.imageLacks(ctx, v, img.Storage, missing); err != nil {
		return "", BootChoice{}, err
	} else if lack != "" {
		return "the token lacks " + lack, BootChoice{}, nil
	}
	state := "present"
	if len(missing) > 0 {
		state = "to be downloaded"
	}
	return "", BootChoice{Mode: BootImage, Image: img, Missing: missing,
		Reason: fmt.Sprintf("the disk image: Proxmox VE %s imports %s from %s (%s): no install, no reboot", v, img.Filename, img.Storage, state)}, nil
}

// importSupport says why member m cannot download and import the disk
// image ("" when it can), from its installed pve-storage and qemu-server
// (GET …/apt/versions, Sys.Audit on the node, which every run needs); a
// package list it cannot read falls back to the pve-manager version:
// 8.3.6 and later depend on pve-storage 8.3.6 and qemu-server 8.3.11
// (pve-manager 4a148ae4 debian/control, in 8.3.6 c349e2ea and 8.4.0), and
// 8.2.9 and later on pve-storage 8.2.8 (4055b9d3, in 8.2.9 98c7f346).
func (c *Client) importSupport(ctx context.Context, v Version, m string) string {
	pkgs, err := c.On(m).InstalledPackages(ctx, "libpve-storage-perl", "qemu-server")
	st, haveSt := pkgs["libpve-storage-perl"]
	qs, haveQs := pkgs["qemu-server"]
	if err != nil || !haveSt {
		switch {
		case v.AtLeastPatch(8, 3, 6):
			return ""
		case v.AtLeastPatch(8, 2, 9):
			return fmt.Sprintf("PVE %s: imports .ova only (disk images from PVE 8.4)", v)
		}
		return fmt.Sprintf("PVE %s: no import content type (disk images from PVE 8.4)", v)
	}
	at := func(x Version, min [3]int) bool { return x.AtLeastPatch(min[0], min[1], min[2]) }
	switch {
	case !at(st, importContentSince):
		return fmt.Sprintf("PVE %s (pve-storage %s on %s): no import content type (disk images from pve-storage 8.3.6, PVE 8.4)", v, st, m)
	case !at(st, imageImportSince):
		return fmt.Sprintf("PVE %s (pve-storage %s on %s): imports .ova only (disk images from pve-storage 8.3.6, PVE 8.4)", v, st, m)
	case haveQs && !at(qs, qemuImportSince):
		return fmt.Sprintf("qemu-server %s on %s creates no disk from an import volume (qemu-server 8.2.7 does)", qs, m)
	}
	return ""
}

// importable says whether a storage can hold the disk image.
func importable(s Storage) bool {
	return s.Enabled && s.Active && s.HasContent("import") && fileBased(s.Type)
}

// pickImportStorage is the storage for the disk image: prefer, when it
// can hold it, else the first by name that can ("" for none).
func pickImportStorage(sts []Storage, prefer string) string {
	first := ""
	for _, s := range sts {
		if !importable(s) {
			continue
		}
		if s.Name == prefer {
			return s.Name
		}
		if first == "" {
			first = s.Name
		}
	}
	return first
}

// imageLacks names the privileges the token lacks to read the disk image
// on storage and, for the members in download, to download it there ("" when
// it has them).
func (c *Client) imageLacks(ctx context.Context, v Version, storage string, download []string) (string, error) {
	// import-from's check_volume_access also lets Datastore.Allocate alone
	// through, but finding the image lists the storage's content, which
	// asks Datastore.Audit or Datastore.AllocateSpace (pve-storage 9.1.7
	// src/PVE/API2/Storage/Content.pm index): that is the need.
	needs := []Need{anyOf("read the disk image on "+storage, "/storage/"+storage, "Datastore.Audit", "Datastore.AllocateSpace")}
	if len(download) > 0 {
		needs = append(needs, downloadNeeds(v, storage, download)...)
	}
	held, err := c.Permissions(ctx, Paths(needs))
	if err != nil {
		return "", fmt.Errorf("reading the token's permissions: %w", err)
	}
	if miss := Missing(needs, held); len(miss) > 0 {
		return describeMissing(miss) + " (to download and import the disk image)", nil
	}
	return "", nil
}

// downloadNeeds are download-url's privileges for a file on storage, run
// on each of members (pve-storage 9.1.7 src/PVE/API2/Storage/Status.pm:
// Datastore.AllocateTemplate on the storage, and Sys.Audit+Sys.Modify on /
// or Sys.AccessNetwork on the node, a privilege pve-access-control only
// has since 8.1.2, shipped with PVE 8.2).
func downloadNeeds(v Version, storage string, members []string) []Need {
	needs := []Need{allOf("download to "+storage, "/storage/"+storage, "Datastore.AllocateTemplate")}
	web := Need{Why: "download from a URL", Options: []Grant{{Path: "/", Privs: []string{"Sys.Audit", "Sys.Modify"}}}}
	for _, m := range members {
		web := web
		if v.AtLeast(8, 2) {
			web.Options = append(slices.Clip(web.Options), Grant{Path: "/nodes/" + m, Privs: []string{"Sys.AccessNetwork"}})
		}
		needs = append(needs, web)
	}
	return needs
}

// FindImage reports whether file is on storage's import content (GET
// …/storage/{storage}/content?content=import).
func (c *Client) FindImage(ctx context.Context, storage, file string) (bool, error) {
	want := ImportVolID(storage, file)
	found := false
	path := "/nodes/" + c.node + "/storage/" + url.PathEscape(storage) + "/content?content=import"
	err := retry.Do(ctx, c.opts.Retry, c.log, "list disk images on "+storage, func(ctx context.Context) error {
		list, err := c.getList(ctx, path)
		if err != nil {
			return err
		}
		found = slices.ContainsFunc(list, func(e map[string]any) bool { return str(e["volid"]) == want })
		return nil
	})
	return found, err
}
