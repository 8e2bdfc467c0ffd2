// Command bench measures bootstrap end to end against the lab and prints
// the table kept in README: for each cluster size, the wall time of
// `bootstrap run --stage all` against the critical path of the latency
// profile, the same with parallelism 1 (one node after another), the
// converged re-run, the postcheck alone, the peak RSS of the process and
// the Proxmox and Talos API calls it made; for 3-control-plane sizes also
// the etcd backup and the restore of a lost cluster to a green postcheck.
//
// For the sizes in -boot-sizes it also brings the cluster up with the VMs
// booted from the factory's disk image (proxmox.boot auto on a PVE 8.4 host
// whose storage holds imports), beside the ISO run: both modes' wall and
// critical path, here and projected to the real box.
//
//	go run ./e2e/cmd/bench -binary bin/bootstrap [-scale 0.1] [-sizes 1,3+2,3+3,3+12] [-boot-sizes 3+3,3+12]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/Masterminds/semver/v3"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/homelab/bootstrap/backup"
	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/factory"
	"github.com/homelab/bootstrap/lab"
	"github.com/homelab/bootstrap/lab/pvesim"
	"github.com/homelab/bootstrap/lab/talossim"
	"github.com/homelab/bootstrap/stages"
)

type options struct {
	binary, profile, dir, readme string
	talosVersion                 string
	scale                        float64
	sizes, bootSizes             []size
	sequential, keep, verbose    bool
}

type size struct {
	controlPlanes, workers int
}

func (s size) String() string {
	if s.workers == 0 {
		return strconv.Itoa(s.controlPlanes)
	}
	return fmt.Sprintf("%d+%d", s.controlPlanes, s.workers)
}

// nodesPerHost is how many of the lab's 2 GiB VMs one simulated Proxmox
// host (the reference box: 16 GiB) takes with room for itself.
const nodesPerHost = 6

// hosts is the number of Proxmox members a size runs on: a cluster larger
// than one box holds is spread over several, as it would be on hardware.
func (s size) hosts() int { return (s.controlPlanes + s.workers + nodesPerHost - 1) / nodesPerHost }

// label names the size in the table, with its Proxmox members when more
// than one.
func (s size) label() string {
	if h := s.hosts(); h > 1 {
		return fmt.Sprintf("%s (%d Proxmox hosts)", s, h)
	}
	return s.String()
}

func (s size) nodes() int { return s.controlPlanes + s.workers }

func parseSizes(v string) ([]size, error) {
	var out []size
	for _, f := range strings.Split(v, ",") {
		cp, wk, _ := strings.Cut(strings.TrimSpace(f), "+")
		c, err := strconv.Atoi(cp)
		if err != nil || c < 1 {
			return nil, fmt.Errorf("size %q: want <control planes>[+<workers>]", f)
		}
		w := 0
		if wk != "" {
			if w, err = strconv.Atoi(wk); err != nil {
				return nil, fmt.Errorf("size %q: want <control planes>[+<workers>]", f)
			}
		}
		out = append(out, size{c, w})
	}
	return out, nil
}

// dropPageCache writes out the binary and drops it from the page cache, so
// the runs read it as they read an installed one. A file the linker has
// just written stays cached in the large pieces it was written in, and a
// process maps its code in those pieces: 72 MiB resident at start instead
// of 60 (this machine, Linux 6.18, ext4), which the peak RSS column would
// count as the product's.
func dropPageCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("writing out %s: %w", path, err)
	}
	return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

