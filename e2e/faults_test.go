package e2e_test

import (
	"bufio"
	"encoding/json"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/lab/pvesim"
	"github.com/homelab/bootstrap/lab/talossim"
	"github.com/homelab/bootstrap/stages"
)

// injected503 marks the 5xx answers this test injects, so that their
// retries can be told apart in the run log.
const injected503 = "proxy: backend unavailable (injected)"

// TestFaults runs the whole pipeline while pvesim fails 10 % of mutating
// calls with a 5xx and 10 % with a lock timeout (plus one of each for
// certain), every Talos node drops its connections for a moment every
// second or two through provision and talos, cp-1 refuses the first two
// bootstraps (time not in sync) and wk-1 reboots 3 s slower. The run must
// end green, and the run log must hold a retry line for every fault that
// fired: one "retrying" line per injected Proxmox error, one logged poll
// per Bootstrap the node refused, and the polls that met a dropped
// connection.
func TestFaults(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	dropper := newDropper(42)
	h := startHarness(t, e2e.Options{ControlPlanes: 3, Workers: 1, Seed: 42, OnNodeBoot: func(n *talossim.Node) {
		switch n.Hostname() {
		case "cp-1":
			n.SetFaults(talossim.Faults{BootstrapNotReady: 2})
		case "wk-1":
			n.SetFaults(talossim.Faults{ExtraRebootDelay: 3 * time.Second})
		}
		dropper.add(n)
	}})
	t.Cleanup(dropper.stop)

	pve := h.Lab.PVE
	// One of each for certain, then 10 % of each on every mutating call.
	pve.InjectFault(pvesim.Fault{Kind: pvesim.FaultLock, Method: "POST", Path: "/nodes/*/qemu", Times: 1})
	pve.InjectFault(pvesim.Fault{Kind: pvesim.FaultStatus, Status: 503, Message: injected503, Method: "POST", Path: "/nodes/*/qemu/*/status/start", Times: 1})
	for _, m := range []string{"POST", "PUT", "DELETE"} {
		pve.InjectFault(pvesim.Fault{Kind: pvesim.FaultStatus, Status: 503, Message: injected503, Method: m, Probability: 0.1})
		pve.InjectFault(pvesim.Fault{Kind: pvesim.FaultLock, Method: m, Probability: 0.1})
	}

	r, err := h.RunWith(ctx, e2e.RunOptions{OnStage: func(stage string) {
		// Postcheck's checks are single calls: the drops are for the
		// stages that wait on the nodes.
		if stages.Position(stage) > stages.Position(stages.Talos) {
			dropper.stop()
		}
	}}, "run", "--stage", "all")
	if err != nil {
		t.Fatal(err)
	}
	dropper.stop()
	if r.ExitCode != 0 {
		t.Fatalf("the run did not survive the faults:\n%s", r.Tail(60))
	}
	if err := h.PostcheckGreen(); err != nil {
		t.Fatal(err)
	}

	logs, err := h.RunLogs()
	if err != nil || len(logs) != 1 {
		t.Fatalf("run logs: %v %v", logs, err)
	}
	events := readRunLog(t, logs[0])

	// Proxmox: one retry line per fault that fired.
	fired := pve.FaultsFired()
	var proxmoxRetries, lockRetries, status503Retries int
	for _, e := range events {
		if !strings.HasPrefix(e.Message, "retrying ") {
			continue
		}
		switch {
		case strings.Contains(e.Error, "can't lock file"):
			lockRetries++
		case strings.Contains(e.Error, injected503):
			status503Retries++
		default:
			continue
		}
		proxmoxRetries++
	}
	if fired < 2 || proxmoxRetries != fired || lockRetries == 0 || status503Retries == 0 {
		t.Errorf("pvesim fired %d faults; the run log has %d retries of them (%d lock, %d 5xx): want one per fault, of both kinds",
			fired, proxmoxRetries, lockRetries, status503Retries)
	}

	// Talos: every Bootstrap cp-1 refused is a logged poll of the bootstrap wait.
	var cp1 talossim.Counters
	for _, n := range h.Lab.Talos.Nodes() {
		if n.Hostname() == "cp-1" {
			cp1 = n.Counters()
		}
	}
	refused := cp1.BootstrapCalls - cp1.Bootstraps
	// Polls not done are logged once per change of status, each line with
	// the number of polls it stands for.
	bootstrapPolls, droppedPolls := 0, 0
	for _, e := range events {
		if e.Polls == 0 {
			continue
		}
		if strings.HasPrefix(e.Wait, "etcd bootstrap on cp-1") {
			bootstrapPolls += e.Polls
		}
		if strings.Contains(e.Status, "connection refused") || strings.Contains(e.Status, "Unavailable") || strings.Contains(e.Status, "error reading from server") {
			droppedPolls += e.Polls
		}
	}
	if cp1.Bootstraps != 1 || refused < 2 || bootstrapPolls < refused {
		t.Errorf("cp-1: %d Bootstrap calls, %d accepted; %d refused ones, %d logged polls of the bootstrap wait: want every refusal logged",
			cp1.BootstrapCalls, cp1.Bootstraps, refused, bootstrapPolls)
	}
	drops := dropper.count.Load()
	if drops < 4 || droppedPolls == 0 {
		t.Errorf("%d connection drops, %d logged polls that met a refused connection", drops, droppedPolls)
	}
	for _, n := range h.Lab.Talos.Nodes() {
		if c := n.Counters(); c.Applies != 1 || c.Reboots < 1 {
			t.Errorf("%s: %d applies, %d reboots: want one install each", n.Hostname(), c.Applies, c.Reboots)
		}
	}
	if n := h.Lab.Talos.Bootstraps(); n != 1 {
		t.Errorf("%d etcd bootstraps", n)
	}
	t.Logf("green in %s through %d Proxmox faults (%d lock, %d 5xx), %d Bootstrap refusals, %d connection drops (%d polls met one), a 3s slower reboot",
		r.Wall.Round(100*time.Millisecond), fired, lockRetries, status503Retries, refused, drops, droppedPolls)
}

