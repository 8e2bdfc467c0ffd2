package pvesim

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
)

// TestExtraDisksAndNICs: a create with extra disks allocates a volume for
// each with its serial; netN and ipconfigN reach the start event; a bad
// serial, mtu or firewall is refused at create; an unknown bridge or an
// MTU above the bridge's only at start; a destroy frees the extra disks.
func TestExtraDisksAndNICs(t *testing.T) {
	s := newSim(t, Options{
		ISOs:    []ISOSpec{{Storage: "local", Name: "talos.iso", Size: 100 << 20}},
		Bridges: []BridgeSpec{{Name: "vmbr0", Ports: "enp1s0"}, {Name: "vmbr1", Ports: "enp2s0", MTU: 9000}},
	})
	c := newClient(t, s)
	var started VMEvent
	s.OnStart(func(ev VMEvent) error { started = ev; return nil })
	form := func(id string, extra map[string]string) url.Values {
		f := url.Values{}
		for k, v := range talosVM {
			f[k] = v
		}
		f.Set("vmid", id)
		f.Set("name", "wk-"+id)
		for k, v := range extra {
			f.Set(k, v)
		}
		return f
	}
	for k, v := range map[string]string{
		"scsi1": "local-lvm:20,serial=bad serial",
		"net1":  "virtio=BC:24:11:00:00:02,bridge=vmbr1,mtu=70000",
		"net2":  "virtio=BC:24:11:00:00:03,bridge=vmbr1,firewall=maybe",
	} {
		if a := c.do("POST", "/nodes/pve/qemu", form("780", map[string]string{k: v})); a.code != 400 || a.errs[k] == nil {
			t.Errorf("%s=%s: %s %v, want a 400 naming %s", k, v, a.status, a.errs, k)
		}
	}

	upid := c.ok("POST", "/nodes/pve/qemu", form("781", map[string]string{
		"scsi1": "local-lvm:20,discard=on,cache=writethrough,serial=bs-0123456789abcdef",
		"net1":  "virtio=BC:24:11:00:00:02,bridge=vmbr1,tag=30,mtu=9000,firewall=1", "ipconfig1": "ip=10.0.30.21/24",
	})).(string)
	if st := c.waitTask(upid); st["exitstatus"] != "OK" {
		t.Fatalf("create: %v", st)
	}
	vm, _ := s.VM(781)
	if d := vm.Config["scsi1"]; !strings.Contains(d, "serial=bs-0123456789abcdef") || !strings.Contains(d, "size=20G") || !strings.HasPrefix(d, "local-lvm:vm-781-disk-") {
		t.Errorf("scsi1 stored as %q", d)
	}
	if st := c.waitTask(c.ok("POST", "/nodes/pve/qemu/781/status/start", nil).(string)); st["exitstatus"] != "OK" {
		t.Fatalf("start: %v", st)
	}
	var serials []string
	for _, d := range started.Disks {
		serials = append(serials, d.Slot+"="+d.Serial)
	}
	if got := strings.Join(serials, " "); got != "scsi0= scsi1=bs-0123456789abcdef" {
		t.Errorf("started disks %s", got)
	}
	if len(started.NICs) != 1 || started.NICs[0].Key != "net1" || started.NICs[0].Bridge != "vmbr1" || started.NICs[0].VLAN != 30 ||
		started.NICs[0].MAC != "BC:24:11:00:00:02" || started.NICs[0].IPv4.String() != "10.0.30.21/24" {
		t.Errorf("started NICs %+v", started.NICs)
	}

	// Created, refused at start: print_netdevice_full reads the bridge's MTU.
	for id, net := range map[string]string{
		"782": "virtio=BC:24:11:00:00:04,bridge=vmbr9",
		"783": "virtio=BC:24:11:00:00:05,bridge=vmbr0,mtu=9000",
	} {
		upid := c.ok("POST", "/nodes/pve/qemu", form(id, map[string]string{"net1": net})).(string)
		if st := c.waitTask(upid); st["exitstatus"] != "OK" {
			t.Fatalf("create %s: %v", id, st)
		}
		st := c.waitTask(c.ok("POST", "/nodes/pve/qemu/"+id+"/status/start", nil).(string))
		want := map[string]string{"782": "bridge 'vmbr9' does not exist", "783": "netdev net1: MTU '9000' is bigger than the bridge MTU '1500'"}[id]
		if !strings.Contains(fmt.Sprint(st["exitstatus"]), want) {
			t.Errorf("start of %s: %v, want %q", id, st["exitstatus"], want)
		}
	}

	// destroy_vm removes every volume the VM owns, the extra disks too.
	owned := 0
	for _, v := range s.Volumes("local-lvm", "images") {
		if strings.Contains(v, "vm-781-") {
			owned++
		}
	}
	if owned < 2 {
		t.Fatalf("VM 781 owns %d volumes on local-lvm before its destroy, want its install and extra disks", owned)
	}
	if st := c.waitTask(c.ok("POST", "/nodes/pve/qemu/781/status/stop", nil).(string)); st["exitstatus"] != "OK" {
		t.Fatalf("stop: %v", st)
	}
	if st := c.waitTask(c.ok("DELETE", "/nodes/pve/qemu/781", url.Values{"purge": {"1"}, "destroy-unreferenced-disks": {"1"}}).(string)); st["exitstatus"] != "OK" {
		t.Fatalf("destroy: %v", st)
	}
	for _, v := range s.Volumes("local-lvm", "images") {
		if strings.Contains(v, "vm-781-") {
			t.Errorf("volume %s left after the destroy", v)
		}
	}
}
