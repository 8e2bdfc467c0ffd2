package stages

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/lab/pvesim"
	"github.com/homelab/bootstrap/state"
	"github.com/homelab/bootstrap/ui"
)

const testISOURL = "https://factory.example/image/abc/v1.13.3/nocloud-amd64.iso"

var testISO = bytes.Repeat([]byte("talos"), 8192)

// fakeTalos answers TLS handshakes on <vm ip>:50000 while a VM runs, as a
// node in maintenance mode would.
type fakeTalos struct {
	t    *testing.T
	cert tls.Certificate
	mu   sync.Mutex
	lns  map[string]net.Listener
}

func newFakeTalos(t *testing.T) *fakeTalos {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeTalos{t: t, cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, lns: map[string]net.Listener{}}
	t.Cleanup(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, l := range f.lns {
			l.Close()
		}
	})
	return f
}

func (f *fakeTalos) boot(ev pvesim.VMEvent) error {
	addr := net.JoinHostPort(ev.IPv4.Addr().String(), "50000")
	l, err := tls.Listen("tcp", addr, &tls.Config{Certificates: []tls.Certificate{f.cert}})
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.lns[ev.IPv4.Addr().String()] = l
	f.mu.Unlock()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	return nil
}

func (f *fakeTalos) halt(ev pvesim.VMEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.lns[ev.IPv4.Addr().String()]; l != nil {
		l.Close()
		delete(f.lns, ev.IPv4.Addr().String())
	}
}

type lab struct {
	t    *testing.T
	sim  *pvesim.Server
	cfg  *config.Config
	net  string
	yaml string
	logs *bytes.Buffer
}

// newLab starts pvesim with a VLAN-aware bridge and a downloadable ISO, and
// writes a config for n nodes on a random 127.X.Y.0/24.
func newLab(t *testing.T, n int, o pvesim.Options) *lab {
	t.Helper()
	o.Bridges = []pvesim.BridgeSpec{{Name: "vmbr0", VLANAware: true}}
	o.RemoteFiles = map[string]pvesim.RemoteFile{testISOURL: {Content: testISO}}
	sim, err := pvesim.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	talos := newFakeTalos(t)
	sim.OnStart(talos.boot)
	sim.OnStop(talos.halt)

	netPrefix := fmt.Sprintf("127.%d.%d", 1+mrand.IntN(250), 1+mrand.IntN(250))
	sum := sha256.Sum256(testISO)
	id, secret := sim.Token()
	var nodes strings.Builder
	for i := 1; i <= n; i++ {
		role := "worker"
		if i == 1 {
			role = "controlplane"
		}
		fmt.Fprintf(&nodes, "  - {name: node-%d, role: %s, vmid: %d, ip: %s.%d, cores: 2, memoryMiB: 2048, diskGiB: 16}\n", i, role, 700+i, netPrefix, 10+i)
	}
	dir := t.TempDir()
	yaml := fmt.Sprintf(`cluster:
  name: lab
  endpoint: https://%[1]s.11:6443
  # The stock installer: these tests are not about Image Factory images.
  installImage: ghcr.io/siderolabs/installer:v1.13.3
  network: {cidr: %[1]s.0/24, gateway: %[1]s.1, nameservers: [%[1]s.1]}
proxmox:
  url: %[2]s/api2/json
  node: pve
  tokenID: %[3]s
  tlsFingerprint: "%[4]s"
  vlan: 20
  iso: {url: %[5]s, file: talos-v1.13.3-nocloud-amd64.iso, checksum: "sha256:%[6]s"}
  parallelism: 3
  taskTimeout: 30s
  bootTimeout: 10s
nodes:
%[7]sstate: {dir: %[8]s/state, talosDir: %[8]s/.talos}
`, netPrefix, sim.URL(), id, sim.Fingerprint(), testISOURL, hex.EncodeToString(sum[:]), nodes.String(), dir)
	cfg, err := config.Parse(filepath.Join(dir, "bootstrap.yaml"), []byte(yaml), func(k string) (string, bool) {
		if k == config.EnvTokenSecret {
			return secret, true
		}
		return "", false
	})
	if err != nil {
		t.Fatalf("config: %v\n%s", err, yaml)
	}
	return &lab{t: t, sim: sim, cfg: cfg, net: netPrefix, yaml: yaml, logs: &bytes.Buffer{}}
}