type runLogEvent struct {
	Level   string `json:"level"`
	Message string `json:"message"`
	Error   string `json:"error"`
	Wait    string `json:"wait"`
	Status  string `json:"status"`
	Stage   string `json:"stage"`
	Polls   int    `json:"polls"`
}

func readRunLog(t *testing.T, path string) []runLogEvent {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []runLogEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 8<<20)
	for sc.Scan() {
		var e runLogEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("%s: %v: %s", path, err, sc.Text())
		}
		out = append(out, e)
	}
	return out
}

// dropper makes every node it is given refuse connections for 0.2–0.8 s
// at random moments, 1–2.5 s apart, until stopped.
type dropper struct {
	mu      sync.Mutex
	rng     *rand.Rand
	done    chan struct{}
	stopped bool
	wg      sync.WaitGroup
	count   atomic.Int32
}

func newDropper(seed uint64) *dropper {
	return &dropper{rng: rand.New(rand.NewPCG(seed, 0x64726f70)), done: make(chan struct{})}
}

func (d *dropper) rand(lo, hi time.Duration) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return lo + time.Duration(d.rng.Int64N(int64(hi-lo)))
}

func (d *dropper) add(n *talossim.Node) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		for {
			select {
			case <-d.done:
				return
			case <-time.After(d.rand(time.Second, 2500*time.Millisecond)):
			}
			f := n.Faults()
			f.RefuseConnections = true
			n.SetFaults(f)
			d.count.Add(1)
			select {
			case <-d.done:
			case <-time.After(d.rand(200*time.Millisecond, 800*time.Millisecond)):
			}
			f = n.Faults()
			f.RefuseConnections = false
			n.SetFaults(f)
		}
	}()
}

func (d *dropper) stop() {
	d.mu.Lock()
	if !d.stopped {
		d.stopped = true
		close(d.done)
	}
	d.mu.Unlock()
	d.wg.Wait()
}
