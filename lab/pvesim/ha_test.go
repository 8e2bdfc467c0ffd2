package pvesim

import (
	"net/url"
	"strings"
	"testing"
	"time"
)

// Starting an HA-managed VM is what qemu-server 9.2.6 src/PVE/API2/Qemu.pm
// vm_start does for one (line 3631): a 'hastart' task that only sets the
// HA requested state to started and ends at once; the VM starts a CRM
// round later, from the LRM. A plain qmstart would start it at once and
// leave the requested state as a hastop left it (stopped).
func TestStartOfAnHAManagedVMIsAnHAStart(t *testing.T) {
	s := newSim(t, Options{ISOs: []ISOSpec{{Storage: "local", Name: "talos.iso", Size: 100 << 20}}})
	c := newClient(t, s)
	c.waitTask(c.ok("POST", "/nodes/pve/qemu", talosVM).(string))
	c.waitTask(c.ok("POST", "/nodes/pve/qemu/701/status/start", nil).(string))
	if err := s.SetHAManaged(701, true); err != nil {
		t.Fatal(err)
	}
	status := func() (vm, ha string) {
		st := c.ok("GET", "/nodes/pve/qemu/701/status/current", nil).(map[string]any)
		h, _ := st["ha"].(map[string]any)
		hs, _ := h["state"].(string)
		return st["status"].(string), hs
	}
	waitStatus := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if got, _ := status(); got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("VM 701 never %s", want)
			}
		}
	}
	// A stop through the API leaves the requested state stopped.
	c.waitTask(c.ok("POST", "/nodes/pve/qemu/701/status/stop", nil).(string))
	waitStatus("stopped")
	if _, ha := status(); ha != "stopped" {
		t.Fatalf("HA requested state after hastop: %q", ha)
	}

	upid := c.ok("POST", "/nodes/pve/qemu/701/status/start", url.Values{}).(string)
	if !strings.Contains(upid, ":hastart:701:") {
		t.Fatalf("start of an HA-managed VM: task %s, want a hastart", upid)
	}
	if st := c.waitTask(upid); st["exitstatus"] != "OK" {
		t.Fatalf("hastart task: %v", st)
	}
	if vm, ha := status(); vm != "stopped" || ha != "started" {
		t.Fatalf("when the hastart task ends: VM %s, HA state %q; want stopped (the LRM starts it a CRM round later) and started", vm, ha)
	}
	waitStatus("running")
}
