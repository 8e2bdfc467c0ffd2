package e2e

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/pvesim"
	"github.com/homelab/bootstrap/lab/talossim"
	"github.com/homelab/bootstrap/stages"
)

// PathInput is what the critical path of a bring-up depends on: the
// simulated hardware's profile and the parts of the lab that run for real.
type PathInput struct {
	Proxmox pvesim.Profile
	Talos   talossim.Profile
	// Scale multiplies every profile duration, as the lab does.
	Scale float64
	// ISOBytes is the size of the Talos ISO downloaded first.
	ISOBytes int64
	// ISODownload, when longer than the profile's time for ISOBytes, is
	// how long the lab's Proxmox took to run the download task: its own
	// fetch of the file from the lab's factory and its hash run on the same
	// cores, and no runner can finish the task sooner.
	ISODownload time.Duration
	// Nodes and ControlPlanes size the cluster.
	Nodes, ControlPlanes int
	// ProxmoxParallelism and TalosParallelism are the config's
	// proxmox.parallelism and cluster.parallelism (0: all at once).
	ProxmoxParallelism, TalosParallelism int
	// KubeStart is how long the lab's real control plane takes to start
	// once etcd is bootstrapped (Talos starts it in the same window).
	KubeStart time.Duration
	// CNI is the longest a node took from registering (or the control
	// plane being ready, if later) to turning Ready: flannel's agent,
	// which Talos' bootstrap manifests deploy, running and its kubelet
	// reporting the network (lab time, measured by the lab; with a CNI
	// the runner installs this would include the runner's work).
	CNI time.Duration
	// FluxReconcile is the time the Flux controllers take from the
	// GitRepository's creation to the Kustomization applied and Ready.
	FluxReconcile time.Duration
	// MirrorPods is how long the lab took to show the mirror pods of the
	// control plane whose static pods came last (from its report, its
	// etcd running, to the pods in the API: lab.ControlPlane's
	// MirrorSyncTime). talosctl health waits for them, so the cluster is
	// healthy that long after the last etcd member runs.
	MirrorPods time.Duration
	// Provisioned says the VMs already run in maintenance mode (a restore
	// onto VMs provisioned again): the path starts at the config apply.
	Provisioned bool
	// Image says the VMs boot from the factory's disk image (proxmox.boot
	// resolved to image): ISOBytes and ISODownload are then the image's
	// download, each create task imports ImageVirtualBytes (the image's
	// virtual size) and a resize follows it, and a maintenance apply
	// configures the node on the same boot: no install, no reboot.
	Image bool
	// ImageVirtualBytes is the disk image's virtual size, what an import
	// writes (factory.DiskImageBytes).
	ImageVirtualBytes int64
}

// PathPart is one step of the critical path.
type PathPart struct {
	Name string
	D    time.Duration
}

// CriticalPath is the shortest possible bring-up: what no orchestrator
// can avoid waiting for.
type CriticalPath struct {
	Total time.Duration
	Parts []PathPart
}

func (c CriticalPath) String() string {
	var b strings.Builder
	for i, p := range c.Parts {
		if i > 0 {
			b.WriteString(" + ")
		}
		fmt.Fprintf(&b, "%s %s", p.Name, p.D.Round(10*time.Millisecond))
	}
	return b.String()
}

func batches(n, par int) int {
	if par <= 0 || par >= n {
		return 1
	}
	return (n + par - 1) / par
}