func main() {
	var o options
	var sizes, bootSizes string
	flag.StringVar(&o.binary, "binary", "bin/bootstrap", "bootstrap binary to measure")
	flag.StringVar(&o.profile, "profile", "n100", "latency profile of the simulated host and nodes")
	flag.StringVar(&o.talosVersion, "talos-version", "v1.14.1", "Talos version the nodes boot and the config names (the newest bootstrap supports)")
	flag.Float64Var(&o.scale, "scale", 0.1, "time scale of the profile (0.1: ten times faster than the real box)")
	flag.StringVar(&sizes, "sizes", "1,3+2,3+3,3+12", "cluster sizes: control planes[+workers], comma separated")
	flag.StringVar(&bootSizes, "boot-sizes", "3+3,3+12", "sizes also brought up from the factory's disk image (\"\" for none)")
	flag.BoolVar(&o.sequential, "sequential", true, "also measure parallelism 1 (the one-node-after-another reference)")
	flag.StringVar(&o.dir, "dir", "", "work directory (default: a temporary one, removed unless -keep)")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (labs, state, run logs)")
	flag.BoolVar(&o.verbose, "v", false, "print the critical path and stage timings of every run")
	flag.StringVar(&o.readme, "readme", "", "replace the table between the bench markers in this README")
	flag.Parse()
	// The lab runs in this process: keep client-go's and the NFS server's
	// own loggers off the table.
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	log.SetOutput(io.Discard)
	var err error
	if o.sizes, err = parseSizes(sizes); err != nil {
		fatal(err)
	}
	if bootSizes != "" {
		if o.bootSizes, err = parseSizes(bootSizes); err != nil {
			fatal(err)
		}
	}
	if o.binary, err = filepath.Abs(o.binary); err != nil {
		fatal(err)
	}
	if _, err := os.Stat(o.binary); err != nil {
		fatal(fmt.Errorf("%v (make build first)", err))
	}
	if err := dropPageCache(o.binary); err != nil {
		fatal(err)
	}
	if o.dir == "" {
		if o.dir, err = os.MkdirTemp("", "bootstrap-bench-"); err != nil {
			fatal(err)
		}
		if !o.keep {
			defer os.RemoveAll(o.dir)
		}
	}
	table, err := bench(context.Background(), o, os.Stderr)
	if err != nil {
		fatal(err)
	}
	fmt.Print(table)
	if o.readme != "" {
		if err := updateReadme(o.readme, table); err != nil {
			fatal(err)
		}
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

// row is one cluster size's measurements.
type row struct {
	size                      size
	wall, bringUp             time.Duration
	crit                      e2e.CriticalPath
	critIn                    e2e.PathInput
	seqBringUp                time.Duration
	seqCrit                   e2e.CriticalPath
	rerun                     time.Duration
	rerunMutations            int
	rerunWhat                 []string
	postcheck, pvcBind        time.Duration
	rssKiB                    int64
	proxmoxCalls, talosCalls  int
	stageTimes, seqStageTimes map[string]time.Duration
	// Disaster recovery, measured on 3-control-plane sizes: one backup,
	// every VM destroyed and provisioned again, the restore to green.
	backup, rebuild, restore time.Duration
	restoreStages            map[string]time.Duration
	restoreCrit              e2e.CriticalPath
	// Talos upgrade, measured on 3-control-plane sizes: one node at a
	// time against its critical path.
	upgrade, upgradeStage time.Duration
	upgradeCrit           e2e.CriticalPath
	// Boot from the disk image (sizes in -boot-sizes): the bring-up to
	// Flux synced against its critical path.
	imageBringUp time.Duration
	imageCrit    e2e.CriticalPath
	imageCritIn  e2e.PathInput
}

func bench(ctx context.Context, o options, progress io.Writer) (string, error) {
	pveProfile, err := pvesim.ProfileByName(o.profile)
	if err != nil {
		return "", err
	}
	talosProfile, err := talossim.ProfileByName(o.profile)
	if err != nil {
		return "", err
	}
	started := time.Now()
	var rows []row
	for _, sz := range o.sizes {
		r := row{size: sz}
		fmt.Fprintf(progress, "bench %s: parallel run…\n", sz)
		if err := measureParallel(ctx, o, &r, pveProfile, talosProfile); err != nil {
			return "", fmt.Errorf("%s: %w", sz, err)
		}
		// A size spread over several hosts is the scaling row: one node
		// after another would take minutes and measure nothing new.
		if o.sequential && sz.hosts() == 1 {
			fmt.Fprintf(progress, "bench %s: parallelism 1…\n", sz)
			if err := measureSequential(ctx, o, &r, pveProfile, talosProfile); err != nil {
				return "", fmt.Errorf("%s parallelism 1: %w", sz, err)
			}
		}
		if slices.Contains(o.bootSizes, sz) {
			fmt.Fprintf(progress, "bench %s: from the disk image…\n", sz)
			if err := measureImage(ctx, o, &r, pveProfile, talosProfile); err != nil {
				return "", fmt.Errorf("%s from the disk image: %w", sz, err)
			}
		}
		if o.verbose {
			fmt.Fprintf(progress, "  critical path %s = %s\n  stages %s\n", r.crit.Total.Round(10*time.Millisecond), r.crit, stageLine(r.stageTimes))
			if r.imageBringUp > 0 {
				fmt.Fprintf(progress, "  from the disk image: critical path %s = %s\n", r.imageCrit.Total.Round(10*time.Millisecond), r.imageCrit)
			}
			if r.seqBringUp > 0 {
				fmt.Fprintf(progress, "  parallelism 1: critical path %s = %s\n  stages %s\n", r.seqCrit.Total.Round(10*time.Millisecond), r.seqCrit, stageLine(r.seqStageTimes))
			}
		}
		rows = append(rows, r)
	}
	return render(o, rows, time.Since(started)), nil
}

func stageLine(d map[string]time.Duration) string {
	var parts []string
	for _, s := range stages.Order {
		parts = append(parts, fmt.Sprintf("%s %s", s, d[s].Round(10*time.Millisecond)))
	}
	return strings.Join(parts, ", ")
}

func startLab(ctx context.Context, o options, sz size, name string) (*e2e.Harness, func(), error) {
	return startLabWith(ctx, o, sz, name, e2e.Options{})
}

// imageLab is what a bring-up from the disk image needs of the lab: a
// release that imports disk images (PVE 8.4) and a storage whose content
// types include import.
var imageLab = e2e.Options{ProxmoxVersion: "8.4.21", ProxmoxImport: true}

// startLabWith starts a lab of size sz; extra gives the Proxmox version
// and import storage.
func startLabWith(ctx context.Context, o options, sz size, name string, extra e2e.Options) (*e2e.Harness, func(), error) {
	dir := filepath.Join(o.dir, sz.String()+"-"+name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "lab.log"))
	if err != nil {
		return nil, nil, err
	}
	h, err := e2e.Start(ctx, e2e.Options{Dir: dir, Binary: o.binary, ControlPlanes: sz.controlPlanes, Workers: sz.workers, ProxmoxHosts: sz.hosts(),
		Profile: o.profile, TimeScale: o.scale, KeepKubeData: o.keep, Log: zerolog.New(logFile).With().Timestamp().Logger(), TalosVersion: o.talosVersion,
		ProxmoxVersion: extra.ProxmoxVersion, ProxmoxImport: extra.ProxmoxImport})
	if err != nil {
		logFile.Close()
		return nil, nil, err
	}
	return h, func() { h.Stop(); logFile.Close() }, nil
}

// converge runs the whole pipeline and returns the run, its stage times
// and the critical path for the lab's settings.
func converge(ctx context.Context, h *e2e.Harness, pp pvesim.Profile, tp talossim.Profile, scale float64) (*e2e.Result, map[string]time.Duration, e2e.PathInput, error) {
	res, err := h.Run(ctx, "run", "--stage", "all")
	if err != nil {
		return nil, nil, e2e.PathInput{}, err
	}
	if res.ExitCode != 0 {
		return nil, nil, e2e.PathInput{}, fmt.Errorf("run failed:\n%s", res.Tail(30))
	}
	if err := h.PostcheckGreen(); err != nil {
		return nil, nil, e2e.PathInput{}, err
	}
	_, durs, err := h.StageTimes()
	if err != nil {
		return nil, nil, e2e.PathInput{}, err
	}
	kubeStart, err := h.KubeStartTime()
	if err != nil {
		return nil, nil, e2e.PathInput{}, err
	}
	network, err := h.NetworkStartTime()
	if err != nil {
		return nil, nil, e2e.PathInput{}, err
	}
	flux, err := h.FluxReconcileTime()
	if err != nil {
		return nil, nil, e2e.PathInput{}, err
	}
	cfg := h.Config()
	in := e2e.PathInput{
		Proxmox: pp, Talos: tp, Scale: scale, ISOBytes: lab.ISOBytes, ISODownload: h.ISODownloadTime(),
		Image: h.Lab.Factory.Counts().ImageDownloads > 0, ImageVirtualBytes: factory.DiskImageBytes(cfg.Cluster.TalosVersion),
		Nodes: len(cfg.Nodes), ControlPlanes: len(cfg.ControlPlanes()),
		ProxmoxParallelism: cfg.Proxmox.Parallelism, TalosParallelism: cfg.Cluster.Parallelism,
		KubeStart: kubeStart, CNI: network, FluxReconcile: flux, MirrorPods: h.MirrorSyncTime(),
	}
	return res, durs, in, nil
}

func measureParallel(ctx context.Context, o options, r *row, pp pvesim.Profile, tp talossim.Profile) error {
	h, stop, err := startLab(ctx, o, r.size, "parallel")
	if err != nil {
		return err
	}
	defer stop()
	res, durs, in, err := converge(ctx, h, pp, tp, o.scale)
	if err != nil {
		return err
	}
	r.wall, r.bringUp, r.critIn, r.stageTimes, r.rssKiB = res.Wall, res.Wall-durs[stages.Postcheck], in, durs, res.MaxRSSKiB
	r.crit = e2e.ComputeCriticalPath(in)
	c1, err := h.Counters(ctx)
	if err != nil {
		return err
	}
	r.proxmoxCalls, r.talosCalls = c1.ProxmoxCalls, c1.TalosCalls

	again, err := h.Run(ctx, "run", "--stage", "all")
	if err != nil {
		return err
	}
	if again.ExitCode != 0 {
		return fmt.Errorf("re-run failed:\n%s", again.Tail(30))
	}
	c2, err := h.Counters(ctx)
	if err != nil {
		return err
	}
	r.rerun = again.Wall
	r.rerunMutations, r.rerunWhat = e2e.RunMutations(c1, c2)
	r.rssKiB = max(r.rssKiB, again.MaxRSSKiB)

	pc, err := h.Run(ctx, "run", "--stage", "postcheck")
	if err != nil {
		return err
	}
	if pc.ExitCode != 0 {
		return fmt.Errorf("postcheck failed:\n%s", pc.Tail(30))
	}
	r.postcheck = pc.Wall
	r.rssKiB = max(r.rssKiB, pc.MaxRSSKiB)
	if r.pvcBind, err = e2e.PVCBindTime(pc.Stdout); err != nil {
		return err
	}
	// The drills run on the one-host 3-control-plane sizes.
	if r.size.controlPlanes == 3 && r.size.hosts() == 1 {
		if err := measureRestore(ctx, h, r); err != nil {
			return fmt.Errorf("restore drill: %w", err)
		}
		if err := measureUpgrade(ctx, h, r, tp, o.scale); err != nil {
			return fmt.Errorf("Talos upgrade: %w", err)
		}
	}
	return nil
}

// measureUpgrade times the talos stage taking every node to the next Talos
// patch release (one node at a time), against its critical path.
func measureUpgrade(ctx context.Context, h *e2e.Harness, r *row, tp talossim.Profile, scale float64) error {
	cfg := h.Config()
	from := cfg.Cluster.TalosVersion
	v, err := semver.NewVersion(strings.TrimPrefix(from, "v"))
	if err != nil {
		return err
	}
	to := fmt.Sprintf("v%d.%d.%d", v.Major(), v.Minor(), v.Patch()+1)
	if err := h.EditConfig(func(s string) (string, error) {
		return strings.Replace(s, "talosVersion: "+from+"\n", "talosVersion: "+to+"\n", 1), nil
	}); err != nil {
		return err
	}
	res, err := h.Run(ctx, "run", "--stage", "talos")
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("upgrade to %s failed:\n%s", to, res.Tail(30))
	}
	_, durs, err := h.StageTimes()
	if err != nil {
		return err
	}
	cfg = h.Config()
	r.upgrade, r.upgradeStage = res.Wall, durs[stages.Talos]
	r.upgradeCrit = e2e.UpgradeCriticalPath(tp, scale, len(cfg.ControlPlanes()), len(cfg.Nodes)-len(cfg.ControlPlanes()), cfg.Cluster.UpgradeParallelism)
	return nil
}

