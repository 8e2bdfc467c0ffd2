package pvesim

import (
	"context"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

const (
	kib = int64(1024)
	mib = 1024 * kib
	gib = 1024 * mib
	tib = 1024 * gib
)

type storage struct {
	spec StorageSpec
	used int64
	vols map[string]*volume
}

type volume struct {
	name    string // volname, e.g. "iso/talos.iso" or "vm-100-disk-0"
	content string // "iso", "images"
	format  string
	size    int64
	// alloc is what the volume takes from the storage's free space: its
	// size on thick storage and for ISOs, nothing on thin storage until
	// the guest writes (see storage.thin).
	alloc  int64
	vmid   int
	ctime  time.Time
	data   []byte
	sha256 string
	// head is the file's first bytes (an import's image check reads
	// them); url where download-url fetched it from.
	head []byte
	url  string
	// importedFrom is the volume a disk was imported from (import-from at
	// create), importURL that volume's url.
	importedFrom, importURL string
}

func newStorage(spec StorageSpec) *storage {
	if spec.Path == "" && fileBased(spec.Type) {
		spec.Path = "/mnt/pve/" + spec.Name
		if spec.Name == "local" {
			spec.Path = "/var/lib/vz"
		}
	}
	return &storage{spec: spec, used: spec.UsedBytes, vols: map[string]*volume{}}
}

func fileBased(typ string) bool {
	switch typ {
	case "dir", "nfs", "cifs", "cephfs", "glusterfs", "btrfs":
		return true
	}
	return false
}

// thin says whether a new disk image takes nothing from the storage's
// free space until it is written: an LVM thin volume (pve-storage 9.1.7
// src/PVE/Storage/LvmThinPlugin.pm: status reports the pool's data
// allocation, list_images each volume's virtual lv_size), a zvol created
// with -s on a 'sparse' zfspool (ZFSPoolPlugin.pm zfs_create_zvol; without
// it the zvol's refreservation takes its whole size at once), and an
// image file on a file-based storage (Plugin.pm preallocation_cmd_opt:
// qcow2 'metadata', raw 'off' unless the storage sets preallocation).
// The few MiB of qcow2 metadata are left out.
func (st *storage) thin() bool {
	switch {
	case st.spec.Type == "lvmthin", st.spec.Type == "rbd", fileBased(st.spec.Type):
		// RBD images are created with "rbd create --size", which
		// allocates nothing (pve-storage 9.1.7 src/PVE/Storage/RBDPlugin.pm
		// alloc_image).
		return true
	case st.spec.Type == "zfspool", st.spec.Type == "zfs":
		// ZFS over iSCSI (ZFSPlugin.pm) creates its zvols through
		// ZFSPoolPlugin's zfs_create_zvol: thin only with 'sparse' (-s).
		return st.spec.Sparse
	}
	return false
}

func (st *storage) hasContent(c string) bool {
	for _, x := range st.spec.Content {
		if x == c {
			return true
		}
	}
	return false
}

func (st *storage) avail() int64 {
	if a := st.spec.TotalBytes - st.used; a > 0 {
		return a
	}
	return 0
}

func (s *Server) storageByName(name string) *storage {
	for _, st := range s.storages {
		if st.spec.Name == name {
			return st
		}
	}
	return nil
}

// allocLocked allocates a disk image like vdisk_alloc; s.mu must be held.
func (s *Server) allocLocked(stName string, vmid int, name string, size int64, format string) (string, error) {
	st := s.storageByName(stName)
	if st == nil {
		return "", fmt.Errorf("storage '%s' does not exist", stName)
	}
	if st.spec.Disabled {
		return "", fmt.Errorf("storage '%s' is disabled", stName)
	}
	if !st.hasContent("images") {
		return "", fmt.Errorf("storage '%s' does not support vm images", stName)
	}
	file := fileBased(st.spec.Type)
	if format == "" {
		format = "raw"
		if file {
			format = "qcow2"
		}
	}
	if name == "" {
		for i := 0; ; i++ {
			cand := fmt.Sprintf("vm-%d-disk-%d", vmid, i)
			if file {
				cand = fmt.Sprintf("%d/%s.%s", vmid, cand, format)
			}
			if st.vols[cand] == nil {
				name = cand
				break
			}
		}
	} else if file {
		name = fmt.Sprintf("%d/%s", vmid, name)
	}
	if st.vols[name] != nil {
		return "", fmt.Errorf("volume '%s:%s' already exists", stName, name)
	}
	// Thin volumes are created past the free space, even past the pool's
	// size (LVM only warns that the sum of thin volume sizes exceeds the
	// pool; unverified for the exact text, which PVE does not pass on).
	alloc := size
	if st.thin() {
		alloc = 0
	}
	if alloc > st.avail() {
		base := name[strings.LastIndex(name, "/")+1:]
		switch st.spec.Type {
		case "lvm", "lvmthin":
			const extent = 4 * mib
			return "", fmt.Errorf("lvcreate 'pve/%s' error:   Volume group \"pve\" has insufficient free space (%d extents): %d required.", base, st.avail()/extent, (size+extent-1)/extent)
		case "zfspool":
			return "", fmt.Errorf("zfs error: cannot create 'rpool/data/%s': out of space", base)
		default:
			return "", fmt.Errorf("unable to create image: qemu-img: %s/images/%s: Could not preallocate data for the new file: No space left on device", st.spec.Path, name)
		}
	}
	st.used += alloc
	st.vols[name] = &volume{name: name, content: "images", format: format, size: size, alloc: alloc, vmid: vmid, ctime: time.Now()}
	return stName + ":" + name, nil
}

// freeLocked releases a volume; s.mu must be held.
func (s *Server) freeLocked(volid string) {
	stName, name, ok := strings.Cut(volid, ":")
	if !ok {
		return
	}
	st := s.storageByName(stName)
	if st == nil {
		return
	}
	if v := st.vols[name]; v != nil {
		st.used -= v.alloc
		delete(st.vols, name)
	}
}

// volumeLocked finds a volume by volid; s.mu must be held.
func (s *Server) volumeLocked(volid string) (*storage, *volume) {
	stName, name, ok := strings.Cut(volid, ":")
	if !ok {
		return nil, nil
	}
	st := s.storageByName(stName)
	if st == nil {
		return nil, nil
	}
	return st, st.vols[name]
}

func (s *Server) listStorage(r *request) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	want := r.param("content")
	only := r.param("storage")
	enabledOnly := r.param("enabled") == "1"
	out := []any{}
	for _, st := range s.storages {
		if only != "" && st.spec.Name != only {
			continue
		}
		if !r.who.has("/storage/"+st.spec.Name, "Datastore.Audit") && !r.who.has("/storage/"+st.spec.Name, "Datastore.AllocateSpace") {
			continue
		}
		if want != "" {
			match := false
			for _, c := range strings.Split(want, ",") {
				if st.hasContent(c) {
					match = true
				}
			}
			// With a content filter storage_info drops disabled storages
			// too (pve-storage 9.1.7 src/PVE/Storage.pm: "next if
			// !$want_ctype || !$storage_enabled").
			if !match || st.spec.Disabled {
				continue
			}
		}
		if enabledOnly && st.spec.Disabled {
			continue
		}
		out = append(out, s.storageEntryLocked(st, true))
	}
	return out
}

