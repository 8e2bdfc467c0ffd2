package pvesim

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"
)

func newCluster(t *testing.T, names ...string) []*Server {
	t.Helper()
	var nodes []NodeSpec
	for _, n := range names {
		nodes = append(nodes, NodeSpec{Name: n})
	}
	iso := []ISOSpec{{Storage: "local", Name: "talos.iso", Size: 100 << 20}}
	per := map[string]Options{}
	for _, n := range names {
		per[n] = Options{ISOs: iso}
	}
	ms, err := NewCluster(Options{}, nodes, per)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, m := range ms {
			_ = m.Close()
		}
	})
	return ms
}

func (c *client) waitTaskOn(node, upid string) map[string]any {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		st := c.ok("GET", "/nodes/"+node+"/tasks/"+url.PathEscape(upid)+"/status", nil).(map[string]any)
		if st["status"] == "stopped" {
			return st
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.t.Fatalf("task %s did not finish", upid)
	return nil
}

// One endpoint answers for every member (pveproxy's proxyto), the VMID
// space is the cluster's, and /nodes and /cluster/resources list every
// member with its own VMs, memory and storages.
func TestClusterMembersShareVMIDsAndListings(t *testing.T) {
	ms := newCluster(t, "pve1", "pve2", "pve3")
	c := newClient(t, ms[0])
	form := func(id string) url.Values {
		f := url.Values{}
		for k, v := range talosVM {
			f[k] = v
		}
		f.Set("vmid", id)
		return f
	}
	upid := c.ok("POST", "/nodes/pve2/qemu", form("701")).(string)
	if !strings.HasPrefix(upid, "UPID:pve2:") {
		t.Errorf("a create on pve2 through pve1 runs on pve2: %s", upid)
	}
	if st := c.waitTaskOn("pve2", upid); st["exitstatus"] != "OK" {
		t.Fatalf("create on pve2: %v", st)
	}
	if _, ok := ms[1].VM(701); !ok {
		t.Fatal("VM 701 is not on pve2")
	}
	if _, ok := ms[0].VM(701); ok {
		t.Fatal("VM 701 is also on pve1")
	}
	// The VMID is taken on every member.
	if a := c.do("POST", "/nodes/pve3/qemu", form("701")); a.code != 500 || a.msg != "unable to create VM 701 - VM 701 already exists on node 'pve2'\n" {
		t.Errorf("VMID 701 on pve3: %s %q", a.status, a.msg)
	}
	if a := c.do("GET", "/cluster/nextid", url.Values{"vmid": {"701"}}); a.code != 400 {
		t.Errorf("nextid 701: %s", a.status)
	}
	// Another member's VM is not at this member's path.
	if a := c.do("GET", "/nodes/pve1/qemu/701/status/current", nil); a.code != 500 || !strings.Contains(a.msg, "nodes/pve1/qemu-server/701.conf") {
		t.Errorf("VM 701 asked on pve1: %s %q", a.status, a.msg)
	}
	rows := c.ok("GET", "/cluster/resources", nil).([]any)
	var nodes, storages []string
	vmNode := ""
	for _, r := range rows {
		m := r.(map[string]any)
		switch m["type"] {
		case "node":
			nodes = append(nodes, m["node"].(string))
		case "storage":
			storages = append(storages, m["id"].(string))
		case "qemu":
			vmNode = m["node"].(string)
		}
	}
	if fmt.Sprint(nodes) != "[pve1 pve2 pve3]" || vmNode != "pve2" || len(storages) != 6 {
		t.Errorf("/cluster/resources: nodes %v, VM 701 on %q, storages %v", nodes, vmNode, storages)
	}
	if list := c.ok("GET", "/nodes", nil).([]any); len(list) != 3 {
		t.Errorf("/nodes lists %d members", len(list))
	}
	// Memory is per member: pve2's VM reserves pve2's memory only once it runs.
	up := c.ok("POST", "/nodes/pve2/qemu/701/status/start", nil).(string)
	c.waitTaskOn("pve2", up)
	used := func(node string) float64 {
		return c.ok("GET", "/nodes/"+node+"/status", nil).(map[string]any)["memory"].(map[string]any)["used"].(float64)
	}
	if used("pve2") <= used("pve1") {
		t.Errorf("pve2 runs a 4 GiB VM but uses %v, pve1 %v", used("pve2"), used("pve1"))
	}

	// HA resources are the cluster's: created through pve1 for pve2's VM,
	// pve2's vmstatus shows it managed.
	for sid, want := range map[string]string{
		"vm:799": "resource 'vm:799' does not exist in cluster\n",
		"799":    "unable to detect SID from VMID - VM/CT 799 does not exist\n",
	} {
		if a := c.do("POST", "/cluster/ha/resources", url.Values{"sid": {sid}}); a.code != 500 || a.msg != want {
			t.Errorf("HA resource %s: %s %q", sid, a.status, a.msg)
		}
	}
	c.ok("POST", "/cluster/ha/resources", url.Values{"sid": {"vm:701"}, "state": {"started"}})
	ha := c.ok("GET", "/nodes/pve2/qemu/701/status/current", nil).(map[string]any)["ha"].(map[string]any)
	if ha["managed"] != float64(1) || ha["state"] != "started" {
		t.Errorf("vmstatus ha of an HA resource: %v", ha)
	}
	if a := c.do("POST", "/cluster/ha/resources", url.Values{"sid": {"vm:701"}}); a.code != 500 || a.msg != "create resource failed: resource ID 'vm:701' already defined\n" {
		t.Errorf("HA resource twice: %s %q", a.status, a.msg)
	}
}

// Migration as qemu-server's migrate_vm and QemuMigrate check it: online
// for a running VM, a cdrom image on storage that is not shared blocks
// it, the VM keeps running on the target and its local disks move.
func TestMigrateRules(t *testing.T) {
	ms := newCluster(t, "pve1", "pve2")
	c := newClient(t, ms[0])
	up := c.ok("POST", "/nodes/pve1/qemu", talosVM).(string)
	c.waitTaskOn("pve1", up)
	up = c.ok("POST", "/nodes/pve1/qemu/701/status/start", nil).(string)
	c.waitTaskOn("pve1", up)

	if a := c.do("POST", "/nodes/pve1/qemu/701/migrate", url.Values{"target": {"pve1"}}); a.code != 400 || strings.TrimSpace(fmt.Sprint(a.errs["target"])) != "target is local node." {
		t.Errorf("to itself: %s %v", a.status, a.errs)
	}
	if a := c.do("POST", "/nodes/pve1/qemu/701/migrate", url.Values{"target": {"pve9"}}); a.code != 500 || a.msg != "no such cluster node 'pve9'\n" {
		t.Errorf("to no node: %s %q", a.status, a.msg)
	}
	if a := c.do("POST", "/nodes/pve1/qemu/701/migrate", url.Values{"target": {"pve2"}}); a.code != 500 || a.msg != "can't migrate running VM without --online\n" {
		t.Errorf("running, not online: %s %q", a.status, a.msg)
	}
	// The Talos ISO on 'local' (not shared) is in the cdrom drive.
	upid := c.ok("POST", "/nodes/pve1/qemu/701/migrate", url.Values{"target": {"pve2"}, "online": {"1"}, "with-local-disks": {"1"}}).(string)
	if st := c.waitTaskOn("pve1", upid); st["exitstatus"] != "can't migrate VM - check log" {
		t.Errorf("migrate with the ISO attached: %v", st)
	}
	if ms[0].VMNode(701) != "pve1" {
		t.Fatal("a failed migration moved the VM")
	}
	// Ejected, it moves, running, with its disk.
	if err := ms[0].EditVM(701, map[string]string{"ide2": "none,media=cdrom"}); err != nil {
		t.Fatal(err)
	}
	if err := ms[0].Migrate(context.Background(), 701, "pve2"); err != nil {
		t.Fatal(err)
	}
	if ms[0].VMNode(701) != "pve2" {
		t.Fatalf("VM 701 on %q after migration", ms[0].VMNode(701))
	}
	st := c.ok("GET", "/nodes/pve2/qemu/701/status/current", nil).(map[string]any)
	if st["status"] != "running" {
		t.Errorf("after an online migration the VM is %v", st["status"])
	}
	content := c.ok("GET", "/nodes/pve2/storage/local-lvm/content", nil).([]any)
	if len(content) == 0 {
		t.Error("the VM's disk did not move to pve2's local-lvm")
	}
	if left := c.ok("GET", "/nodes/pve1/storage/local-lvm/content", nil).([]any); len(left) != 0 {
		t.Errorf("pve1 still holds %v", left)
	}
}

// Without corosync quorum pmxcfs is read-only: creates, starts and
// migrations fail before their task, and /cluster/status says so; a
// standalone node has no cluster row.
func TestQuorumLoss(t *testing.T) {
	ms := newCluster(t, "pve1", "pve2")
	c := newClient(t, ms[0])
	rows := c.ok("GET", "/cluster/status", nil).([]any)
	if len(rows) != 3 || rows[0].(map[string]any)["quorate"] != float64(1) || rows[1].(map[string]any)["local"] != float64(1) {
		t.Fatalf("/cluster/status: %v", rows)
	}
	up := c.ok("POST", "/nodes/pve2/qemu", talosVM).(string)
	c.waitTaskOn("pve2", up)
	if err := ms[1].SetQuorate(false); err != nil {
		t.Fatal(err)
	}
	if st := c.ok("GET", "/cluster/status", nil).([]any)[0].(map[string]any); st["quorate"] != float64(0) {
		t.Errorf("quorum lost, /cluster/status: %v", st)
	}
	form := url.Values{}
	for k, v := range talosVM {
		form[k] = v
	}
	form.Set("vmid", "702")
	for what, a := range map[string]answer{
		"create":  c.do("POST", "/nodes/pve1/qemu", form),
		"start":   c.do("POST", "/nodes/pve2/qemu/701/status/start", nil),
		"migrate": c.do("POST", "/nodes/pve2/qemu/701/migrate", url.Values{"target": {"pve1"}}),
		"HA add":  c.do("POST", "/cluster/ha/resources", url.Values{"sid": {"vm:701"}}),
	} {
		if a.code != 500 || a.msg != "cluster not ready - no quorum?\n" {
			t.Errorf("%s without quorum: %s %q", what, a.status, a.msg)
		}
	}
	if err := ms[0].SetQuorate(true); err != nil {
		t.Fatal(err)
	}
	up = c.ok("POST", "/nodes/pve2/qemu/701/status/start", nil).(string)
	if st := c.waitTaskOn("pve2", up); st["exitstatus"] != "OK" {
		t.Errorf("start with quorum back: %v", st)
	}
	single := newSim(t, Options{})
	if err := single.SetQuorate(false); err == nil {
		t.Error("a standalone node lost quorum")
	}
	alone := newClient(t, single)
	if rows := alone.ok("GET", "/cluster/status", nil).([]any); len(rows) != 1 || rows[0].(map[string]any)["type"] != "node" {
		t.Errorf("standalone /cluster/status: %v", rows)
	}
}