func (l *lab) env(dry bool, st *state.State, out *bytes.Buffer) *Env {
	log := zerolog.New(&lockedWriter{w: l.logs}).Level(zerolog.DebugLevel)
	if st == nil {
		var err error
		if st, err = state.Load(l.cfg.Paths().StateDir, "lab"); err != nil {
			l.t.Fatal(err)
		}
	}
	return &Env{Config: l.cfg, Paths: l.cfg.Paths(), State: st, Log: log, UI: ui.NewReporter(log), Out: out, DryRun: dry, Secrets: &redact.Set{}}
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

func (l *lab) provision(dry bool) (*Env, string, error) {
	var out bytes.Buffer
	env := l.env(dry, nil, &out)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := Run(ctx, env, []Stage{ProvisionStage{}}, RunInfo{ID: "test"})
	return env, out.String(), err
}

func TestProvisionStageCreatesRecordsAndRerunsWithoutChanges(t *testing.T) {
	l := newLab(t, 3, pvesim.Options{Profile: pvesim.N100(), TimeScale: 0.01})
	env, _, err := l.provision(false)
	if err != nil {
		t.Fatalf("provision: %v\n%s", err, l.logs)
	}
	if n := len(env.Changes()); n != 7 {
		t.Errorf("changes: %d %v (download + 3 creates + 3 starts)", n, env.Changes())
	}
	st, err := state.Load(l.cfg.Paths().StateDir, "lab")
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("node-%d", i)
		n := st.Outputs.Nodes[name]
		vm, ok := l.sim.VM(700 + i)
		if !ok || vm.Status != "running" {
			t.Fatalf("VM %d: %+v", 700+i, vm)
		}
		if n.VMID != 700+i || n.IP != fmt.Sprintf("%s.%d", l.net, 10+i) || n.DiskBus != "scsi" || n.MAC != vm.Event.MAC || n.MAC == "" {
			t.Errorf("state for %s: %+v (VM MAC %s)", name, n, vm.Event.MAC)
		}
	}
	if st.Stage(Provision).Status != state.OK {
		t.Errorf("stage record %+v", st.Stage(Provision))
	}

	l.sim.ResetCounters()
	env, _, err = l.provision(false)
	if err != nil {
		t.Fatalf("re-run: %v", err)
	}
	if n := l.sim.MutatingCalls(); n != 0 || len(env.Changes()) != 0 {
		t.Fatalf("re-run changed things: %v %v", l.sim.MutatingCallList(), env.Changes())
	}
	if !strings.Contains(l.logs.String(), "provision done in") || !strings.Contains(l.logs.String(), "no changes") {
		t.Errorf("re-run should report no changes")
	}
}