func (s *Server) storageEntryLocked(st *storage, withName bool) map[string]any {
	content := append([]string(nil), st.spec.Content...)
	sort.Strings(content)
	e := map[string]any{
		"type":    st.spec.Type,
		"content": strings.Join(content, ","),
		"shared":  boolInt(st.spec.Shared),
		"enabled": boolInt(!st.spec.Disabled),
		"active":  boolInt(!st.spec.Disabled && !st.spec.Offline),
	}
	if withName {
		e["storage"] = st.spec.Name
	}
	if !st.spec.Disabled && !st.spec.Offline {
		e["total"] = st.spec.TotalBytes
		e["used"] = st.used
		e["avail"] = st.avail()
		if st.spec.TotalBytes > 0 {
			e["used_fraction"] = float64(st.used) / float64(st.spec.TotalBytes)
		}
	}
	return e
}

// readStorage answers a read of storage name once the caller's permission
// check (denied) passed: fn's answer under s.mu, or "storage '<id>' does
// not exist" (pve-storage 9.1.7 src/PVE/Storage.pm storage_config).
func (s *Server) readStorage(denied *apiError, name string, fn func(st *storage) any) (any, *apiError) {
	if denied != nil {
		return nil, denied
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.storageByName(name)
	if st == nil {
		return nil, errf(500, "storage '%s' does not exist", name)
	}
	return fn(st), nil
}

func (s *Server) storageStatus(r *request, name string) (any, *apiError) {
	return s.readStorage(r.who.checkAny("/storage/"+name, "Datastore.Audit", "Datastore.AllocateSpace"), name, func(st *storage) any {
		return s.storageEntryLocked(st, false)
	})
}

// storageConfig answers GET /storage/{storage} (pve-storage 9.1.7
// src/PVE/API2/Storage/Config.pm read): Datastore.Allocate on
// /storage/<id>, and the storage.cfg section: its type, content joined,
// the flags that are set (shared, sparse, disable) and a digest. Only
// what pvesim models is given.
func (s *Server) storageConfig(r *request, name string) (any, *apiError) {
	return s.readStorage(r.who.check("/storage/"+name, "Datastore.Allocate"), name, storageConfigOf)
}

// storageConfigOf is a storage's storage.cfg section as the read gives it.
func storageConfigOf(st *storage) any {
	name := st.spec.Name
	out := map[string]any{"storage": name, "type": st.spec.Type, "content": strings.Join(st.spec.Content, ","),
		"digest": "0000000000000000000000000000000000000000"}
	if st.spec.Path != "" {
		out["path"] = st.spec.Path
	}
	if st.spec.Shared {
		out["shared"] = 1
	}
	if st.spec.Sparse {
		out["sparse"] = 1
	}
	if st.spec.Disabled {
		out["disable"] = 1
	}
	return out
}

func (s *Server) storageContent(r *request, name string) (any, *apiError) {
	if err := r.who.checkAny("/storage/"+name, "Datastore.Audit", "Datastore.AllocateSpace"); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.storageByName(name)
	if st == nil {
		return nil, errf(500, "storage '%s' does not exist", name)
	}
	if st.spec.Disabled {
		return nil, errf(500, "storage '%s' is disabled", name)
	}
	want := r.param("content")
	vmidFilter := r.param("vmid")
	names := make([]string, 0, len(st.vols))
	for n := range st.vols {
		names = append(names, n)
	}
	sort.Strings(names)
	out := []any{}
	for _, n := range names {
		v := st.vols[n]
		if want != "" && v.content != want {
			continue
		}
		if vmidFilter != "" && strconv.Itoa(v.vmid) != vmidFilter {
			continue
		}
		if !volumeVisible(r.who, name, v) {
			continue
		}
		e := map[string]any{
			"volid":   name + ":" + v.name,
			"content": v.content,
			"format":  v.format,
			"size":    v.size,
			"ctime":   v.ctime.Unix(),
		}
		if v.vmid != 0 {
			e["vmid"] = v.vmid
		}
		out = append(out, e)
	}
	return out, nil
}

// volumeVisible is check_volume_access as the content index applies it,
// skipping each volume it refuses (pve-storage 9.1.7 src/PVE/Storage.pm
// check_volume_access, src/PVE/API2/Storage/Content.pm index: "next if
// $@", with no VM of the caller's own): Datastore.Allocate on the storage
// shows everything; ISOs and templates need Datastore.AllocateSpace or
// Datastore.Audit; a backup Datastore.AllocateSpace plus VM.Backup on its
// VM; a VM's image Datastore.Audit on the storage plus VM.Config.Disk on
// its VM; anything else is hidden.
func volumeVisible(who *identity, sid string, v *volume) bool {
	sp := "/storage/" + sid
	if who.has(sp, "Datastore.Allocate") {
		return true
	}
	vm := "/vms/" + strconv.Itoa(v.vmid)
	switch {
	case v.content == "iso" || v.content == "vztmpl" || v.content == "import":
		return who.has(sp, "Datastore.AllocateSpace") || who.has(sp, "Datastore.Audit")
	case v.content == "backup" && v.vmid != 0:
		return who.has(sp, "Datastore.AllocateSpace") && who.has(vm, "VM.Backup")
	case (v.content == "images" || v.content == "rootdir") && v.vmid != 0:
		return who.has(sp, "Datastore.Audit") && who.has(vm, "VM.Config.Disk")
	}
	return false
}

// AddISO puts an ISO on a storage, as if uploaded earlier.
func (s *Server) AddISO(iso ISOSpec) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.storageByName(iso.Storage)
	if st == nil {
		return fmt.Errorf("storage %q does not exist", iso.Storage)
	}
	size := iso.Size
	sum := ""
	if iso.Content != nil {
		size = int64(len(iso.Content))
		h := sha256.Sum256(iso.Content)
		sum = hex.EncodeToString(h[:])
	}
	if size > st.avail() {
		return fmt.Errorf("storage %q has no room for %s", iso.Storage, iso.Name)
	}
	name := "iso/" + iso.Name
	if old := st.vols[name]; old != nil {
		st.used -= old.size
	}
	st.used += size
	st.vols[name] = &volume{name: name, content: "iso", format: "iso", size: size, alloc: size, ctime: time.Now(), data: iso.Content, sha256: sum}
	return nil
}

