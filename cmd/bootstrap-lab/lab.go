package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/gitsnap"
	"github.com/homelab/bootstrap/internal/proc"
	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/lab"
)

// defaultDir holds a lab's runtime files (config, token file, demo git
// tree, NFS export, state): one git-ignored directory, never beside source.
const defaultDir = ".lab/demo"

// LabUpCmd is `bootstrap-lab up`.
type LabUpCmd struct {
	Dir           string  `default:"${labdir}" help:"Directory for the lab's config, token file, demo git tree and state." type:"path"`
	ControlPlanes int     `default:"1" help:"Control-plane VMs."`
	Workers       int     `default:"0" help:"Worker VMs."`
	VIP           bool    `help:"Give the control planes a shared VIP."`
	Profile       string  `default:"instant" enum:"instant,n100" help:"Latency model of the Proxmox host and Talos nodes: instant, or n100 (an Intel N100 box)."`
	TimeScale     float64 `default:"1" help:"Multiply the profile's durations (0.1 runs n100 ten times faster)."`
	CNI           string  `default:"flannel" enum:"flannel,cilium" help:"CNI written into the lab config."`
	// The rehearsal flags: the same lab.Options the e2e tests use, so a
	// user can try a newer Proxmox VE or the disk-image boot before the
	// real host.
	ProxmoxVersion    string        `help:"pve-manager version the simulated Proxmox runs (e.g. 9.1.19; default the oldest supported): its published API schema judges every call."`
	ProxmoxImport     bool          `help:"Give the host's local storage the import content type (pve-storage 8.2.8+), where proxmox.boot auto or image keeps the Talos disk image."`
	ProxmoxBoot       string        `enum:",auto,image,iso" default:"" help:"Written as proxmox.boot: auto, image or iso (default: the config's default)."`
	ProxmoxHosts      int           `help:"Members of a simulated Proxmox VE cluster (pve1, pve2, ...); 0 or 1 is the single host pve."`
	ProxmoxHA         bool          `name:"proxmox-ha" help:"Write proxmox.ha: true and grant the token what HA resources need."`
	TalosVersion      string        `help:"Talos version the nodes boot and the config names (default bootstrap's)."`
	KubernetesVersion string        `help:"Kubernetes version the config names (default bootstrap's)."`
	BinDir            string        `env:"BOOTSTRAP_LAB_BIN" help:"Directory of the lab binaries (make lab-bins); default .lab/bin of this repository." type:"path"`
	Detach            bool          `help:"Run the lab in the background; stop it with bootstrap-lab down."`
	Timeout           time.Duration `default:"5m" help:"With --detach: how long to wait for the lab to come up."`
}

func (c *LabUpCmd) args() []string {
	a := []string{"up", "--dir", c.Dir, "--control-planes", strconv.Itoa(c.ControlPlanes), "--workers", strconv.Itoa(c.Workers),
		"--profile", c.Profile, "--time-scale", strconv.FormatFloat(c.TimeScale, 'g', -1, 64), "--cni", c.CNI, "--log-format", "json"}
	if c.VIP {
		a = append(a, "--vip")
	}
	if c.BinDir != "" {
		a = append(a, "--bin-dir", c.BinDir)
	}
	for _, f := range []struct{ name, value string }{
		{"--proxmox-version", c.ProxmoxVersion}, {"--proxmox-boot", c.ProxmoxBoot},
		{"--talos-version", c.TalosVersion}, {"--kubernetes-version", c.KubernetesVersion},
	} {
		if f.value != "" {
			a = append(a, f.name, f.value)
		}
	}
	if c.ProxmoxImport {
		a = append(a, "--proxmox-import")
	}
	if c.ProxmoxHA {
		a = append(a, "--proxmox-ha")
	}
	if c.ProxmoxHosts > 0 {
		a = append(a, "--proxmox-hosts", strconv.Itoa(c.ProxmoxHosts))
	}
	return a
}

// Run starts the lab in the foreground until Ctrl-C, or detached.
func (c *LabUpCmd) Run(ctx context.Context, a *App) error {
	if rec, alive, err := lab.ReadRecord(c.Dir); err == nil && alive {
		return config.Userf("a lab already runs in %s (pid %d, config %s): bootstrap-lab down --dir %s first", c.Dir, rec.PID, rec.Config, c.Dir)
	}
	if c.Detach {
		return c.detach(ctx, a)
	}
	log, err := a.logger()
	if err != nil {
		return err
	}
	l, err := lab.Start(ctx, lab.Options{Dir: c.Dir, ControlPlanes: c.ControlPlanes, Workers: c.Workers, VIP: c.VIP,
		Profile: c.Profile, TimeScale: c.TimeScale, CNI: c.CNI, BinDir: c.BinDir, Log: log,
		ProxmoxVersion: c.ProxmoxVersion, ProxmoxImport: c.ProxmoxImport, ProxmoxBoot: c.ProxmoxBoot,
		ProxmoxHosts: c.ProxmoxHosts, ProxmoxHA: c.ProxmoxHA, TalosVersion: c.TalosVersion, KubernetesVersion: c.KubernetesVersion})
	if err != nil {
		return err
	}
	rec := l.Record()
	if err := lab.WriteRecord(c.Dir, rec); err != nil {
		l.Stop()
		return err
	}
	fmt.Fprintf(a.Stdout, "lab up (pid %d): %d node(s), profile %s ×%g, subnet %s\n  config   %s\n  proxmox  %s\n  nfs      %s\n  charts   %s\n  flux     %s\nNext: bootstrap run --config %s --stage all\n",
		rec.PID, rec.Nodes, rec.Profile, rec.TimeScale, rec.Subnet, rec.Config, rec.Proxmox, rec.NFS, rec.Charts, rec.Flux, rec.Config)
	<-ctx.Done()
	fmt.Fprintln(a.Stderr, "stopping the lab")
	stopLabSnapshotServer(rec.Config)
	err = l.Stop()
	if rerr := lab.RemoveRecord(c.Dir); err == nil {
		err = rerr
	}
	return err
}