// ComputeCriticalPath walks the slowest node's way from the ISO download
// through create, start, boot, install and reboot (from the disk image:
// its download, create with the import, resize, start, boot and the
// apply) (in as many rounds as
// the parallelism settings need), then the etcd bootstrap with the control
// plane start, the CNI and the Flux reconcile.
func ComputeCriticalPath(in PathInput) CriticalPath {
	s := func(d time.Duration) time.Duration { return time.Duration(float64(d) * in.Scale) }
	p, t := in.Proxmox, in.Talos
	var parts []PathPart
	add := func(name string, d time.Duration) {
		if d > 0 {
			parts = append(parts, PathPart{name, d})
		}
	}
	if !in.Provisioned {
		download := max(s(p.DownloadPerMiB*time.Duration(in.ISOBytes>>20)), in.ISODownload)
		vmRounds := batches(in.Nodes, in.ProxmoxParallelism)
		if in.Image {
			// The create task imports the image's virtual size, the
			// resize grows the disk before the start (pvesim's model).
			add("image download", download)
			vm := p.Create + time.Duration(float64(p.ImportPerMiB)*float64(in.ImageVirtualBytes)/(1<<20)) + p.Resize + p.Start
			add(fmt.Sprintf("create+import+resize+start×%d", vmRounds), time.Duration(vmRounds)*s(vm))
		} else {
			add("ISO download", download)
			add(fmt.Sprintf("create+start×%d", vmRounds), time.Duration(vmRounds)*s(p.Create+p.Start))
		}
		add("boot", s(t.Boot))
	}
	nodeRounds := batches(in.Nodes, in.TalosParallelism)
	// A maintenance apply is answered, apid restarts with the applied CA,
	// and only then does the install sequence run (talossim's
	// applyMaintenance, after Talos' sequencer): the restart is node time
	// no runner can shorten. A node booted from the disk image has no
	// install to run and boots its config on the same boot.
	install := s(t.ApplyLatency + t.ApidRestart + t.Install + t.Reboot)
	name := "install+reboot"
	if in.Image {
		install, name = s(t.ApplyLatency+t.ApidRestart), "apply"
	}
	add(fmt.Sprintf("%s×%d", name, nodeRounds), time.Duration(nodeRounds)*install)
	// Bootstrap is allowed BootstrapReady after the first control plane's
	// configured boot; with several rounds that has long passed.
	sinceFirst := time.Duration(nodeRounds-1) * install
	bootstrapWait := max(0, s(t.BootstrapReady)-sinceFirst)
	add("bootstrap ready", bootstrapWait)
	etcd := s(t.EtcdStart)
	if in.ControlPlanes > 1 {
		etcd += s(t.EtcdJoin)
	}
	// The last kubelet becomes healthy KubeletReady after the last
	// configured boot, in parallel with the bootstrap. The Kubernetes
	// side (the control plane, then the pod network making the nodes
	// Ready) runs beside the etcd members' start and join.
	kube := in.KubeStart + in.CNI
	pods := etcd + in.MirrorPods
	cluster := max(pods, kube, s(t.KubeletReady)-bootstrapWait)
	switch {
	case kube >= pods && kube >= cluster:
		add("control plane start", in.KubeStart)
		add("CNI", in.CNI)
	case pods >= cluster:
		add("etcd", etcd)
		add("mirror pods", in.MirrorPods)
	default:
		add("etcd", cluster)
	}
	// A worker's API needs its certificate from a control plane's trustd:
	// rebooting alongside the control planes, it finds none up yet and
	// tries again a quarter of a reboot later (talossim's model). Nothing
	// on the control planes' way waits for it (the bootstrap waits for the
	// control planes only), so it is on the path only where it is
	// longer than the bootstrap and the cluster's start.
	if in.Nodes > in.ControlPlanes && nodeRounds == 1 {
		add("worker certificate beyond that", s(t.Reboot)/4-bootstrapWait-cluster)
	}
	add("Flux reconcile", in.FluxReconcile)
	var total time.Duration
	for _, x := range parts {
		total += x.D
	}
	return CriticalPath{Total: total, Parts: parts}
}

// FluxReconcileTime reads, from the API server's audit log (which records
// writes only), how long the Flux controllers took in the last run's flux
// stage: from the runner's first write of the GitRepository in it (its
// creation on a bring-up; after a restore, the reconcile request the
// runner stamps on the restored object) to the Kustomization's last
// status update before the stage ended.
func (h *Harness) FluxReconcileTime() (time.Duration, error) {
	starts, durs, err := h.StageTimes()
	if err != nil {
		return 0, err
	}
	fluxStart := starts[stages.Flux]
	fluxEnd := fluxStart.Add(durs[stages.Flux])
	evs, err := kube.ReadAuditLog(h.Lab.AuditLogPath())
	if err != nil {
		return 0, err
	}
	var start, end time.Time
	for _, e := range evs {
		switch {
		case start.IsZero() && e.User.Username == kube.AdminUser && !e.DryRun() && e.ObjectRef.Resource == "gitrepositories" && e.ObjectRef.Subresource == "" &&
			!e.RequestReceivedTimestamp.Before(fluxStart):
			start = e.RequestReceivedTimestamp
		case !start.IsZero() && e.User.Username == kube.LabAdminUser && e.ObjectRef.Resource == "kustomizations" && e.ObjectRef.Subresource == "status" &&
			!e.RequestReceivedTimestamp.After(fluxEnd):
			end = e.RequestReceivedTimestamp
		}
	}
	if start.IsZero() || end.IsZero() {
		return 0, errors.New("no GitRepository write by the runner, or no Kustomization status update after it, in the audit log")
	}
	return end.Sub(start), nil
}

// StageTimes returns when each stage of the last run started and how long
// it took, from state.json.
func (h *Harness) StageTimes() (map[string]time.Time, map[string]time.Duration, error) {
	st, err := h.State()
	if err != nil {
		return nil, nil, err
	}
	starts, durs := map[string]time.Time{}, map[string]time.Duration{}
	for _, name := range stages.Order {
		r := st.Stage(name)
		starts[name], durs[name] = r.Started, time.Duration(r.DurationSeconds*float64(time.Second))
	}
	return starts, durs, nil
}

var pvcBound = regexp.MustCompile(`bound to \S+ via \S+ in (\S+)`)

// PVCBindTime is how long the postcheck's test PVC took to bind, from the
// postcheck table in a run's output.
func PVCBindTime(stdout string) (time.Duration, error) {
	m := pvcBound.FindStringSubmatch(stdout)
	if m == nil {
		return 0, errors.New("no nfs-provisioning row with a bind time")
	}
	return time.ParseDuration(m[1])
}