// AddRemoteFile makes url downloadable by download-url.
func (s *Server) AddRemoteFile(url string, f RemoteFile) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.remote[url] = f
}

// SetStorageOffline takes an enabled storage offline or back (see
// StorageSpec.Offline).
func (s *Server) SetStorageOffline(name string, offline bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.storageByName(name)
	if st == nil {
		return fmt.Errorf("storage %q does not exist", name)
	}
	st.spec.Offline = offline
	return nil
}

// SetStorageUsed sets how many bytes of a storage are used by things other
// than the simulator's VMs and ISOs (e.g. to fill it up).
func (s *Server) SetStorageUsed(name string, used int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.storageByName(name)
	if st == nil {
		return fmt.Errorf("storage %q does not exist", name)
	}
	var vols int64
	for _, v := range st.vols {
		vols += v.alloc
	}
	st.spec.UsedBytes = used
	st.used = used + vols
	return nil
}

var isoExt = regexp.MustCompile(`(?i)[^/]+\.(iso|img)$`)

var checksumAlgorithms = map[string]func() hash.Hash{
	"md5": md5.New, "sha1": sha1.New, "sha224": sha256.New224, "sha256": sha256.New,
	"sha384": sha512.New384, "sha512": sha512.New,
}

func (s *Server) downloadURL(r *request, name string) (any, *apiError) {
	if err := r.who.check("/storage/"+name, "Datastore.AllocateTemplate"); err != nil {
		return nil, err
	}
	if !r.who.has("/", "Sys.Audit", "Sys.Modify") && !r.who.has("/nodes/"+s.node.Name, "Sys.AccessNetwork") {
		return nil, permErr("")
	}
	errs := map[string]string{}
	u, content, filename := r.param("url"), r.param("content"), r.param("filename")
	sum, algo := r.param("checksum"), r.param("checksum-algorithm")
	if u == "" {
		errs["url"] = "property is missing and it is not optional"
	} else if !regexp.MustCompile(`^https?://.*`).MatchString(u) {
		errs["url"] = fmt.Sprintf("value does not match the regex pattern")
	}
	if content == "" {
		errs["content"] = "property is missing and it is not optional"
	} else if content != "iso" && content != "vztmpl" && (content != "import" || !s.hasImportContent()) {
		enum := "iso, vztmpl"
		if s.hasImportContent() {
			enum += ", import"
		}
		errs["content"] = "value '" + content + "' does not have a value in the enumeration '" + enum + "'"
	}
	if filename == "" {
		errs["filename"] = "property is missing and it is not optional"
	}
	// The file is stored under the normalised name
	// (normalize_content_filename in pve-storage src/PVE/Storage.pm at
	// 9.1.7): the directory part and leading/trailing space dropped, every
	// character but [a-zA-Z0-9_.-] turned into '_'.
	filename = normalizeContentFilename(filename)
	if sum != "" && algo == "" {
		errs["checksum"] = "parameter 'checksum' requires parameter 'checksum-algorithm'"
	}
	if algo != "" && sum == "" {
		errs["checksum-algorithm"] = "parameter 'checksum-algorithm' requires parameter 'checksum'"
	}
	if algo != "" && checksumAlgorithms[algo] == nil {
		errs["checksum-algorithm"] = "value '" + algo + "' does not have a value in the enumeration 'md5, sha1, sha224, sha256, sha384, sha512'"
	}
	if c := r.param("compression"); c != "" && c != "gz" && c != "lzo" && c != "zst" && c != "bz2" {
		errs["compression"] = "value '" + c + "' does not have a value in the enumeration 'gz, lzo, zst, bz2'"
	}
	if len(errs) > 0 {
		return nil, paramErr(errs)
	}
	s.mu.Lock()
	st := s.storageByName(name)
	var stPath, stType string
	var stHasContent, stDisabled bool
	if st != nil {
		stPath, stType, stHasContent, stDisabled = st.spec.Path, st.spec.Type, st.hasContent(content), st.spec.Disabled
	}
	s.mu.Unlock()
	switch {
	case st == nil:
		return nil, errf(500, "storage '%s' does not exist", name)
	case stDisabled:
		return nil, errf(500, "storage '%s' is disabled", name)
	case !fileBased(stType):
		return nil, errf(500, "can't upload to storage type '%s', not a file based storage!", stType)
	case !stHasContent:
		return nil, errf(500, "storage '%s' is not configured for content-type '%s'", name, content)
	}
	var dest, volname, format string
	switch content {
	case "iso":
		if !isoExt.MatchString(filename) {
			return nil, paramErr(map[string]string{"filename": "wrong file extension"})
		}
		dest, volname, format = stPath+"/template/iso/"+filename, "iso/"+filename, "iso"
	case "import":
		// import.go: the names and formats each pve-storage takes.
		if format = s.importExtension(filename); format == "" {
			return nil, paramErr(map[string]string{"filename": "invalid filename or wrong extension"})
		}
		if format != "qcow2" && format != "raw" {
			return nil, paramErr(map[string]string{"filename": "pvesim simulates qcow2 and raw imports only, not " + format})
		}
		dest, volname = stPath+"/import/"+filename, "import/"+filename
	default:
		return nil, paramErr(map[string]string{"content": "pvesim downloads ISO and import images only"})
	}
	compression := r.param("compression")
	upid := s.startTask(r, "download", filename, func(ctx context.Context, t *task) error {
		if err := t.injected(); err != nil {
			return err
		}
		// The worker refuses decompression before anything else, for every
		// content but iso (Status.pm download_url, pve-storage 9.1.7).
		if compression != "" && content != "iso" {
			return fmt.Errorf("decompression not supported for %s", content)
		}
		t.logf("downloading %s to %s", u, dest)
		s.mu.Lock()
		existing := st.vols[volname]
		remote, known := s.remote[u]
		s.mu.Unlock()
		if existing != nil {
			if algo == "" {
				return fmt.Errorf("refusing to override existing file '%s'", dest)
			}
			got := fileChecksum(algo, existing.data, existing.sha256)
			if strings.EqualFold(got, sum) {
				t.logf("calculating checksum of existing file...OK, got correct file already, no need to download")
				return nil
			}
			return fmt.Errorf("checksum mismatch: got '%s' != expect '%s', aborting", got, sum)
		}
		// wget writes a per-process temporary file, renamed over the
		// destination at the end (pve-common 9.2.1 src/PVE/Tools.pm
		// download_file_from_url: "$dest.tmp_dwnl.$$", then rename): the
		// existing file is checked only above, as the task starts, so two
		// downloads that overlap both succeed, the later rename winning.
		tmp := fmt.Sprintf("%s.tmp_dwnl.%d", dest, t.pid)
		if !known && s.opts.HTTP != nil {
			var code int
			if remote, code = s.fetch(ctx, t, u); code != 0 {
				return fmt.Errorf("download failed: command '/usr/bin/wget --progress=dot:giga -O %s %s' failed: exit code %d", tmp, u, code)
			}
			known = true
		}
		if !known {
			t.logf("--2024-06-01 12:00:00--  %s", u)
			t.logf("ERROR 404: Not Found.")
			return fmt.Errorf("download failed: command '/usr/bin/wget --progress=dot:giga -O %s %s' failed: exit code 8", tmp, u)
		}
		size, data, fileSum, head := remote.Size, remote.Content, remote.SHA256, remote.Head
		if data != nil {
			size = int64(len(data))
			h := sha256.Sum256(data)
			fileSum = hex.EncodeToString(h[:])
			head = headOf(data)
		}
		perMiB := s.opts.Profile.DownloadPerMiB
		if err := s.pause(ctx, time.Duration(float64(perMiB)*float64(size)/float64(mib))); err != nil {
			return err
		}
		s.mu.Lock()
		room := st.avail()
		s.mu.Unlock()
		if size > room {
			return fmt.Errorf("download failed: command '/usr/bin/wget --progress=dot:giga -O %s %s' failed: exit code 3", tmp, u)
		}
		if algo != "" {
			t.logf("calculating checksum...")
			got := fileChecksum(algo, data, fileSum)
			if !strings.EqualFold(got, sum) {
				return fmt.Errorf("checksum mismatch: got '%s' != expect '%s'", got, sum)
			}
			t.logf("OK, checksum verified")
		}
		if content == "import" {
			// The untrusted image check (assert_file_validity), after the
			// checksum and before the rename.
			if _, err := untrustedImage(tmp, format, head, size); err != nil {
				return fmt.Errorf("failed to verify file: %v", err)
			}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if old := st.vols[volname]; old != nil {
			st.used -= old.alloc
		}
		st.used += size
		st.vols[volname] = &volume{name: volname, content: content, format: format, size: size, alloc: size, ctime: time.Now(), data: data, sha256: fileSum, head: head, url: u}
		t.logf("download of '%s' to '%s' finished", u, dest)
		return nil
	})
	return upid, nil
}

// fetch downloads u as wget would, hashing what it reads. A non-zero code
// is wget's exit status: 4 for a network failure, 5 for a certificate it
// cannot verify, 8 for an error response (wget(1) EXIT STATUS).
func (s *Server) fetch(ctx context.Context, t *task, u string) (RemoteFile, int) {
	t.logf("--%s--  %s", time.Now().UTC().Format("2006-01-02 15:04:05"), u)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return RemoteFile{}, 4
	}
	resp, err := s.opts.HTTP.Do(req)
	if err != nil {
		var uerr x509.UnknownAuthorityError
		if errors.As(err, &uerr) || strings.Contains(err.Error(), "certificate") {
			t.logf("ERROR: cannot verify certificate: %v", err)
			return RemoteFile{}, 5
		}
		t.logf("failed: %v", err)
		return RemoteFile{}, 4
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.logf("ERROR %d: %s.", resp.StatusCode, http.StatusText(resp.StatusCode))
		return RemoteFile{}, 8
	}
	h, head := sha256.New(), &headWriter{}
	n, err := io.Copy(io.MultiWriter(h, head), resp.Body)
	if err != nil {
		t.logf("read error: %v", err)
		return RemoteFile{}, 4
	}
	return RemoteFile{Size: n, SHA256: hex.EncodeToString(h.Sum(nil)), Head: head.buf}, 0
}

