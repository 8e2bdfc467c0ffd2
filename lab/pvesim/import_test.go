package pvesim

import (
	"bytes"
	"encoding/binary"
	"net/url"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/lab/qcow2"
)

// importStorages are pvesim's default storages with 'import' on local.
var importStorages = []StorageSpec{
	{Name: "local", Type: "dir", Content: []string{"iso", "vztmpl", "backup", "import"}, TotalBytes: 94 * gib, Path: "/var/lib/vz"},
	{Name: "local-lvm", Type: "lvmthin", Content: []string{"images", "rootdir"}, TotalBytes: 348 * gib},
}

// image is a qcow2 file of the nocloud image's virtual size; mutate may
// change its header.
func image(mutate func(h []byte)) []byte {
	h := qcow2.Header(1246 * mib)
	if mutate != nil {
		mutate(h)
	}
	return append(h, bytes.Repeat([]byte{7}, 8192)...)
}

// download runs download-url of url to local as content=import under name
// and returns the task's exit status (or the request's error message).
func download(c *client, u, name string, extra url.Values) string {
	form := url.Values{"url": {u}, "content": {"import"}, "filename": {name}}
	for k, v := range extra {
		form[k] = v
	}
	a := c.do("POST", "/nodes/pve/storage/local/download-url", form)
	if a.code != 200 {
		return a.msg + strings.Join(errTexts(a.errs), "; ")
	}
	ex, _ := c.waitTask(a.data.(string))["exitstatus"].(string)
	return ex
}

func errTexts(m map[string]any) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+": "+v.(string))
	}
	return out
}

