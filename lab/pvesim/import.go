package pvesim

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/homelab/bootstrap/lab/qcow2"
)

// Guest images in the 'import' content type, as pve-storage and
// qemu-server handle them:
//
//   - File-based storages (dir, NFS, CIFS, CephFS, GlusterFS, BTRFS) take
//     the content type from pve-storage 8.2.8 (d955a46 "plugin: dir:
//     implement import content type", 974081c); before, only the ESXi
//     importer's storage had it (bf45353, 8.1.1), and block storages (LVM,
//     LVM-thin, ZFS, RBD, iSCSI) never do (their plugins' content lists at
//     9.1.7, 0c56bad). download-url takes content=import
//     from then on, for .ova files only (40df25d, $UPLOAD_IMPORT_EXT_RE_1
//     = .ova), and for .ova, .qcow2, .raw and .vmdk from 8.3.6 (76f695f2
//     "import: allow upload of guest images files into import storage").
//     The file goes to <storage path>/import/<normalized name>.
//   - A downloaded image is checked as untrusted before it is kept:
//     file_size_info($tmp, 10, $format, 1) runs `qemu-img info -f <format>`
//     and dies on a file that is not of that format, a backing file, a
//     qcow2 external data file, a vmdk of several extents (pve-storage 9.1.7
//     src/PVE/Storage/Plugin.pm file_size_info, src/PVE/Storage/Common.pm
//     run_qemu_img_json; download_file_from_url's assert_file_validity in
//     pve-common 9.2.1 src/PVE/Tools.pm wraps it "failed to verify file: ").
//     Decompression is for ISOs only: "decompression not supported for
//     import" (src/PVE/API2/Storage/Status.pm download_url, 9.1.7).
//   - A VM disk is created from it with `<storage>:0,import-from=<volid>`
//     (qemu-server 9.2.6 src/PVE/API2/Qemu.pm $check_drive_param: the size
//     must be 0, "'import-from' requires special syntax - use <storage
//     ID>:0,import-from=<source>"). $check_storage_access asks
//     Datastore.AllocateSpace on the target storage and check_volume_access
//     on the source: an import volume needs Datastore.Allocate, or
//     Datastore.AllocateSpace or Datastore.Audit, on its storage
//     (pve-storage 9.1.7 src/PVE/Storage.pm check_volume_access). The
//     create task checks the file as untrusted again, then clones it with
//     qemu-img to a new volume of the image's virtual size
//     ($import_from_volid, clone_disk). Only qemu-server 8.2.7 and later
//     take a source of type import (0d41c7f5); before, "<src> has wrong type
//     'import' - not an image".

// importContentSince is the first pve-storage whose file-based storages
// take the 'import' content type (d955a46, 974081c, in 8.2.8).
var importContentSince = [3]int{8, 2, 8}

// imageImportSince is the first pve-storage whose download-url imports
// qcow2, raw and vmdk images (76f695f2, in 8.3.6).
var imageImportSince = [3]int{8, 3, 6}

// qemuImportSince is the first qemu-server whose import-from takes a
// volume of type import (0d41c7f5, in 8.2.7).
var qemuImportSince = [3]int{8, 2, 7}

func atLeast(v string, min [3]int) bool { return versionAtLeast(v, min[0], min[1], min[2]) }

// hasImportContent says whether the simulated pve-storage knows the
// 'import' content type.
func (s *Server) hasImportContent() bool { return atLeast(s.opts.PVEStorage, importContentSince) }

// importExtension is the format download-url stores a content=import file
// as ("ova", "qcow2", "raw", "vmdk"), or "" for a name it refuses: SAFE
// characters then $UPLOAD_IMPORT_EXT_RE_1 at the end (src/PVE/Storage.pm).
func (s *Server) importExtension(filename string) string {
	re := uploadImportOVA
	if atLeast(s.opts.PVEStorage, imageImportSince) {
		re = uploadImportImages
	}
	m := re.FindStringSubmatch(filename)
	if m == nil {
		return ""
	}
	return m[1]
}

var (
	uploadImportOVA    = regexp.MustCompile(`[a-zA-Z0-9\-.+=_]+\.(ova)$`)
	uploadImportImages = regexp.MustCompile(`[a-zA-Z0-9\-.+=_]+\.(ova|qcow2|raw|vmdk)$`)
)

// importStorageTypes are the storage types whose plugin lists 'import' in
// its content types (pve-storage 9.1.7: DirPlugin, NFSPlugin, CIFSPlugin,
// CephFSPlugin, BTRFSPlugin; GlusterFSPlugin until its removal, 7669a99).
var importStorageTypes = map[string]bool{"dir": true, "nfs": true, "cifs": true, "cephfs": true, "glusterfs": true, "btrfs": true}

// checkStorageSpecs refuses storages the simulated pve-storage cannot have.
func (s *Server) checkStorageSpecs() error {
	for _, st := range s.opts.Storages {
		for _, c := range st.Content {
			if c != "import" {
				continue
			}
			if !importStorageTypes[st.Type] {
				return fmt.Errorf("storage %s: type %s does not support content type 'import' (file-based storages do)", st.Name, st.Type)
			}
			if !s.hasImportContent() {
				return fmt.Errorf("storage %s: file-based storages take the content type 'import' from pve-storage 8.2.8 (this host runs %s)", st.Name, s.opts.PVEStorage)
			}
		}
	}
	return nil
}