// detach re-runs `lab up` in its own session and waits until it is up.
func (c *LabUpCmd) detach(ctx context.Context, a *App) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return err
	}
	logPath := filepath.Join(c.Dir, "lab.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(exe, c.args()...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	child, err := proc.StartDetached(cmd)
	if err != nil {
		return err
	}
	var rec *lab.Record
	err = wait.Until(ctx, wait.Spec{What: "the detached lab to come up", Timeout: c.Timeout, Interval: 200 * time.Millisecond},
		func(context.Context) (bool, string, error) {
			select {
			case <-child.Exited:
				b, _ := os.ReadFile(logPath)
				return false, "", fmt.Errorf("the lab exited (%v):\n%s", child.Err(), tail(string(b), 20))
			default:
			}
			r, alive, err := lab.ReadRecord(c.Dir)
			if err != nil || !alive || r.PID != child.PID {
				return false, "starting", nil
			}
			rec = r
			return true, "", nil
		})
	if err != nil {
		_, _ = proc.Stop(context.Background(), child.PID, "lab", nil, 10*time.Second, zerolog.Nop())
		return err
	}
	fmt.Fprintf(a.Stdout, "lab up in the background (pid %d, log %s)\n  config %s\nNext: bootstrap run --config %s --stage all\nStop:  bootstrap-lab down --dir %s\n",
		rec.PID, logPath, rec.Config, rec.Config, c.Dir)
	return nil
}

// LabDownCmd is `bootstrap-lab down`.
type LabDownCmd struct {
	Dir   string        `default:"${labdir}" help:"The lab's directory." type:"path"`
	Grace time.Duration `default:"30s" help:"How long to wait for the lab to stop before killing it."`
}

// Run stops the detached lab and its cluster's snapshot server.
func (c *LabDownCmd) Run(ctx context.Context, a *App) error {
	rec, alive, err := lab.ReadRecord(c.Dir)
	if errors.Is(err, lab.ErrNotRunning) {
		fmt.Fprintf(a.Stdout, "no lab runs in %s\n", c.Dir)
		return nil
	}
	if err != nil {
		return err
	}
	stopLabSnapshotServer(rec.Config)
	if !alive {
		fmt.Fprintf(a.Stdout, "the lab in %s (pid %d) was not running; removed its record\n", c.Dir, rec.PID)
		return lab.RemoveRecord(c.Dir)
	}
	if _, err := lab.StopProcess(ctx, rec.PID, c.Grace); err != nil {
		return err
	}
	fmt.Fprintf(a.Stdout, "lab in %s (pid %d) stopped\n", c.Dir, rec.PID)
	return lab.RemoveRecord(c.Dir)
}

// LabStatusCmd is `bootstrap-lab status`.
type LabStatusCmd struct {
	Dir string `default:"${labdir}" help:"The lab's directory." type:"path"`
}

// Run prints the lab's record.
func (c *LabStatusCmd) Run(a *App) error {
	rec, alive, err := lab.ReadRecord(c.Dir)
	if errors.Is(err, lab.ErrNotRunning) {
		fmt.Fprintf(a.Stdout, "no lab runs in %s (start one with bootstrap-lab up)\n", c.Dir)
		return nil
	}
	if err != nil {
		return err
	}
	state := "running"
	if !alive {
		state = "not running (stale record; bootstrap-lab down cleans it up)"
	}
	fmt.Fprintf(a.Stdout, "lab in %s: %s, pid %d, since %s\n  %d node(s), profile %s ×%g, subnet %s\n  config   %s\n  proxmox  %s\n  nfs      %s\n  charts   %s\n  flux     %s\nCluster: bootstrap status --config %s\n",
		c.Dir, state, rec.PID, rec.Started.Local().Format(time.DateTime), rec.Nodes, rec.Profile, rec.TimeScale, rec.Subnet, rec.Config, rec.Proxmox, rec.NFS, rec.Charts, rec.Flux, rec.Config)
	return nil
}

// stopLabSnapshotServer stops the git snapshot server the flux stage
// started for the lab's cluster: it would outlive the lab otherwise.
func stopLabSnapshotServer(configPath string) {
	cfg, err := config.Load(configPath, func(string) (string, bool) { return "", false })
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, _ = gitsnap.Stop(ctx, cfg.Paths().StateDir, 5*time.Second, zerolog.Nop())
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