// What download-url imports follows pve-storage: nothing before 8.2.8 (no
// 'import' content), .ova only up to 8.3.5, qcow2/raw/vmdk from 8.3.6; the
// image is checked as untrusted, and never decompressed.
func TestImportDownloadByPVEStorage(t *testing.T) {
	remote := map[string]RemoteFile{
		"https://f/good.qcow2":    {Content: image(nil)},
		"https://f/notqcow.qcow2": {Content: bytes.Repeat([]byte("iso"), 4000)},
		"https://f/backed.qcow2":  {Content: image(func(h []byte) { binary.BigEndian.PutUint64(h[8:], 512) })},
		"https://f/datafile.qcow2": {Content: image(func(h []byte) {
			binary.BigEndian.PutUint64(h[72:], 1<<2)
		})},
	}
	if _, err := New(Options{Version: "8.2.4", Storages: importStorages}); err == nil || !strings.Contains(err.Error(), "take the content type 'import' from pve-storage 8.2.8") {
		t.Fatalf("8.2.4 with an import storage: %v", err)
	}
	// Block storages never take it (their plugins' content lists).
	thin := []StorageSpec{{Name: "local-lvm", Type: "lvmthin", Content: []string{"images", "import"}, TotalBytes: 348 * gib}}
	if _, err := New(Options{Version: "9.1.2", Storages: thin}); err == nil || !strings.Contains(err.Error(), "type lvmthin does not support content type 'import'") {
		t.Fatalf("lvmthin with import: %v", err)
	}
	old := newSim(t, Options{Version: "8.3.4", Storages: importStorages, RemoteFiles: remote})
	if got := download(newClient(t, old), "https://f/good.qcow2", "talos.qcow2", nil); !strings.Contains(got, "invalid filename or wrong extension") {
		t.Fatalf("8.3 (pve-storage 8.2.9) took a qcow2 import: %q", got)
	}

	s := newSim(t, Options{Version: "8.4.21", Storages: importStorages, RemoteFiles: remote})
	c := newClient(t, s)
	for name, want := range map[string]string{
		"talos.raw.xz": "invalid filename or wrong extension",
		"talos.iso":    "invalid filename or wrong extension",
	} {
		if got := download(c, "https://f/good.qcow2", name, nil); !strings.Contains(got, want) {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	if got := download(c, "https://f/good.qcow2", "talos.qcow2", url.Values{"compression": {"zst"}}); got != "decompression not supported for import" {
		t.Errorf("compressed import: %q", got)
	}
	for u, want := range map[string]string{
		"https://f/notqcow.qcow2":  "failed to verify file: qemu-img: Could not open '/var/lib/vz/import/x.qcow2.tmp_dwnl.",
		"https://f/backed.qcow2":   "failed to verify file: backing file not allowed for untrusted image",
		"https://f/datafile.qcow2": "'data-file' references are not allowed!",
	} {
		if got := download(c, u, "x.qcow2", nil); !strings.Contains(got, want) {
			t.Errorf("%s: %q, want %q", u, got, want)
		}
	}
	if got := download(c, "https://f/good.qcow2", "talos v1.qcow2", nil); got != "OK" {
		t.Fatalf("download: %q", got)
	}
	content := c.ok("GET", "/nodes/pve/storage/local/content", url.Values{"content": {"import"}}).([]any)
	if len(content) != 1 || content[0].(map[string]any)["volid"] != "local:import/talos_v1.qcow2" || content[0].(map[string]any)["format"] != "qcow2" {
		t.Fatalf("import content (the name normalised, nothing but the good image kept): %v", content)
	}
}

// A disk is created from an import volume with <storage>:0,import-from=,
// after the create's own privilege checks; it has the image's virtual size
// until resized, and a failed import leaves neither VM nor volume.
func TestImportFromOnCreate(t *testing.T) {
	remote := map[string]RemoteFile{"https://f/nocloud-amd64.qcow2": {Content: image(nil)}}
	space := []ACE{{Path: "/", Privileges: []string{"VM.Allocate", "VM.Audit", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Options",
		"VM.Config.HWType", "VM.Config.Disk", "VM.Config.Network", "VM.PowerMgmt", "SDN.Use"}},
		{Path: "/storage/local-lvm", Privileges: []string{"Datastore.AllocateSpace"}}}
	s := newSim(t, Options{Version: "8.4.21", Storages: importStorages, RemoteFiles: remote,
		Tokens: []Token{{ID: "root@pam!bootstrap", Secret: "s", ACL: Admin("8.4.21")}, {ID: "u@pve!t", Secret: "t", ACL: space}}})
	c := newClient(t, s)
	if got := download(c, "https://f/nocloud-amd64.qcow2", "talos.qcow2", nil); got != "OK" {
		t.Fatal(got)
	}
	vm := func(scsi0 string) url.Values {
		v := url.Values{}
		for k, x := range talosVM {
			v[k] = x
		}
		v.Del("ide2")
		v.Set("boot", "order=scsi0")
		v.Set("scsi0", scsi0)
		return v
	}
	if a := c.do("POST", "/nodes/pve/qemu", vm("local-lvm:32,import-from=local:import/talos.qcow2")); a.code != 400 ||
		a.errs["scsi0"] != "'import-from' requires special syntax - use <storage ID>:0,import-from=<source>" {
		t.Errorf("a sized import: %s", a.body)
	}
	c.auth = "PVEAPIToken=u@pve!t=t"
	if a := c.do("POST", "/nodes/pve/qemu", vm("local-lvm:0,import-from=local:import/talos.qcow2,iothread=1")); a.code != 403 ||
		a.msg != "Permission check failed (/storage/local, Datastore.AllocateSpace|Datastore.Audit)\n" {
		t.Errorf("import without read access to the import storage: %s %s", a.status, a.body)
	}
	c.auth = newClient(t, s).auth

	// Half way through its import the create fails: PVE frees the volumes
	// it allocated and removes the config.
	s.InjectFault(Fault{Kind: FaultTaskError, Method: "POST", Path: "/nodes/pve/qemu", Message: "qemu-img: error while writing at byte 0: Input/output error", Times: 1})
	st := c.waitTask(c.ok("POST", "/nodes/pve/qemu", vm("local-lvm:0,import-from=local:import/talos.qcow2,iothread=1")).(string))
	if ex, _ := st["exitstatus"].(string); !strings.HasPrefix(ex, "unable to create VM 701 - cannot import from 'local:import/talos.qcow2' - qemu-img") {
		t.Errorf("failed import: %v", st)
	}
	if n := len(c.ok("GET", "/nodes/pve/storage/local-lvm/content", nil).([]any)); n != 0 {
		t.Errorf("%d volumes left by the failed import", n)
	}
	if a := c.do("GET", "/nodes/pve/qemu/701/config", nil); a.code != 500 {
		t.Errorf("VM left by the failed import: %s", a.body)
	}

	var started []VMEvent
	s.OnStart(func(ev VMEvent) error { started = append(started, ev); return nil })
	if st := c.waitTask(c.ok("POST", "/nodes/pve/qemu", vm("local-lvm:0,import-from=local:import/talos.qcow2,iothread=1")).(string)); st["exitstatus"] != "OK" {
		t.Fatalf("create: %v", st)
	}
	cfg := c.ok("GET", "/nodes/pve/qemu/701/config", nil).(map[string]any)
	if cfg["scsi0"] != "local-lvm:vm-701-disk-0,iothread=1,size=1246M" {
		t.Fatalf("imported disk: %v", cfg["scsi0"])
	}
	if st := c.waitTask(c.ok("PUT", "/nodes/pve/qemu/701/resize", url.Values{"disk": {"scsi0"}, "size": {"32G"}}).(string)); st["exitstatus"] != "OK" {
		t.Fatalf("resize: %v", st)
	}
	if st := c.waitTask(c.ok("POST", "/nodes/pve/qemu/701/status/start", nil).(string)); st["exitstatus"] != "OK" {
		t.Fatalf("start: %v", st)
	}
	if len(started) != 1 || len(started[0].Disks) != 1 || started[0].Disks[0].SizeBytes != 32*gib ||
		started[0].Disks[0].ImportURL != "https://f/nocloud-amd64.qcow2" || started[0].Disks[0].ImportedFrom != "local:import/talos.qcow2" {
		t.Fatalf("the guest's disks: %+v", started)
	}

	// qemu-server before 8.2.7 takes no import volume as a source.
	old := newSim(t, Options{Version: "8.4.21", QemuServer: "8.2.6", Storages: importStorages, RemoteFiles: remote})
	oc := newClient(t, old)
	if got := download(oc, "https://f/nocloud-amd64.qcow2", "talos.qcow2", nil); got != "OK" {
		t.Fatal(got)
	}
	if a := oc.do("POST", "/nodes/pve/qemu", vm("local-lvm:0,import-from=local:import/talos.qcow2")); a.code != 400 ||
		!strings.Contains(string(a.body), "local:import/talos.qcow2 has wrong type 'import' - not an image") {
		t.Errorf("qemu-server 8.2.6: %s", a.body)
	}
}