func TestProvisionDryRunPlansWithoutMutating(t *testing.T) {
	l := newLab(t, 2, pvesim.Options{})
	_, out, err := l.provision(true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("plan:\n%s", out)
	if n := l.sim.MutatingCalls(); n != 0 {
		t.Fatalf("dry run made %d mutating calls: %v", n, l.sim.MutatingCallList())
	}
	want := []string{
		"would download talos-v1.13.3-nocloud-amd64.iso to local from " + testISOURL + " (sha256 verified)",
		"would create VM 701 node-1 (2 cores, 2048 MiB, 16 GiB scsi disk on local-lvm, " + l.net + ".11/24 on vmbr0 VLAN 20",
		"would start VM 701 node-1",
		"would create VM 702 node-2",
		"would start VM 702 node-2",
	}
	at := 0
	for _, w := range want {
		i := strings.Index(out[at:], w)
		if i < 0 {
			t.Fatalf("plan lacks %q after position %d (config order):\n%s", w, at, out)
		}
		at += i + len(w)
	}
	if _, err := os.Stat(filepath.Join(l.cfg.Paths().StateDir, state.FileName)); err == nil {
		t.Error("a dry run must not write state")
	}
}

func TestProvisionResumesAfterAFailedStart(t *testing.T) {
	l := newLab(t, 3, pvesim.Options{})
	l.sim.InjectFault(pvesim.Fault{Kind: pvesim.FaultTaskError, Path: "/nodes/pve/qemu/702/status/start", Message: "start failed: QEMU exited with code 1", Times: 1})
	_, _, err := l.provision(false)
	if err == nil || !strings.Contains(err.Error(), "start failed: QEMU exited with code 1") {
		t.Fatalf("first run: %v", err)
	}
	st, _ := state.Load(l.cfg.Paths().StateDir, "lab")
	if st.Stage(Provision).Status != state.Failed || st.Outputs.Nodes["node-2"].VMID != 702 {
		t.Fatalf("state after failure: %+v %+v", st.Stage(Provision), st.Outputs.Nodes)
	}
	if _, _, err := l.provision(false); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if n := l.sim.TaskCount("qmcreate"); n != 3 {
		t.Errorf("creates: %d", n)
	}
	if vm, _ := l.sim.VM(702); vm.Status != "running" {
		t.Errorf("VM 702 %s", vm.Status)
	}
}

func TestProvisionRefusesForeignVMBeforeChangingAnything(t *testing.T) {
	l := newLab(t, 3, pvesim.Options{})
	if err := l.sim.SeedVM(702, map[string]string{"name": "pihole", "scsi0": "local-lvm:8"}, true); err != nil {
		t.Fatal(err)
	}
	_, _, err := l.provision(false)
	if err == nil || !strings.Contains(err.Error(), `vmid 702 is used by VM "pihole"`) {
		t.Fatalf("want refusal, got %v", err)
	}
	if got := l.sim.Count("POST", "/nodes/pve/qemu"); got != 0 {
		t.Errorf("no VM may be created when one is refused: %d creates", got)
	}
}

func TestProxmoxPrechecksFromConfig(t *testing.T) {
	l := newLab(t, 2, pvesim.Options{})
	var out bytes.Buffer
	env := l.env(false, state.New("lab"), &out)
	results := check.RunAll(context.Background(), ProvisionStage{}.Prechecks(context.Background(), env), 4)
	if len(results) < 9 {
		t.Fatalf("only %d checks", len(results))
	}
	for _, r := range results {
		if r.Status != check.Pass {
			t.Errorf("%s: %s %s", r.Name, r.Status, r.Reason)
		}
	}
	noSecret, err := config.Parse(l.cfg.File(), []byte(l.yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	env.Config = noSecret
	env.clients = nil
	results = check.RunAll(context.Background(), ProvisionStage{}.Prechecks(context.Background(), env), 4)
	if len(results) != 1 || results[0].Status != check.Fail || !strings.Contains(results[0].Reason, "PROXMOX_TOKEN_SECRET") {
		t.Errorf("missing secret: %+v", results)
	}
}

// With proxmox.ha, PVE 8 cannot keep the control planes apart: the run
// says so and sends no rule; nor can one member keep three apart on PVE 9.
func TestProvisionWarnsWhereNoRuleKeepsControlPlanesApart(t *testing.T) {
	for version, want := range map[string]string{
		"8.4.1": "control planes under HA: PVE 8.4.1 has no HA rule that keeps VMs apart",
		"9.1.2": "control planes under HA: 3 control planes on a Proxmox cluster of 1 nodes cannot each have a node of their own",
	} {
		t.Run(version, func(t *testing.T) {
			l := newLab(t, 3, pvesim.Options{Version: version})
			yaml := strings.ReplaceAll(l.yaml, "role: worker", "role: controlplane")
			yaml = strings.Replace(yaml, "  node: pve\n", "  node: pve\n  ha: true\n", 1)
			cfg, err := config.Parse(l.cfg.File(), []byte(yaml), func(k string) (string, bool) {
				_, secret := l.sim.Token()
				return secret, k == config.EnvTokenSecret
			})
			if err != nil {
				t.Fatal(err)
			}
			l.cfg = cfg
			_, out, err := l.provision(true)
			if err != nil {
				t.Fatalf("provision: %v\n%s", err, l.logs)
			}
			if !strings.Contains(out+l.logs.String(), want) {
				t.Errorf("the run does not warn %q:\n%s", want, out)
			}
			for call := range l.sim.Calls() {
				// PVE 9 reads the rules; nothing else is sent.
				if strings.Contains(call, "/cluster/ha/rules") && (version < "9" || !strings.HasPrefix(call, "GET ")) {
					t.Errorf("%s sent", call)
				}
			}
		})
	}
}