// measureRestore times `bootstrap backup`, then the loss of every VM with
// its disks (destroy, provision again) and `bootstrap restore` until the
// postcheck passes.
func measureRestore(ctx context.Context, h *e2e.Harness, r *row) error {
	step := func(args ...string) (*e2e.Result, error) {
		res, err := h.Run(ctx, args...)
		if err != nil {
			return nil, err
		}
		if res.ExitCode != 0 {
			return nil, fmt.Errorf("%s failed:\n%s", strings.Join(args, " "), res.Tail(30))
		}
		return res, nil
	}
	b, err := step("backup")
	if err != nil {
		return err
	}
	r.backup = b.Wall
	snap, _, err := backup.Newest(filepath.Join(h.Paths().StateDir, "etcd"))
	if err != nil {
		return err
	}
	for _, args := range [][]string{{"destroy", "--yes"}, {"run", "--stage", "provision"}} {
		res, err := step(args...)
		if err != nil {
			return err
		}
		r.rebuild += res.Wall
	}
	res, err := step("restore", "--from", snap)
	if err != nil {
		return err
	}
	r.restore = res.Wall
	if err := h.PostcheckGreen(); err != nil {
		return err
	}
	if _, r.restoreStages, err = h.StageTimes(); err != nil {
		return err
	}
	// The restore's own path: the VMs wait in maintenance mode, so it
	// starts at the config apply; the node and etcd parts are the
	// bring-up's, Flux's is this restore's own (the restored objects are
	// asked to reconcile, by controllers that start on the new cluster).
	in := r.critIn
	in.Provisioned = true
	if in.FluxReconcile, err = h.FluxReconcileTime(); err != nil {
		return fmt.Errorf("the restore's Flux reconcile: %w", err)
	}
	in.MirrorPods = h.MirrorSyncTime()
	r.restoreCrit = e2e.ComputeCriticalPath(in)
	return nil
}

