package pvesim

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// client talks raw HTTP to the simulator, trusting its CA.
type client struct {
	t    *testing.T
	s    *Server
	hc   *http.Client
	auth string
}

func newClient(t *testing.T, s *Server) *client {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(s.CACertPEM()) {
		t.Fatal("CA PEM not parsable")
	}
	id, secret := s.Token()
	return &client{t: t, s: s, hc: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}},
		auth: "PVEAPIToken=" + id + "=" + secret}
}

type answer struct {
	code   int
	status string
	body   []byte
	data   any
	msg    string
	errs   map[string]any
}

func (c *client) do(method, path string, form url.Values) answer {
	c.t.Helper()
	var body io.Reader
	u := c.s.APIURL() + path
	if form != nil && (method == "POST" || method == "PUT") {
		body = strings.NewReader(form.Encode())
	} else if form != nil {
		u += "?" + form.Encode()
	}
	req, _ := http.NewRequest(method, u, body)
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{code: resp.StatusCode, status: resp.Status, body: b}
	if len(b) > 0 {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			c.t.Fatalf("%s %s: body not JSON: %q", method, path, b)
		}
		a.data = m["data"]
		a.msg, _ = m["message"].(string)
		a.errs, _ = m["errors"].(map[string]any)
	}
	return a
}

func (c *client) ok(method, path string, form url.Values) any {
	c.t.Helper()
	a := c.do(method, path, form)
	if a.code != 200 {
		c.t.Fatalf("%s %s: %s %s", method, path, a.status, a.body)
	}
	return a.data
}

