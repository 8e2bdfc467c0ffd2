package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/internal/testbin"
	"github.com/homelab/bootstrap/lab"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
)

// sessionMembers lists the processes whose session id is sid.
func sessionMembers(t *testing.T, sid int) []string {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		rest := strings.Fields(s[strings.LastIndex(s, ")")+2:])
		// rest[0] is the state, rest[3] the session id.
		if len(rest) > 3 && rest[3] == strconv.Itoa(sid) && rest[0] != "Z" {
			out = append(out, strconv.Itoa(pid)+" "+s[strings.Index(s, "(")+1:strings.LastIndex(s, ")")])
		}
	}
	return out
}

// TestLabUpDetachedAndDown starts a detached lab with the real binary, runs
// the talos stage far enough to start the control plane, then checks that
// `lab down` leaves no process of the lab's session behind.
func TestLabUpDetachedAndDown(t *testing.T) {
	bins := kubetest.Binaries(t)
	bin := testbin.Bootstrap(t)
	labBin := testbin.Lab(t)
	dir := filepath.Join(t.TempDir(), "lab")
	runBin := func(bin string, args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "BOOTSTRAP_LAB_BIN="+bins.Dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", filepath.Base(bin), args, err, out)
		}
		return string(out)
	}
	run := func(args ...string) string { t.Helper(); return runBin(bin, args...) }
	labCmd := func(args ...string) string { t.Helper(); return runBin(labBin, args...) }
	// The rehearsal flags: a Proxmox VE that imports disk images, with the
	// import content type, told to boot from the image (the ISO path is the
	// default every other lab test takes).
	out := labCmd("up", "--detach", "--dir", dir, "--timeout", "2m",
		"--proxmox-version", "8.4.21", "--proxmox-import", "--proxmox-boot", "image")
	if !strings.Contains(out, "lab up in the background") {
		t.Fatalf("lab up: %s", out)
	}
	rec, alive, err := lab.ReadRecord(dir)
	if err != nil || !alive {
		t.Fatalf("lab record: %v alive=%v", err, alive)
	}
	t.Cleanup(func() { lab.StopProcess(context.Background(), rec.PID, 5*time.Second) })
	// Bring the cluster up so the real control plane processes run too.
	if out := run("run", "--config", rec.Config, "--from", "provision", "--log-format", "json"); !strings.Contains(out, "new VMs boot the disk image: Proxmox VE 8.4.21 imports") {
		t.Fatalf("the lab did not boot from the disk image:\n%s", out)
	}
	members := sessionMembers(t, rec.PID)
	if len(members) < 6 {
		t.Fatalf("expected the lab and its control plane in its session, got %v", members)
	}
	if out := labCmd("status", "--dir", dir); !strings.Contains(out, "running, pid "+strconv.Itoa(rec.PID)) {
		t.Fatalf("lab status: %s", out)
	}
	if out := labCmd("down", "--dir", dir); !strings.Contains(out, "stopped") {
		t.Fatalf("lab down: %s", out)
	}
	if left := sessionMembers(t, rec.PID); len(left) != 0 {
		t.Fatalf("processes left after lab down: %v", left)
	}
	if _, _, err := lab.ReadRecord(dir); err != lab.ErrNotRunning {
		t.Fatalf("record left behind: %v", err)
	}
	if out := labCmd("status", "--dir", dir); !strings.Contains(out, "no lab runs") {
		t.Fatalf("status after down: %s", out)
	}
}