// measureImage brings the size up from the factory's disk image and checks
// that it was: every node booted from it, none installed or rebooted.
func measureImage(ctx context.Context, o options, r *row, pp pvesim.Profile, tp talossim.Profile) error {
	h, stop, err := startLabWith(ctx, o, r.size, "image", imageLab)
	if err != nil {
		return err
	}
	defer stop()
	res, durs, in, err := converge(ctx, h, pp, tp, o.scale)
	if err != nil {
		return err
	}
	if !in.Image {
		return errors.New("the run did not download the disk image")
	}
	for _, n := range h.Lab.Talos.Nodes() {
		if c := n.Counters(); !n.BootedFromImage() || c.Installs != 0 || c.Reboots != 0 {
			return fmt.Errorf("node %s: booted from the image %v, %d installs, %d reboots", n.IP(), n.BootedFromImage(), c.Installs, c.Reboots)
		}
	}
	r.imageBringUp, r.imageCrit, r.imageCritIn = res.Wall-durs[stages.Postcheck], e2e.ComputeCriticalPath(in), in
	return nil
}

func measureSequential(ctx context.Context, o options, r *row, pp pvesim.Profile, tp talossim.Profile) error {
	h, stop, err := startLab(ctx, o, r.size, "parallelism1")
	if err != nil {
		return err
	}
	defer stop()
	if err := h.SetParallelism(1, 1); err != nil {
		return err
	}
	res, durs, in, err := converge(ctx, h, pp, tp, o.scale)
	if err != nil {
		return err
	}
	r.seqBringUp, r.seqCrit, r.seqStageTimes = res.Wall-durs[stages.Postcheck], e2e.ComputeCriticalPath(in), durs
	return nil
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

func render(o options, rows []row, took time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Profile %s at time scale %g, Talos %s (%d CPUs, %s/%s); bench took %s.\n\n", o.profile, o.scale, o.talosVersion, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, took.Round(time.Second))
	b.WriteString("| nodes | wall to Flux synced | critical path | ratio | overhead | parallelism 1: wall | its critical path | ratio | re-run | re-run mutations | postcheck (PVC bind) | peak RSS | Proxmox calls (per node) | Talos calls (per node) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		seq, seqCrit, seqRatio := "–", "–", "–"
		if r.seqBringUp > 0 {
			seq, seqCrit = secs(r.seqBringUp), secs(r.seqCrit.Total)
			seqRatio = fmt.Sprintf("%.2f", r.seqBringUp.Seconds()/r.seqCrit.Total.Seconds())
		}
		muts := strconv.Itoa(r.rerunMutations)
		if len(r.rerunWhat) > 0 {
			muts += " (" + strings.Join(r.rerunWhat, ", ") + ")"
		}
		perNode := func(calls int) string { return fmt.Sprintf("%d (%.1f)", calls, float64(calls)/float64(r.size.nodes())) }
		fmt.Fprintf(&b, "| %s | %s | %s | %.2f | %s | %s | %s | %s | %s | %s | %s (%s) | %d MiB | %s | %s |\n",
			r.size.label(), secs(r.bringUp), secs(r.crit.Total), r.bringUp.Seconds()/r.crit.Total.Seconds(), secs(r.bringUp-r.crit.Total), seq, seqCrit, seqRatio,
			secs(r.rerun), muts, secs(r.postcheck), r.pvcBind.Round(10*time.Millisecond), r.rssKiB>>10, perNode(r.proxmoxCalls), perNode(r.talosCalls))
	}
	for _, r := range rows {
		if r.restore == 0 {
			continue
		}
		toSynced := r.restore - r.restoreStages[stages.Postcheck]
		fmt.Fprintf(&b, "\nDisaster recovery, %s: `bootstrap backup` %s; every VM destroyed and provisioned again %s; `bootstrap restore` to a green postcheck %s (talos %s, flux %s, postcheck %s): to Flux synced %s against a critical path of %s = %s; ratio %.2f.\n",
			r.size, secs(r.backup), secs(r.rebuild), secs(r.restore),
			secs(r.restoreStages[stages.Talos]), secs(r.restoreStages[stages.Flux]), secs(r.restoreStages[stages.Postcheck]),
			secs(toSynced), secs(r.restoreCrit.Total), r.restoreCrit, toSynced.Seconds()/r.restoreCrit.Total.Seconds())
	}
	for _, r := range rows {
		if r.upgrade == 0 {
			continue
		}
		fmt.Fprintf(&b, "\nTalos upgrade, %s (next patch release, one node at a time): %s (talos stage %s) against a critical path of %s = %s; ratio %.2f.\n",
			r.size, secs(r.upgrade), secs(r.upgradeStage), secs(r.upgradeCrit.Total), r.upgradeCrit, r.upgrade.Seconds()/r.upgradeCrit.Total.Seconds())
	}
	renderBootModes(&b, o, rows)
	b.WriteString("\nStage times (parallel run):\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "- %s: %s\n", r.size, stageLine(r.stageTimes))
	}
	if len(rows) > 0 {
		last := rows[len(rows)-1]
		fmt.Fprintf(&b, "\nCritical path of %s: %s.\n", last.size, last.crit)
		if o.scale != 1 {
			// The overhead is the product's own work and waits: it does not
			// shrink with the profile. On the real box the path is 1/scale
			// times longer for the hardware part.
			in := last.critIn
			in.Scale = 1
			real := e2e.ComputeCriticalPath(in).Total
			fmt.Fprintf(&b, "At scale 1 (the real box) that path is %s; with the same %s overhead the ratio would be %.3f.\n",
				secs(real), secs(last.bringUp-last.crit.Total), (real+last.bringUp-last.crit.Total).Seconds()/real.Seconds())
		}
	}
	return b.String()
}

// renderBootModes puts the ISO and disk image bring-ups of a size side by
// side: wall and critical path of each, and the path at scale 1 (the
// real box) with the overhead measured here, so the saving is a ratio of
// measured runs with the profile's figures named.
func renderBootModes(b *strings.Builder, o options, rows []row) {
	var any bool
	for _, r := range rows {
		any = any || r.imageBringUp > 0
	}
	if !any {
		return
	}
	at1 := func(in e2e.PathInput) time.Duration {
		in.Scale = 1
		return e2e.ComputeCriticalPath(in).Total
	}
	fmt.Fprintf(b, "\nBoot mode (proxmox.boot), bring-up to Flux synced, parallel; the image runs on PVE 8.4 with imports on local:\n\n")
	b.WriteString("| nodes | ISO: wall | its critical path | image: wall | its critical path | image/ISO wall | image/ISO critical path | at scale 1: ISO | image | image/ISO |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	var paths []string
	var imageBytes int64
	for _, r := range rows {
		if r.imageBringUp == 0 {
			continue
		}
		imageBytes = r.imageCritIn.ImageVirtualBytes
		// On the real box the profile's part is 1/scale times longer;
		// each mode keeps the overhead measured here.
		isoReal := at1(r.critIn) + r.bringUp - r.crit.Total
		imgReal := at1(r.imageCritIn) + r.imageBringUp - r.imageCrit.Total
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %.2f | %.2f | %s | %s | %.2f |\n",
			r.size.label(), secs(r.bringUp), secs(r.crit.Total), secs(r.imageBringUp), secs(r.imageCrit.Total),
			r.imageBringUp.Seconds()/r.bringUp.Seconds(), r.imageCrit.Total.Seconds()/r.crit.Total.Seconds(),
			secs(isoReal), secs(imgReal), imgReal.Seconds()/isoReal.Seconds())
		paths = append(paths, fmt.Sprintf("- %s from the disk image: critical path %s.\n", r.size, r.imageCrit))
	}
	b.WriteString("\n" + strings.Join(paths, ""))
	pp, _ := pvesim.ProfileByName(o.profile)
	tp, _ := talossim.ProfileByName(o.profile)
	fmt.Fprintf(b, "\nThe estimate's inputs (profile %s): Talos install %s and reboot %s per node (what the image saves), "+
		"the disk image's download %d MiB at %s/MiB (the lab's file: the real qcow2's size is unverified, taken as the ISO's), "+
		"its import %d MiB at %s/MiB (an estimate, not a measurement), the resize %s; "+
		"the Kubernetes, CNI and Flux parts are the lab's own, measured in each run.\n",
		o.profile, secs(tp.Install), secs(tp.Reboot), lab.ISOBytes>>20, pp.DownloadPerMiB, imageBytes>>20, pp.ImportPerMiB, pp.Resize)
}

const (
	beginMarker = "<!-- bench:begin -->"
	endMarker   = "<!-- bench:end -->"
)

// updateReadme replaces what lies between the bench markers.
func updateReadme(path, table string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	i, j := strings.Index(s, beginMarker), strings.Index(s, endMarker)
	if i < 0 || j < i {
		return errors.New(path + " has no " + beginMarker + " … " + endMarker + " block")
	}
	s = s[:i+len(beginMarker)] + "\n" + table + s[j:]
	return os.WriteFile(path, []byte(s), 0o644)
}