func (c *client) waitTask(upid string) map[string]any {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		st := c.ok("GET", "/nodes/pve/tasks/"+url.PathEscape(upid)+"/status", nil).(map[string]any)
		if st["status"] == "stopped" {
			return st
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.t.Fatalf("task %s did not finish", upid)
	return nil
}

func newSim(t *testing.T, o Options) *Server {
	t.Helper()
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

var talosVM = url.Values{
	"vmid": {"701"}, "name": {"cp-1"}, "cores": {"2"}, "cpu": {"host"}, "memory": {"4096"},
	"scsihw": {"virtio-scsi-single"}, "scsi0": {"local-lvm:32,discard=on,format=raw,iothread=1"},
	"ide2": {"local:iso/talos.iso,media=cdrom"}, "ide3": {"local-lvm:cloudinit,format=raw"},
	"ipconfig0": {"ip=10.0.20.11/24,gw=10.0.20.1"}, "nameserver": {"10.0.20.1 1.1.1.1"},
	"net0": {"virtio=BC:24:11:00:00:01,bridge=vmbr0,tag=20"}, "boot": {"order=scsi0;ide2"},
	"agent": {"1"}, "ostype": {"l26"}, "tags": {"talos;bootstrap-lab;controlplane"},
}

func TestJSONTypesAndErrors(t *testing.T) {
	s := newSim(t, Options{ISOs: []ISOSpec{{Storage: "local", Name: "talos.iso", Size: 100 << 20}}})
	c := newClient(t, s)

	if v := c.ok("GET", "/version", nil).(map[string]any); v["version"] != "8.2.4" {
		t.Fatalf("version = %v", v)
	}
	if id, ok := c.ok("GET", "/cluster/nextid", nil).(string); !ok || id != "100" {
		t.Fatalf("nextid data must be the string \"100\", got %#v", id)
	}

	upid := c.ok("POST", "/nodes/pve/qemu", talosVM).(string)
	if !strings.HasPrefix(upid, "UPID:pve:") || !strings.HasSuffix(upid, ":qmcreate:701:root@pam!bootstrap:") {
		t.Fatalf("UPID %q", upid)
	}
	if st := c.waitTask(upid); st["exitstatus"] != "OK" {
		t.Fatalf("create task: %v", st)
	}
	conf := c.ok("GET", "/nodes/pve/qemu/701/config", nil).(map[string]any)
	if _, isNum := conf["cores"].(float64); !isNum {
		t.Errorf("cores must be a JSON number, got %#v", conf["cores"])
	}
	for _, k := range []string{"agent", "cpu", "boot", "net0", "ipconfig0", "memory", "digest"} {
		if _, isStr := conf[k].(string); !isStr {
			t.Errorf("%s must be a JSON string, got %#v", k, conf[k])
		}
	}
	if conf["scsi0"] != "local-lvm:vm-701-disk-0,discard=on,iothread=1,size=32G" {
		t.Errorf("scsi0 = %v", conf["scsi0"])
	}
	if conf["ide3"] != "local-lvm:vm-701-cloudinit,media=cdrom" {
		t.Errorf("ide3 = %v", conf["ide3"])
	}
	if conf["ide2"] != "local:iso/talos.iso,media=cdrom,size=100M" {
		t.Errorf("ide2 = %v", conf["ide2"])
	}

	res := c.ok("GET", "/cluster/resources", url.Values{"type": {"vm"}}).([]any)
	if len(res) != 1 {
		t.Fatalf("resources: %v", res)
	}
	if vmid, isNum := res[0].(map[string]any)["vmid"].(float64); !isNum || vmid != 701 {
		t.Errorf("vmid must be the number 701: %#v", res[0])
	}

	// A taken VMID: PVE's text in the status line and in the JSON message, connection closed.
	a := c.do("POST", "/nodes/pve/qemu", talosVM)
	want := "unable to create VM 701 - VM 701 already exists on node 'pve'"
	if a.code != 500 || a.status != "500 "+want || a.msg != want+"\n" {
		t.Fatalf("duplicate create: %q %q", a.status, a.body)
	}
	if bytes.Contains(a.body, []byte(`"errors"`)) {
		t.Errorf("non-parameter errors carry no errors object: %s", a.body)
	}

	a = c.do("POST", "/nodes/pve/qemu", url.Values{"vmid": {"702"}, "memory": {"lots"}, "bogus": {"1"}})
	if a.code != 400 || a.msg != "Parameter verification failed.\n" || a.errs["memory"] == nil || a.errs["bogus"] == nil {
		t.Fatalf("param errors: %s %s", a.status, a.body)
	}
	a = c.do("GET", "/cluster/nextid", url.Values{"vmid": {"701"}})
	if a.code != 400 || a.errs["vmid"] != "VM 701 already exists" {
		t.Fatalf("nextid taken: %s %s", a.status, a.body)
	}
}

func TestAuthAndPrivileges(t *testing.T) {
	s := newSim(t, Options{Tokens: []Token{
		{ID: "bootstrap@pve!run", Secret: "s3cret", ACL: []ACE{
			{Path: "/", Privileges: []string{"Sys.Audit", "VM.Audit", "Datastore.Audit"}},
			{Path: "/vms", Privileges: []string{"VM.Allocate", "VM.Audit", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Options", "VM.Config.Disk"}},
		}},
	}, Users: []User{{ID: "root@pam", Password: "pw"}}})
	c := newClient(t, s)

	bad := *c
	bad.auth = "PVEAPIToken=bootstrap@pve!run=wrong"
	if a := bad.do("GET", "/version", nil); a.code != 401 || a.status != "401 Authentication failed!" || len(a.body) != 0 {
		t.Fatalf("bad token: %q %q", a.status, a.body)
	}
	bad.auth = ""
	if a := bad.do("GET", "/version", nil); a.status != "401 No ticket" {
		t.Fatalf("no auth: %q", a.status)
	}

	if err := s.SeedVM(701, map[string]string{"name": "cp-1", "scsi0": "local-lvm:8"}, false); err != nil {
		t.Fatal(err)
	}
	a := c.do("POST", "/nodes/pve/qemu/701/status/start", nil)
	if a.code != 403 || a.msg != "Permission check failed (/vms/701, VM.PowerMgmt)\n" {
		t.Fatalf("start without VM.PowerMgmt: %s %s", a.status, a.body)
	}
	// The permission is checked before the VM is looked up: a missing VMID
	// answers 403 to a caller without the privilege, 500 to one with it.
	if a := c.do("POST", "/nodes/pve/qemu/799/status/start", nil); a.code != 403 || a.msg != "Permission check failed (/vms/799, VM.PowerMgmt)\n" {
		t.Fatalf("start a missing VM without VM.PowerMgmt: %s %s", a.status, a.body)
	}
	if a := c.do("GET", "/nodes/pve/qemu/799/status/current", nil); a.code != 500 || !strings.Contains(a.msg, "799.conf' does not exist") {
		t.Fatalf("status of a missing VM with VM.Audit: %s %s", a.status, a.body)
	}
	perms := c.ok("GET", "/access/permissions", url.Values{"path": {"/vms/701"}}).(map[string]any)
	p := perms["/vms/701"].(map[string]any)
	if p["VM.Allocate"] == nil || p["Sys.Audit"] != nil {
		t.Fatalf("a more specific path replaces inherited privileges: %v", p)
	}

	// Ticket login (no Content-Type, like Telmate) and CSRF on writes.
	req, _ := http.NewRequest("POST", s.APIURL()+"/access/ticket", strings.NewReader("username=root%40pam&password=pw"))
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var login struct {
		Data struct{ Ticket, CSRFPreventionToken string }
	}
	_ = json.NewDecoder(resp.Body).Decode(&login)
	resp.Body.Close()
	if login.Data.Ticket == "" {
		t.Fatal("no ticket")
	}
	tc := *c
	tc.auth = "PVEAuthCookie=" + login.Data.Ticket
	if a := tc.do("POST", "/nodes/pve/qemu/701/status/start", nil); a.code != 401 {
		t.Fatalf("write without CSRF token must fail: %s", a.status)
	}
}

func TestTasksLocksCapacityAndHooks(t *testing.T) {
	s := newSim(t, Options{Profile: N100(), TimeScale: 0.02,
		ISOs: []ISOSpec{{Storage: "local", Name: "talos.iso", Size: 100 << 20}},
		Storages: []StorageSpec{
			{Name: "local", Type: "dir", Content: []string{"iso"}, TotalBytes: 94 * gib, Path: "/var/lib/vz"},
			{Name: "local-lvm", Type: "lvmthin", Content: []string{"images"}, TotalBytes: 348 * gib},
			{Name: "thick", Type: "lvm", Content: []string{"images"}, TotalBytes: 348 * gib},
		}})
	c := newClient(t, s)
	var mu sync.Mutex
	var started []VMEvent
	s.OnStart(func(ev VMEvent) error { mu.Lock(); started = append(started, ev); mu.Unlock(); return nil })

	upid := c.ok("POST", "/nodes/pve/qemu", talosVM).(string)
	// While the create task runs the VM exists, nameless, with lock=create.
	res := c.ok("GET", "/cluster/resources", url.Values{"type": {"vm"}}).([]any)
	if e := res[0].(map[string]any); e["lock"] != "create" || e["name"] != nil {
		t.Fatalf("VM during create: %v", e)
	}
	if st := c.ok("GET", "/nodes/pve/tasks/"+url.PathEscape(upid)+"/status", nil).(map[string]any); st["status"] != "running" || st["exitstatus"] != nil {
		t.Fatalf("task must be running without exitstatus: %v", st)
	}
	c.waitTask(upid)

	begin := time.Now()
	st := c.waitTask(c.ok("POST", "/nodes/pve/qemu/701/status/start", nil).(string))
	if st["exitstatus"] != "OK" {
		t.Fatalf("start: %v", st)
	}
	if d := time.Since(begin); d < 25*time.Millisecond {
		t.Errorf("n100 start at scale 0.02 should take ~30ms, took %s", d)
	}
	mu.Lock()
	if len(started) != 1 || started[0].IPv4.String() != "10.0.20.11/24" || started[0].MAC != "BC:24:11:00:00:01" ||
		len(started[0].Disks) != 1 || started[0].Disks[0].Bus != "scsi" || started[0].Disks[0].SizeBytes != 32<<30 ||
		started[0].VLAN != 20 || len(started[0].Nameservers) != 2 {
		t.Fatalf("start event: %+v", started)
	}
	mu.Unlock()

	// Running VM: cores go to pending, tags apply at once.
	c.ok("PUT", "/nodes/pve/qemu/701/config", url.Values{"cores": {"4"}, "tags": {"talos"}})
	cur := c.ok("GET", "/nodes/pve/qemu/701/config", url.Values{"current": {"1"}}).(map[string]any)
	if cur["cores"] != float64(2) || cur["tags"] != "talos" {
		t.Fatalf("current config: cores %v tags %v", cur["cores"], cur["tags"])
	}
	if st := c.do("DELETE", "/nodes/pve/qemu/701", nil); st.msg != "VM 701 is running - destroy failed\n" {
		t.Fatalf("delete running: %s", st.body)
	}

	// A backup holds the config lock: start fails in the task with PVE's text.
	c.waitTask(c.ok("POST", "/nodes/pve/qemu/701/status/stop", nil).(string))
	_ = s.SetLock(701, "backup", 0)
	if st := c.waitTask(c.ok("POST", "/nodes/pve/qemu/701/status/start", nil).(string)); st["exitstatus"] != "VM is locked (backup)" {
		t.Fatalf("start while locked: %v", st)
	}
	if a := c.do("PUT", "/nodes/pve/qemu/701/config", url.Values{"cores": {"4"}}); a.code != 500 || a.msg != "VM is locked (backup)\n" {
		t.Fatalf("config while locked: %s %s", a.status, a.body)
	}

	// Storage capacity: on thick storage a disk that does not fit fails
	// the create task and leaves nothing behind; a thin pool creates it.
	_ = s.SetStorageUsed("local-lvm", 340<<30)
	_ = s.SetStorageUsed("thick", 340<<30)
	thin := url.Values{"vmid": {"703"}, "scsi0": {"local-lvm:32"}}
	if st := c.waitTask(c.ok("POST", "/nodes/pve/qemu", thin).(string)); st["exitstatus"] != "OK" {
		t.Fatalf("overcommitted thin pool: %v", st)
	}
	big := url.Values{"vmid": {"702"}, "scsi0": {"thick:32"}}
	st = c.waitTask(c.ok("POST", "/nodes/pve/qemu", big).(string))
	if ex, _ := st["exitstatus"].(string); !strings.HasPrefix(ex, "unable to create VM 702 - lvcreate") {
		t.Fatalf("full storage: %v", st)
	}
	if _, exists := s.VM(702); exists {
		t.Fatal("failed create must remove the VM")
	}
}

func TestFaultsAndCounters(t *testing.T) {
	s := newSim(t, Options{})
	c := newClient(t, s)
	s.InjectFault(Fault{Kind: FaultStatus, Method: "GET", Path: "/version", Times: 1, Status: 503, Message: "service unavailable"})
	if a := c.do("GET", "/version", nil); a.code != 503 {
		t.Fatalf("fault: %s", a.status)
	}
	c.ok("GET", "/version", nil)
	s.InjectFault(Fault{Kind: FaultLock, Method: "PUT", Path: "/nodes/*/qemu/*/config"})
	_ = s.SeedVM(705, map[string]string{"name": "w"}, false)
	if a := c.do("PUT", "/nodes/pve/qemu/705/config", url.Values{"cores": {"2"}}); a.msg != "can't lock file '/var/lock/qemu-server/lock-705.conf' - got timeout\n" {
		t.Fatalf("lock fault: %s", a.body)
	}
	s.ClearFaults()
	s.InjectFault(Fault{Kind: FaultTaskError, Path: "/nodes/*/qemu/*/status/start", Message: "start failed: simulated", Times: 1})
	if st := c.waitTask(c.ok("POST", "/nodes/pve/qemu/705/status/start", nil).(string)); st["exitstatus"] != "start failed: simulated" {
		t.Fatalf("task fault: %v", st)
	}
	if got := s.Count("GET", "/version"); got != 2 {
		t.Errorf("GET /version counted %d", got)
	}
	if got := s.MutatingCalls(); got != 2 {
		t.Errorf("mutating calls = %d (%v)", got, s.MutatingCallList())
	}
}

func TestDownloadURL(t *testing.T) {
	iso := bytes.Repeat([]byte("talos"), 1000)
	s := newSim(t, Options{RemoteFiles: map[string]RemoteFile{"https://factory.example/talos.iso": {Content: iso}}})
	c := newClient(t, s)
	form := url.Values{"url": {"https://factory.example/talos.iso"}, "content": {"iso"}, "filename": {"talos.iso"},
		"checksum": {"00"}, "checksum-algorithm": {"sha256"}}
	st := c.waitTask(c.ok("POST", "/nodes/pve/storage/local/download-url", form).(string))
	if ex, _ := st["exitstatus"].(string); !strings.HasPrefix(ex, "checksum mismatch: got '") {
		t.Fatalf("bad checksum: %v", st)
	}
	form.Set("checksum", fileChecksum("sha256", iso, ""))
	if st := c.waitTask(c.ok("POST", "/nodes/pve/storage/local/download-url", form).(string)); st["exitstatus"] != "OK" {
		t.Fatalf("download: %v", st)
	}
	content := c.ok("GET", "/nodes/pve/storage/local/content", url.Values{"content": {"iso"}}).([]any)
	if len(content) != 1 || content[0].(map[string]any)["volid"] != "local:iso/talos.iso" {
		t.Fatalf("content: %v", content)
	}
	if a := c.do("POST", "/nodes/pve/storage/local-lvm/download-url", form); a.msg != "can't upload to storage type 'lvmthin', not a file based storage!\n" {
		t.Fatalf("lvm download: %s", a.body)
	}
}

func TestLegacyErrorsKeepTextInStatusLineOnly(t *testing.T) {
	s := newSim(t, Options{LegacyErrors: true})
	c := newClient(t, s)
	a := c.do("GET", "/nodes/pve/qemu/999/config", nil)
	if a.status != "500 Configuration file 'nodes/pve/qemu-server/999.conf' does not exist" || string(a.body) != `{"data":null}` {
		t.Fatalf("legacy error: %q %s", a.status, a.body)
	}
}

func TestSlowProbabilisticAndUnauthorizedFaultsStopAndDestroyHooks(t *testing.T) {
	s := newSim(t, Options{Seed: 7})
	c := newClient(t, s)
	s.InjectFault(Fault{Kind: FaultSlow, Path: "/version", Delay: 80 * time.Millisecond, Times: 1})
	begin := time.Now()
	c.ok("GET", "/version", nil)
	if d := time.Since(begin); d < 80*time.Millisecond {
		t.Errorf("slow fault answered after %s", d)
	}
	s.ClearFaults()
	s.InjectFault(Fault{Kind: FaultStatus, Path: "/nodes", Status: 500, Probability: 0.5})
	failed := 0
	for range 200 {
		if c.do("GET", "/nodes", nil).code == 500 {
			failed++
		}
	}
	if failed < 60 || failed > 140 {
		t.Errorf("probability 0.5 failed %d of 200", failed)
	}
	s.ClearFaults()
	s.InjectFault(Fault{Kind: FaultUnauthorized, Times: 1})
	if a := c.do("GET", "/version", nil); a.status != "401 Authentication failed!" {
		t.Errorf("unauthorized fault: %s", a.status)
	}

	var stopped []VMEvent
	var mu sync.Mutex
	s.OnStop(func(ev VMEvent) { mu.Lock(); stopped = append(stopped, ev); mu.Unlock() })
	_ = s.SeedVM(710, map[string]string{"name": "w-1", "ipconfig0": "ip=10.1.0.5/24", "scsi0": "local-lvm:8"}, true)
	if st := c.waitTask(c.ok("POST", "/nodes/pve/qemu/710/status/stop", nil).(string)); st["exitstatus"] != "OK" {
		t.Fatalf("stop: %v", st)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(stopped) != 1 || stopped[0].VMID != 710 || stopped[0].IPv4.String() != "10.1.0.5/24" {
		t.Fatalf("stop events: %+v", stopped)
	}
	pending := c.ok("GET", "/nodes/pve/qemu/710/pending", nil).([]any)
	if first := pending[0].(map[string]any); first["key"] != "digest" {
		t.Errorf("pending starts with the digest: %v", first)
	}

	// Destroying the VM frees the disks it owns and tells OnDestroy.
	var destroyed []VMEvent
	s.OnDestroy(func(ev VMEvent) { destroyed = append(destroyed, ev) })
	mu.Unlock()
	st := c.waitTask(c.ok("DELETE", "/nodes/pve/qemu/710", nil).(string))
	mu.Lock()
	if st["exitstatus"] != "OK" || len(destroyed) != 1 || destroyed[0].VMID != 710 || len(destroyed[0].Disks) != 1 || destroyed[0].IPv4.String() != "10.1.0.5/24" {
		t.Fatalf("destroy %v, events %+v", st, destroyed)
	}
}

// Smaller rules read from qemu-server 9.2.6, pve-common 9.2.1 and
// pve-manager 9.2.11 (docs/fidelity.md).
func TestCreateAndDestroyRules(t *testing.T) {
	s := newSim(t, Options{ISOs: []ISOSpec{{Storage: "local", Name: "talos.iso", Size: 100 << 20}}})
	c := newClient(t, s)
	create := func(k, v string) answer {
		form := url.Values{"vmid": {"790"}, "name": {"x"}, k: {v}}
		return c.do("POST", "/nodes/pve/qemu", form)
	}
	// pve_verify_mac_addr: unicast only.
	if a := create("net0", "virtio=01:00:5E:00:00:01,bridge=vmbr0"); a.code != 400 || !strings.Contains(fmt.Sprint(a.errs["net0"]), "valid unicast MAC address") {
		t.Errorf("multicast MAC: %s %v", a.status, a.errs)
	}
	// $check_drive_param: an ISO volume needs media=cdrom.
	if a := create("ide2", "local:iso/talos.iso"); a.code != 400 || strings.TrimSpace(fmt.Sprint(a.errs["ide2"])) != "explicit 'media=cdrom' is required for iso images" {
		t.Errorf("ISO without media=cdrom: %s %v", a.status, a.errs)
	}
	// $check_vm_modify_config_perm: vmgenid, hookscript, affinity are for
	// root@pam, the user; its token is not root@pam. The values are valid
	// ones: the schema's parameter check comes first (RESTHandler handle).
	// meta is no parameter of create_vm in any published schema: the
	// schema refuses it before the code's root-only rule could.
	if a := create("meta", "creation-qemu=9.0.2,ctime=1720000000"); a.code != 400 ||
		!strings.Contains(fmt.Sprint(a.errs["meta"]), "property is not defined in schema") {
		t.Errorf("meta: %s %v", a.status, a.errs)
	}
	for k, v := range map[string]string{"vmgenid": "1", "hookscript": "local:snippets/hook.sh", "affinity": "0-1"} {
		if a := create(k, v); a.code != 500 || a.msg != "only root can set '"+k+"' config\n" {
			t.Errorf("%s by a token: %s %s %v", k, a.status, a.msg, a.errs)
		}
	}
	// The filter's enum has no pool.
	if a := c.do("GET", "/cluster/resources", url.Values{"type": {"pool"}}); a.code != 400 || a.errs["type"] == nil {
		t.Errorf("type=pool: %s", a.status)
	}
	// destroy: skiplock only for root@pam; the lock is checked inside the
	// task (destroy_vm), not before it starts.
	if err := s.SeedVM(791, map[string]string{"name": "y", "scsi0": "local-lvm:8"}, false); err != nil {
		t.Fatal(err)
	}
	if err := s.SetLock(791, "backup", 0); err != nil {
		t.Fatal(err)
	}
	if a := c.do("DELETE", "/nodes/pve/qemu/791", url.Values{"skiplock": {"1"}}); a.code != 400 || strings.TrimSpace(fmt.Sprint(a.errs["skiplock"])) != "Only root may use this option." {
		t.Errorf("skiplock by a token: %s %v", a.status, a.errs)
	}
	upid, ok := c.ok("DELETE", "/nodes/pve/qemu/791", nil).(string)
	if !ok {
		t.Fatal("DELETE of a locked VM must answer a task")
	}
	if st := c.waitTask(upid); st["exitstatus"] != "VM is locked (backup)" {
		t.Errorf("destroy task of a locked VM: %v", st)
	}
	if _, ok := s.VM(791); !ok {
		t.Error("locked VM destroyed")
	}
}

// Memory as a ZFS host reports it: the ARC is used memory, given only in
// the PVE 9 node RRD; a start checks no free memory, only the kernel's
// one-mapping limit.
func TestMemoryARCAndStartWithoutAMemoryCheck(t *testing.T) {
	for _, version := range []string{"9.1.2", "8.4.1"} {
		t.Run(version, func(t *testing.T) {
			s := newSim(t, Options{Version: version, Node: NodeSpec{MemoryBytes: 8 * gib, ARCBytes: 2 * gib}})
			c := newClient(t, s)
			mem := c.ok("GET", "/nodes/pve/status", nil).(map[string]any)["memory"].(map[string]any)
			if mem["used"].(float64) != float64(2*gib+3*gib/2) {
				t.Errorf("used %v: the ARC counts as used", mem["used"])
			}
			rows := c.ok("GET", "/nodes/pve/rrddata", url.Values{"timeframe": {"hour"}}).([]any)
			if len(rows) != 60 {
				t.Fatalf("%d rows", len(rows))
			}
			last, prev := rows[59].(map[string]any), rows[58].(map[string]any)
			if _, ok := last["memused"]; ok || last["time"] == nil {
				t.Errorf("the current step carries values: %v", last)
			}
			arc, ok := prev["arcsize"]
			if version == "9.1.2" && (!ok || arc.(float64) != float64(2*gib)) {
				t.Errorf("9.x row %v: want arcsize", prev)
			}
			if version == "8.4.1" && ok {
				t.Errorf("8.x row %v: pve2-node has no arcsize", prev)
			}
			if a := c.do("GET", "/nodes/pve/rrddata", url.Values{"timeframe": {"minute"}}); a.code != 400 || a.errs["timeframe"] == nil {
				t.Errorf("bad timeframe: %s", a.status)
			}
			// Three 3 GiB VMs on 4.5 GiB available all start.
			for id := 701; id <= 703; id++ {
				if err := s.SeedVM(id, map[string]string{"name": fmt.Sprint("vm", id), "memory": "3072"}, false); err != nil {
					t.Fatal(err)
				}
				if st := c.waitTask(c.ok("POST", fmt.Sprintf("/nodes/pve/qemu/%d/status/start", id), nil).(string)); st["exitstatus"] != "OK" {
					t.Fatalf("start %d: %v", id, st)
				}
			}
			// One VM larger than RAM and swap (8 + 8 GiB) does not.
			if err := s.SeedVM(704, map[string]string{"name": "huge", "memory": "17408"}, false); err != nil {
				t.Fatal(err)
			}
			if st := c.waitTask(c.ok("POST", "/nodes/pve/qemu/704/status/start", nil).(string)); st["exitstatus"] != "start failed: QEMU exited with code 1" {
				t.Errorf("start of a VM larger than RAM + swap: %v", st)
			}
		})
	}
}

// Behaviours read from the PVE sources (docs/fidelity.md, Proxmox VE).
func TestProxmoxSourceBehaviours(t *testing.T) {
	iso := bytes.Repeat([]byte("talos"), 100)
	p := Instant()
	p.RRDInterval = time.Hour
	s := newSim(t, Options{Version: "9.1.2", Profile: p, Node: NodeSpec{MemoryBytes: 16 * gib, PageCacheBytes: 10 * gib},
		RemoteFiles: map[string]RemoteFile{"https://factory.example/talos.iso": {Content: iso}},
		Guests:      []GuestSpec{{VMID: 800, Type: "lxc", Name: "pihole"}}})
	c := newClient(t, s)

	// download-url stores the normalised name (normalize_content_filename).
	form := url.Values{"url": {"https://factory.example/talos.iso"}, "content": {"iso"}, "filename": {"../x/talos v1 (nocloud).iso"}}
	if st := c.waitTask(c.ok("POST", "/nodes/pve/storage/local/download-url", form).(string)); st["exitstatus"] != "OK" {
		t.Fatalf("download: %v", st)
	}
	content := c.ok("GET", "/nodes/pve/storage/local/content", url.Values{"content": {"iso"}}).([]any)
	if len(content) != 1 || content[0].(map[string]any)["volid"] != "local:iso/talos_v1__nocloud_.iso" {
		t.Fatalf("content: %v", content)
	}
	// An unknown task is a parameter error (raise_param_exc): 400.
	if a := c.do("GET", "/nodes/pve/tasks/UPID:pve:0000AAAA:00000001:6B000000:qmstart:701:root@pam:/status", nil); a.code != 400 || a.errs["upid"] != "no such task" {
		t.Fatalf("unknown task: %s %s", a.status, a.body)
	}
	// Memory: free is MemFree (no page cache), available only on 9.x.
	mem := c.ok("GET", "/nodes/pve/status", nil).(map[string]any)["memory"].(map[string]any)
	if mem["available"].(float64) != float64(16*gib-3*gib/2) || mem["free"].(float64) != float64(16*gib-3*gib/2-10*gib) {
		t.Errorf("memory %v", mem)
	}
	// A container holds its VMID; a new VM is listed without name and
	// status until pvestatd's next broadcast; tags show at once.
	if a := c.do("POST", "/nodes/pve/qemu", url.Values{"vmid": {"800"}}); a.code != 500 || !strings.Contains(a.msg, "CT 800 already exists on node 'pve'") {
		t.Fatalf("create over a CT: %s", a.status)
	}
	if err := s.SeedVM(701, map[string]string{"name": "cp-1", "tags": "talos"}, true); err != nil {
		t.Fatal(err)
	}
	res := c.ok("GET", "/cluster/resources", url.Values{"type": {"vm"}}).([]any)
	var vm, ct map[string]any
	for _, e := range res {
		m := e.(map[string]any)
		switch m["type"] {
		case "qemu":
			vm = m
		case "lxc":
			ct = m
		}
	}
	if vm["status"] != "unknown" || vm["name"] != nil || vm["tags"] != "talos" || ct["name"] != "pihole" {
		t.Errorf("resources: vm %v ct %v", vm, ct)
	}
}

// The content index skips what check_volume_access refuses: images need
// Datastore.Audit on the storage and VM.Config.Disk on their VM (or
// Datastore.Allocate), ISOs AllocateSpace or Audit.
func TestContentIndexHidesVolumesAsCheckVolumeAccess(t *testing.T) {
	s := newSim(t, Options{ISOs: []ISOSpec{{Storage: "local", Name: "talos.iso", Size: 1 << 20}},
		Tokens: []Token{{ID: "root@pam!bootstrap", Secret: "s", ACL: Admin("8.2.4")},
			{ID: "u@pve!space", Secret: "a", ACL: []ACE{{Path: "/", Privileges: []string{"Datastore.AllocateSpace", "VM.Config.Disk"}}}},
			{ID: "u@pve!audit", Secret: "b", ACL: []ACE{{Path: "/", Privileges: []string{"Datastore.Audit"}}, {Path: "/vms/651", Privileges: []string{"VM.Config.Disk"}}}},
			{ID: "u@pve!alloc", Secret: "c", ACL: []ACE{{Path: "/", Privileges: []string{"Datastore.Allocate", "Datastore.Audit"}}}}}})
	for _, id := range []int{650, 651} {
		if err := s.SeedVM(id, map[string]string{"name": "x", "scsi0": "local-lvm:1"}, false); err != nil {
			t.Fatal(err)
		}
	}
	c := newClient(t, s)
	for auth, want := range map[string]struct{ images, isos int }{
		"u@pve!space=a": {0, 1}, "u@pve!audit=b": {1, 1}, "u@pve!alloc=c": {2, 1},
	} {
		c.auth = "PVEAPIToken=" + auth
		images := c.ok("GET", "/nodes/pve/storage/local-lvm/content", url.Values{"content": {"images"}}).([]any)
		isos := c.ok("GET", "/nodes/pve/storage/local/content", nil).([]any)
		if len(images) != want.images || len(isos) != want.isos {
			t.Errorf("%s: %d images, %d ISOs; want %+v", auth, len(images), len(isos), want)
		}
	}
}

// Behaviours follow the package that brings them: 'free' in node status
// is the raw MemFree from pve-common 8.3.1 (PVE 8.4) on, buffers and cache
// included before (8.2); apt/versions reports the installed qemu-server as
// OldVersion and apt's candidate as Version.
func TestBehavioursFollowTheirPackage(t *testing.T) {
	for version, wantFree := range map[string]int64{"8.2.4": 16*gib - 3*gib/2, "8.4.1": 16*gib - 3*gib/2 - 10*gib,
		// 8.3.7 moved to pve-storage 8.3.6, not to a newer pve-common.
		"8.3.7": 16*gib - 3*gib/2} {
		s := newSim(t, Options{Version: version, QemuServer: "8.3.10", QemuServerCandidate: "8.3.12",
			Node: NodeSpec{MemoryBytes: 16 * gib, PageCacheBytes: 10 * gib}})
		c := newClient(t, s)
		mem := c.ok("GET", "/nodes/pve/status", nil).(map[string]any)["memory"].(map[string]any)
		if mem["free"].(float64) != float64(wantFree) {
			t.Errorf("%s: free %v, want %d", version, mem["free"], wantFree)
		}
		for _, e := range c.ok("GET", "/nodes/pve/apt/versions", nil).([]any) {
			p := e.(map[string]any)
			if p["Package"] == "qemu-server" && (p["OldVersion"] != "8.3.10" || p["Version"] != "8.3.12") {
				t.Errorf("%s: qemu-server %v", version, p)
			}
		}
	}
}

// An EFI disk is created after the other disks (qemu-server's drive
// order), with the OVMF vars file's size whatever size was asked, rounded
// as its storage rounds a new volume; the guest sees no disk for it.
func TestEFIDiskSizeAndOrder(t *testing.T) {
	s := newSim(t, Options{ISOs: []ISOSpec{{Storage: "local", Name: "talos.iso", Size: 100 << 20}}, Storages: []StorageSpec{
		{Name: "local", Type: "dir", Content: []string{"iso", "images"}, TotalBytes: 100 << 30},
		{Name: "local-lvm", Type: "lvmthin", Content: []string{"images"}, TotalBytes: 100 << 30},
		{Name: "tank", Type: "zfspool", Content: []string{"images"}, TotalBytes: 100 << 30},
	}})
	c := newClient(t, s)
	for _, tc := range []struct {
		storage, efidisk, want string
	}{
		{"local-lvm", "local-lvm:1,efitype=4m,pre-enrolled-keys=0", "local-lvm:vm-%d-disk-1,efitype=4m,pre-enrolled-keys=0,size=4M"},
		{"tank", "tank:1,efitype=4m,pre-enrolled-keys=0", "tank:vm-%d-disk-1,efitype=4m,pre-enrolled-keys=0,size=1M"},
		{"local", "local:1,efitype=4m,pre-enrolled-keys=0", "local:%d/vm-%d-disk-1.qcow2,efitype=4m,pre-enrolled-keys=0,size=528K"},
		{"local-lvm", "local-lvm:1", "local-lvm:vm-%d-disk-1,size=4M"},
	} {
		vm := url.Values{}
		for k, v := range talosVM {
			vm[k] = v
		}
		id := 701 + len(s.VMIDs())
		vm.Set("vmid", fmt.Sprint(id))
		vm.Set("name", fmt.Sprintf("cp-%d", id))
		vm.Set("net0", fmt.Sprintf("virtio=BC:24:11:00:00:%02X,bridge=vmbr0,tag=20", id%256))
		vm.Set("scsi0", tc.storage+":32,discard=on")
		vm.Set("bios", "ovmf")
		vm.Set("efidisk0", tc.efidisk)
		if st := c.waitTask(c.ok("POST", "/nodes/pve/qemu", vm).(string)); st["exitstatus"] != "OK" {
			t.Fatalf("create with %s: %v", tc.efidisk, st)
		}
		conf := c.ok("GET", fmt.Sprintf("/nodes/pve/qemu/%d/config", id), nil).(map[string]any)
		want := fmt.Sprintf(tc.want, id)
		if strings.Count(tc.want, "%d") == 2 {
			want = fmt.Sprintf(tc.want, id, id)
		}
		if conf["efidisk0"] != want || !strings.Contains(fmt.Sprint(conf["scsi0"]), "-disk-0") {
			t.Errorf("%s: efidisk0 %v, scsi0 %v; want efidisk0 %s after the install disk", tc.efidisk, conf["efidisk0"], conf["scsi0"], want)
		}
		info, _ := s.VM(id)
		if len(info.Event.Disks) != 1 || info.Event.Disks[0].Slot != "scsi0" {
			t.Errorf("%s: the guest sees %+v, want only scsi0", tc.efidisk, info.Event.Disks)
		}
	}
}

// rng0 is checked as pve-qm-rng, and the host's hardware RNG needs
// Mapping.Use on /mapping/hwrng beside VM.Config.HWType (check_rng_perm).
func TestRNGOption(t *testing.T) {
	s := newSim(t, Options{ISOs: []ISOSpec{{Storage: "local", Name: "talos.iso", Size: 100 << 20}}})
	c := newClient(t, s)
	vm := url.Values{}
	for k, v := range talosVM {
		vm[k] = v
	}
	vm.Set("rng0", "source=/dev/sda")
	if a := c.do("POST", "/nodes/pve/qemu", vm); a.code != 400 || !strings.Contains(string(a.body), "rng0") {
		t.Errorf("rng0 from /dev/sda: %d %s", a.code, a.body)
	}
	s.AddToken(Token{ID: "root@pam!hw", Secret: "s", ACL: []ACE{{Path: "/", Privileges: []string{"VM.Allocate", "VM.Config.HWType", "VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network", "VM.Config.Options", "VM.Config.CDROM", "Datastore.AllocateSpace", "Datastore.Audit", "SDN.Use"}}}})
	hw := newClient(t, s)
	hw.auth = "PVEAPIToken=root@pam!hw=s"
	vm.Set("rng0", "source=/dev/hwrng")
	if a := hw.do("POST", "/nodes/pve/qemu", vm); a.code != 403 || !strings.Contains(string(a.body)+a.status, "/mapping/hwrng") {
		t.Errorf("rng0 from /dev/hwrng without Mapping.Use: %d %s", a.code, a.body)
	}
	vm.Set("rng0", "source=/dev/urandom")
	if st := hw.waitTask(hw.ok("POST", "/nodes/pve/qemu", vm).(string)); st["exitstatus"] != "OK" {
		t.Errorf("rng0 from /dev/urandom: %v", st)
	}
}