// untrustedImage is file_size_info($file, 10, $format, 1) on a file whose
// first bytes are head and whose size is size: the image's virtual size,
// or the error qemu-img or the check raises. Only qcow2 and raw are
// simulated. The qemu-img error texts are QEMU's (block/qcow2.c), not read
// here: unverified.
func untrustedImage(path, format string, head []byte, size int64) (int64, error) {
	switch format {
	case "raw":
		// Any bytes are a raw image of their own size.
		return size, nil
	case "qcow2":
		info, ok := qcow2.Parse(head)
		switch {
		case !ok:
			return 0, fmt.Errorf("qemu-img: Could not open '%s': Image is not in qcow2 format", path)
		case info.DataFile:
			return 0, fmt.Errorf("%s: 'data-file' references are not allowed!", path)
		case info.Backing:
			return 0, fmt.Errorf("backing file not allowed for untrusted image '%s'!", path)
		}
		return info.Virtual, nil
	}
	return 0, fmt.Errorf("pvesim simulates qcow2 and raw images only, not %s", format)
}

// volumeType is parse_volname's vtype of a volume name on a file-based
// storage (pve-storage 9.1.7 src/PVE/Storage/Plugin.pm parse_volname):
// import/…, iso/…, or a VM's image with its owner.
func volumeType(volname string) (vtype string, owner int) {
	switch {
	case strings.HasPrefix(volname, "import/"):
		return "import", 0
	case strings.HasPrefix(volname, "iso/"):
		return "iso", 0
	case strings.HasPrefix(volname, "vztmpl/"):
		return "vztmpl", 0
	}
	base := volname[strings.LastIndex(volname, "/")+1:]
	if m := ownerRE.FindStringSubmatch(base); m != nil {
		owner, _ = strconv.Atoi(m[1])
	}
	return "images", owner
}

var ownerRE = regexp.MustCompile(`^(?:vm|base)-(\d+)-`)

// importFromPerms is $check_storage_access for a drive's import-from
// source (qemu-server 9.2.6 src/PVE/API2/Qemu.pm), on the create path.
func (s *Server) importFromPerms(who *identity, key, src string) *apiError {
	if strings.HasPrefix(src, "/") {
		if who.name() != "root@pam" {
			return errf(500, "Only root can pass arbitrary filesystem paths.")
		}
		return nil
	}
	stName, volname, ok := strings.Cut(src, ":")
	if !ok {
		return paramErr(map[string]string{key: "unable to parse volume ID '" + src + "'"})
	}
	s.mu.Lock()
	st := s.storageByName(stName)
	s.mu.Unlock()
	if st == nil {
		return errf(500, "storage '%s' does not exist", stName)
	}
	vtype, owner := volumeType(volname)
	switch {
	case !atLeast(s.opts.QemuServer, qemuImportSince) && vtype != "images":
		return paramErr(map[string]string{key: fmt.Sprintf("%s has wrong type '%s' - not an image", src, vtype)})
	case vtype != "images" && vtype != "import":
		return paramErr(map[string]string{key: fmt.Sprintf("%s has wrong type '%s' - needs to be 'images' or 'import'", src, vtype)})
	case owner != 0:
		// Might be in use by its VM: copied through clone_disk.
		return who.check("/vms/"+strconv.Itoa(owner), "VM.Clone")
	}
	// check_volume_access: Datastore.Allocate passes everything; an import
	// volume needs read access to its storage.
	sp := "/storage/" + stName
	if who.has(sp, "Datastore.Allocate") {
		return nil
	}
	if vtype == "import" {
		return who.checkAny(sp, "Datastore.AllocateSpace", "Datastore.Audit")
	}
	return errf(500, "missing privileges to access %s", src)
}

// importSource looks up an import-from source for the create task: its
// virtual size after the untrusted check of an import volume; s.mu must be
// held.
func (s *Server) importSourceLocked(src string) (*volume, int64, error) {
	st, vol := s.volumeLocked(src)
	if vol == nil {
		path := src
		if st != nil {
			_, name, _ := strings.Cut(src, ":")
			path = st.spec.Path + "/" + name
		}
		return nil, 0, fmt.Errorf("failed to stat '%s'", path)
	}
	if vol.content != "import" {
		return vol, vol.size, nil
	}
	virtual, err := untrustedImage(st.spec.Path+"/"+vol.name, vol.format, vol.head, vol.size)
	return vol, virtual, err
}

// headOf is up to the first 4 KiB of data.
func headOf(data []byte) []byte {
	return bytes.Clone(data[:min(len(data), headBytes)])
}

// headBytes is how much of a downloaded file pvesim keeps to check it.
const headBytes = 4096

// headWriter keeps the first headBytes written to it.
type headWriter struct{ buf []byte }

func (w *headWriter) Write(p []byte) (int, error) {
	if room := headBytes - len(w.buf); room > 0 {
		w.buf = append(w.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

// Volumes lists the volume IDs of a content type on a storage ("import",
// "images", "iso"), sorted: what a test checks is left behind.
func (s *Server) Volumes(storage, content string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.storageByName(storage)
	if st == nil {
		return nil
	}
	var out []string
	for name, v := range st.vols {
		if v.content == content {
			out = append(out, storage+":"+name)
		}
	}
	slices.Sort(out)
	return out
}
