package stages

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"k8s.io/client-go/kubernetes"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/lab/chartrepo"
	"github.com/homelab/bootstrap/lab/fluxmanifests"
	labkube "github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
	"github.com/homelab/bootstrap/lab/nfs"
	"github.com/homelab/bootstrap/lab/nfsprovisioner"
	"github.com/homelab/bootstrap/state"
	"github.com/homelab/bootstrap/talos"
	"github.com/homelab/bootstrap/ui"
)

// kubeLab is a converged-cluster stand-in for the stages after talos: a
// real control plane with registered nodes, the lab NFS server, the lab
// chart repository, the NFS provisioner stand-in and, on request, the real
// Flux controllers with a manifests download and a git work tree.
type kubeLab struct {
	t     *testing.T
	dir   string
	cfg   *config.Config
	st    *state.State
	kube  *labkube.Cluster
	nfs   *nfs.Server
	repo  *chartrepo.Repo
	prov  *nfsprovisioner.StandIn
	flux  *fluxmanifests.Server
	git   string
	out   bytes.Buffer
	nodes []string
}

type kubeLabOptions struct {
	flux  bool
	cni   string
	extra string // appended to the config YAML
}

func newKubeLab(t *testing.T, o kubeLabOptions) *kubeLab {
	t.Helper()
	l := &kubeLab{t: t, dir: t.TempDir(), nodes: []string{"cp-1", "wk-1"}}
	l.kube = kubetest.Start(t, labkube.Options{Flux: o.flux, ScheduleOnControlPlanes: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var err error
	if l.nfs, err = nfs.Start(nfs.Options{ExportPath: "/export/k8s", Log: kubetest.Logger(t)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.nfs.Close() })
	ciliumChart, err := l.kube.Binaries().CiliumChart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.repo, err = chartrepo.Start(chartrepo.Options{Log: kubetest.Logger(t), Charts: []string{ciliumChart}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.repo.Close() })
	if l.prov, err = nfsprovisioner.Start(context.Background(), nfsprovisioner.Options{Client: l.kube.Client(), NFSPort: l.nfs.Port(), Log: kubetest.Logger(t), PollInterval: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.prov.Stop)

	fluxYAML := "  repo: https://git.invalid/homelab.git\n"
	if o.flux {
		src, err := fluxmanifests.SourcesFromBinaries(ctx, l.kube.Binaries())
		if err != nil {
			t.Fatal(err)
		}
		tarball, err := fluxmanifests.Build(src)
		if err != nil {
			t.Fatal(err)
		}
		if l.flux, err = fluxmanifests.Serve(fluxmanifests.ServeOptions{Version: config.DefaultFluxVersion, Tarball: tarball}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.flux.Close() })
		l.git = filepath.Join(l.dir, "homelab")
		os.MkdirAll(filepath.Join(l.git, "infra"), 0o755)
		os.WriteFile(filepath.Join(l.git, "infra", "kustomization.yaml"), []byte("resources: [namespace.yaml]\n"), 0o644)
		os.WriteFile(filepath.Join(l.git, "infra", "namespace.yaml"), []byte("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: from-git\n"), 0o644)
		if out, err := exec.Command("git", "-C", l.git, "init", "-q", "-b", "main").CombinedOutput(); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		port := freeLoopbackPort(t)
		fluxYAML = fmt.Sprintf("  manifests: %s\n  timeout: 2m\n  localSnapshot:\n    enabled: true\n    source: homelab\n    listen: 127.0.0.1:%d\n    url: http://127.0.0.1:%d/homelab.git\n    refresh: 0s\n", l.flux.URL(), port, port)
	}
	cni := o.cni
	if cni == "" {
		cni = "flannel"
	}
	host := strings.TrimPrefix(strings.Split(l.kube.Server(), ":")[1], "//")
	yaml := fmt.Sprintf(`cluster:
  name: lab
  endpoint: %[1]s
  # The stock installer: these tests are not about Image Factory images.
  installImage: ghcr.io/siderolabs/installer:v1.13.3
  network: {cidr: %[2]s/24, gateway: %[3]s, nameservers: [%[3]s]}
proxmox:
  url: https://pve.invalid:8006/api2/json
  tokenID: root@pam!lab
  insecure: true
  iso: {file: talos.iso}
nodes:
  - {name: cp-1, role: controlplane, vmid: 701, ip: %[4]s, cores: 2, memoryMiB: 4096, diskGiB: 32}
  - {name: wk-1, role: worker, vmid: 711, ip: %[5]s, cores: 2, memoryMiB: 4096, diskGiB: 32}
storage:
  nfs:
    server: %[6]s
    path: /export/k8s
    chartRepo: %[7]s
    probe: {mountPort: %[8]d, nfsPort: %[8]d, timeout: 5s}
cni:
  name: %[9]s
  cilium: {chartRepo: %[7]s}
postcheck:
  pvcTimeout: 30s
  timeout: 2m
flux:
%[10]s%[11]s`, l.kube.Server(), prefixOf(host), gatewayOf(host), host, siblingIP(host, 21), l.nfs.Host(), l.repo.URL(), l.nfs.Port(), cni, fluxYAML, o.extra)
	path := filepath.Join(l.dir, "bootstrap.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	if l.cfg, err = config.Load(path, func(string) (string, bool) { return "", false }); err != nil {
		t.Fatalf("lab config: %v\n%s", err, yaml)
	}
	kc, err := l.kube.Kubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	p := l.cfg.Paths()
	os.MkdirAll(p.TalosDir, 0o700)
	if err := os.WriteFile(p.Kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	l.st = state.New("lab")
	if cni == "cilium" {
		// The infra stage reads KubePrism from the rendered node configs,
		// which the talos stage writes before it in a real run.
		opts, err := talosGenerateOptions(l.env(false))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := talos.Generate(opts); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range l.nodes {
		role := labkube.RoleWorker
		if i == 0 {
			role = labkube.RoleControlPlane
		}
		if err := l.kube.RegisterNode(ctx, n, l.cfg.Nodes[i].IP, role); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.kube.WaitNodesReady(ctx, l.nodes, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *kubeLab) client() kubernetes.Interface { return l.kube.Client() }

// env returns a fresh Env for one stage run; its log goes to the test log.
func (l *kubeLab) env(dryRun bool) *Env {
	log := zerolog.New(zerolog.NewTestWriter(l.t)).With().Timestamp().Logger()
	l.out.Reset()
	return &Env{Config: l.cfg, Paths: l.cfg.Paths(), State: l.st, Log: log, UI: ui.NewReporter(log), Out: &l.out,
		DryRun: dryRun, Secrets: &redact.Set{}, Now: time.Now}
}

func prefixOf(ip string) string {
	parts := strings.Split(ip, ".")
	return strings.Join(append(parts[:3], "0"), ".")
}

func gatewayOf(ip string) string {
	parts := strings.Split(ip, ".")
	return strings.Join(append(parts[:3], "254"), ".")
}

func siblingIP(ip string, last int) string {
	parts := strings.Split(ip, ".")
	return fmt.Sprintf("%s.%d", strings.Join(parts[:3], "."), last)
}

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