// normalizeContentFilename is pve-storage's normalize_content_filename.
func normalizeContentFilename(name string) string {
	name = strings.TrimRight(name, "\n")
	if i := strings.LastIndexAny(name, "/\\"); i >= 0 {
		name = name[i+1:]
	}
	return unsafeFilenameChar.ReplaceAllString(name, "_")
}

var unsafeFilenameChar = regexp.MustCompile(`[^a-zA-Z0-9_.-]`)

// fileChecksum computes algo over data; for files kept only as size and
// SHA-256, only sha256 can be answered.
func fileChecksum(algo string, data []byte, sha256hex string) string {
	if data == nil {
		if algo == "sha256" {
			return strings.ToLower(sha256hex)
		}
		return "unknown-" + algo
	}
	h := checksumAlgorithms[algo]()
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// formatSize prints a byte count like PVE's format_size ("32G", "4M").
func formatSize(b int64) string {
	switch {
	case b > 0 && b%tib == 0:
		return strconv.FormatInt(b/tib, 10) + "T"
	case b > 0 && b%gib == 0:
		return strconv.FormatInt(b/gib, 10) + "G"
	case b > 0 && b%mib == 0:
		return strconv.FormatInt(b/mib, 10) + "M"
	case b > 0 && b%kib == 0:
		return strconv.FormatInt(b/kib, 10) + "K"
	}
	return strconv.FormatInt(b, 10)
}

// parseSize reads "32G", "512M", "4096" (bytes) as PVE's parse_size does.
func parseSize(v string) (int64, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	mult := int64(1)
	switch strings.ToUpper(v[len(v)-1:]) {
	case "K":
		mult = kib
	case "M":
		mult = mib
	case "G":
		mult = gib
	case "T":
		mult = tib
	}
	if mult != 1 {
		v = v[:len(v)-1]
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 {
		return 0, false
	}
	return int64(f * float64(mult)), true
}