// SetParallelism writes proxmox.parallelism and cluster.parallelism into
// the lab's config (0 leaves a key out).
func (h *Harness) SetParallelism(proxmox, talos int) error {
	return h.EditConfig(func(s string) (string, error) {
		if proxmox > 0 {
			if !strings.Contains(s, "\nproxmox:\n") {
				return "", errors.New("no proxmox section")
			}
			s = strings.Replace(s, "\nproxmox:\n", fmt.Sprintf("\nproxmox:\n  parallelism: %d\n", proxmox), 1)
		}
		if talos > 0 {
			if !strings.Contains(s, "\ncluster:\n") {
				return "", errors.New("no cluster section")
			}
			s = strings.Replace(s, "\ncluster:\n", fmt.Sprintf("\ncluster:\n  parallelism: %d\n", talos), 1)
		}
		return s, nil
	})
}

// RunMutations counts what a run changed, from counters read before and
// after it: Proxmox POST/PUT/DELETE, Talos applies and bootstraps, new
// Helm revisions, and API server writes by the runner other than the
// postcheck's test PVC.
func RunMutations(before, after Counters) (int, []string) {
	var what []string
	add := func(n int, format string, a ...any) {
		if n > 0 {
			what = append(what, fmt.Sprintf(format, a...))
		}
	}
	add(after.ProxmoxMutating-before.ProxmoxMutating, "%d Proxmox", after.ProxmoxMutating-before.ProxmoxMutating)
	add(after.TalosApplies-before.TalosApplies, "%d Talos applies", after.TalosApplies-before.TalosApplies)
	add(after.TalosBootstraps-before.TalosBootstraps, "%d bootstraps", after.TalosBootstraps-before.TalosBootstraps)
	helm := 0
	for k, r := range after.HelmReleases {
		if r.Revision != before.HelmReleases[k].Revision {
			helm++
		}
	}
	add(helm, "%d Helm releases", helm)
	writes := 0
	for _, e := range after.NewWrites(before) {
		if !IsPostcheckPVC(e) {
			writes++
		}
	}
	add(writes, "%d API writes", writes)
	n := after.ProxmoxMutating - before.ProxmoxMutating + after.TalosApplies - before.TalosApplies +
		after.TalosBootstraps - before.TalosBootstraps + helm + writes
	return n, what
}

// ISODownloadTime is the longest download-url task a Proxmox host of the
// lab ran (0 when none ran).
func (h *Harness) ISODownloadTime() time.Duration {
	var longest time.Duration
	for _, m := range h.Lab.PVEMembers {
		for _, d := range m.TaskDurations("download") {
			longest = max(longest, d)
		}
	}
	return longest
}

// NetworkStartTime is the longest a node of the lab took from registering
// (or its control plane being ready) to turning Ready.
func (h *Harness) NetworkStartTime() (time.Duration, error) {
	kc, err := h.Lab.Kube.Cluster()
	if err != nil {
		return 0, err
	}
	return kc.NetworkStartTime(), nil
}

// MirrorSyncTime is how long the lab took to show the mirror pods of the
// control plane whose static pods it showed last (0 without a lab control
// plane).
func (h *Harness) MirrorSyncTime() time.Duration {
	if h.Lab.Kube == nil {
		return 0
	}
	return h.Lab.Kube.MirrorSyncTime()
}

// KubeStartTime is how long the lab's control plane took to start.
func (h *Harness) KubeStartTime() (time.Duration, error) {
	kc, err := h.Lab.Kube.Cluster()
	if err != nil {
		return 0, err
	}
	return kc.StartupTime(), nil
}

// UpgradeCriticalPath is the shortest possible Talos rollout: control
// planes one after another (etcd keeps its quorum), then the workers in
// batches of workerParallelism. Each node waits for its reboot sequence to
// start and its reboot, then for its boot sequence and, on a control
// plane, its kubelet: the cluster health the rollout waits for checks the
// kubelet service on control planes only (as talosctl health does). The
// simulator keeps an upgraded control plane's etcd member (its rejoin
// takes no time in talossim's model).
func UpgradeCriticalPath(t talossim.Profile, scale float64, controlPlanes, workers, workerParallelism int) CriticalPath {
	s := func(d time.Duration) time.Duration { return time.Duration(float64(d) * scale) }
	cp := s(t.RebootStart + t.Reboot + max(t.BootSequence, t.KubeletReady))
	wk := s(t.RebootStart + t.Reboot + t.BootSequence)
	parts := []PathPart{{fmt.Sprintf("control plane×%d", controlPlanes), time.Duration(controlPlanes) * cp}}
	if workers > 0 {
		rounds := batches(workers, workerParallelism)
		parts = append(parts, PathPart{fmt.Sprintf("worker×%d", rounds), time.Duration(rounds) * wk})
	}
	var total time.Duration
	for _, p := range parts {
		total += p.D
	}
	return CriticalPath{Total: total, Parts: parts}
}
