package e2e

import (
	"testing"
	"time"

	"github.com/homelab/bootstrap/lab/pvesim"
	"github.com/homelab/bootstrap/lab/talossim"
)

func TestCriticalPath(t *testing.T) {
	t.Parallel()
	in := PathInput{
		Proxmox:  pvesim.Profile{DownloadPerMiB: 10 * time.Millisecond, Create: time.Second, Start: time.Second},
		Talos:    talossim.Profile{Boot: 2 * time.Second, Install: 3 * time.Second, Reboot: 4 * time.Second, BootstrapReady: time.Second, EtcdStart: 2 * time.Second, EtcdJoin: 3 * time.Second, KubeletReady: 2 * time.Second},
		Scale:    1,
		ISOBytes: 100 << 20,
		Nodes:    5, ControlPlanes: 3, ProxmoxParallelism: 4,
		KubeStart: time.Second, FluxReconcile: 500 * time.Millisecond,
	}
	for _, tc := range []struct {
		name          string
		proxmox, talo int
		scale         float64
		kubeStart     time.Duration
		isoTask       time.Duration
		want          time.Duration
		parts         string
	}{
		// ISO 1 + 2 rounds of create+start 4 + boot 2 + install+reboot 7 +
		// bootstrap ready 1 + etcd start and join 5 + Flux 0.5; the
		// workers' certificate wait (1) runs beside the bootstrap.
		{"parallel", 4, 0, 1, time.Second, 0, 20500 * time.Millisecond,
			"ISO download 1s + create+start×2 4s + boot 2s + install+reboot×1 7s + bootstrap ready 1s + etcd 5s + Flux reconcile 500ms"},
		// One VM and one node at a time: 5 × 2 and 5 × 7; bootstrap ready
		// has long passed; the control plane start is now the longest.
		{"one after another", 1, 1, 1, 6 * time.Second, 0, 54500 * time.Millisecond,
			"ISO download 1s + create+start×5 10s + boot 2s + install+reboot×5 35s + control plane start 6s + Flux reconcile 500ms"},
		// The scale applies to the profile, not to what runs for real.
		{"scaled", 4, 0, 0.5, time.Second, 0, 10500 * time.Millisecond,
			"ISO download 500ms + create+start×2 2s + boot 1s + install+reboot×1 3.5s + bootstrap ready 500ms + etcd 2.5s + Flux reconcile 500ms"},
		// The lab's download task ran longer than the profile's 500ms (its
		// fetch and hash): the path waits for the task; a shorter one
		// does not shorten the profile's time.
		{"download task longer", 4, 0, 0.5, time.Second, 1200 * time.Millisecond, 11200 * time.Millisecond,
			"ISO download 1.2s + create+start×2 2s + boot 1s + install+reboot×1 3.5s + bootstrap ready 500ms + etcd 2.5s + Flux reconcile 500ms"},
		{"download task shorter", 4, 0, 0.5, time.Second, 100 * time.Millisecond, 10500 * time.Millisecond,
			"ISO download 500ms + create+start×2 2s + boot 1s + install+reboot×1 3.5s + bootstrap ready 500ms + etcd 2.5s + Flux reconcile 500ms"},
	} {
		in := in
		in.ProxmoxParallelism, in.TalosParallelism, in.Scale, in.KubeStart, in.ISODownload = tc.proxmox, tc.talo, tc.scale, tc.kubeStart, tc.isoTask
		got := ComputeCriticalPath(in)
		if got.Total != tc.want || got.String() != tc.parts {
			t.Errorf("%s: %s = %s\nwant %s = %s", tc.name, got.Total, got, tc.want, tc.parts)
		}
	}
	// The pod network makes the nodes Ready 5s after the control plane
	// (1s): together longer than etcd (5s), so both are on the path.
	withNet := in
	withNet.ProxmoxParallelism, withNet.Scale, withNet.KubeStart, withNet.CNI = 4, 1, time.Second, 5*time.Second
	if got, want := ComputeCriticalPath(withNet), "ISO download 1s + create+start×2 4s + boot 2s + install+reboot×1 7s + bootstrap ready 1s + control plane start 1s + CNI 5s + Flux reconcile 500ms"; got.String() != want || got.Total != 21500*time.Millisecond {
		t.Errorf("with the network start: %s = %s\nwant 21.5s = %s", got.Total, got, want)
	}
	// apid's restart with the applied CA comes before the install: node
	// time on the path, in every round.
	apid := in
	apid.ProxmoxParallelism, apid.TalosParallelism, apid.Scale, apid.KubeStart = 4, 0, 1, time.Second
	apid.Talos.ApplyLatency, apid.Talos.ApidRestart = 200*time.Millisecond, 800*time.Millisecond
	if got, want := ComputeCriticalPath(apid), "ISO download 1s + create+start×2 4s + boot 2s + install+reboot×1 8s + bootstrap ready 1s + etcd 5s + Flux reconcile 500ms"; got.String() != want || got.Total != 21500*time.Millisecond {
		t.Errorf("with apid's restart: %s = %s\nwant 21.5s = %s", got.Total, got, want)
	}
	// The lab shows the last control plane's mirror pods 300ms after its
	// etcd member runs: talosctl health waits for them.
	mirrors := apid
	mirrors.MirrorPods = 300 * time.Millisecond
	if got, want := ComputeCriticalPath(mirrors), "ISO download 1s + create+start×2 4s + boot 2s + install+reboot×1 8s + bootstrap ready 1s + etcd 5s + mirror pods 300ms + Flux reconcile 500ms"; got.String() != want || got.Total != 21800*time.Millisecond {
		t.Errorf("with the mirror pods' sync: %s = %s\nwant 21.8s = %s", got.Total, got, want)
	}
	// A reboot so long that the workers' certificate wait (a quarter of
	// it, 10s) outlasts bootstrap ready and etcd (6s): the rest is on the
	// path.
	slow := in
	slow.Talos.Reboot = 40 * time.Second
	got := ComputeCriticalPath(slow)
	if want := "ISO download 1s + create+start×2 4s + boot 2s + install+reboot×1 43s + bootstrap ready 1s + etcd 5s + worker certificate beyond that 4s + Flux reconcile 500ms"; got.String() != want || got.Total != 60500*time.Millisecond {
		t.Errorf("slow reboot: %s = %s\nwant 60.5s = %s", got.Total, got, want)
	}
}

// From the disk image: the image's download, each create importing its
// virtual size before a resize and the start, and an apply in place of the
// install and the reboot.
func TestCriticalPathFromImage(t *testing.T) {
	t.Parallel()
	in := PathInput{
		Proxmox:  pvesim.Profile{DownloadPerMiB: 10 * time.Millisecond, Create: time.Second, Start: time.Second, Resize: 500 * time.Millisecond, ImportPerMiB: time.Millisecond},
		Talos:    talossim.Profile{Boot: 2 * time.Second, Install: 3 * time.Second, Reboot: 4 * time.Second, BootstrapReady: time.Second, EtcdStart: 2 * time.Second, EtcdJoin: 3 * time.Second, KubeletReady: 2 * time.Second, ApplyLatency: 200 * time.Millisecond, ApidRestart: 800 * time.Millisecond},
		Scale:    1,
		ISOBytes: 50 << 20,
		Nodes:    5, ControlPlanes: 3, ProxmoxParallelism: 4,
		KubeStart: time.Second, FluxReconcile: 500 * time.Millisecond,
		Image: true, ImageVirtualBytes: 1000 << 20,
	}
	// 0.5 + 2 × (1 + 1 + 0.5 + 1) + 2 + 1 + 1 + 5 + 0.5
	want := "image download 500ms + create+import+resize+start×2 7s + boot 2s + apply×1 1s + bootstrap ready 1s + etcd 5s + Flux reconcile 500ms"
	if got := ComputeCriticalPath(in); got.String() != want || got.Total != 17*time.Second {
		t.Errorf("from the image: %s = %s\nwant 17s = %s", got.Total, got, want)
	}
	// The same cluster from the ISO, its download twice as long: the
	// install and the reboot (7s) are what the image saves.
	iso := in
	iso.Image, iso.ISOBytes = false, 100<<20
	if got := ComputeCriticalPath(iso); got.Total != 21500*time.Millisecond {
		t.Errorf("from the ISO: %s = %s, want 21.5s", got.Total, got)
	}
}

func TestUpgradeCriticalPath(t *testing.T) {
	t.Parallel()
	// A control plane: 5 s to start rebooting + 45 s reboot + its kubelet
	// (30 s, after the 15 s boot sequence); a worker: 5 + 45 + its boot
	// sequence (15 s).
	n100 := talossim.ProfileN100
	for _, tc := range []struct {
		wks, par int
		want     time.Duration
		parts    string
	}{
		{2, 1, 3*80*time.Second + 2*65*time.Second, "control plane×3 4m0s + worker×2 2m10s"},
		{2, 2, 3*80*time.Second + 65*time.Second, "control plane×3 4m0s + worker×1 1m5s"},
		{0, 1, 3 * 80 * time.Second, "control plane×3 4m0s"},
	} {
		got := UpgradeCriticalPath(n100, 1, 3, tc.wks, tc.par)
		if got.Total != tc.want || got.String() != tc.parts {
			t.Errorf("%d workers by %d: %s = %s, want %s = %s", tc.wks, tc.par, got.Total, got, tc.want, tc.parts)
		}
	}
	if got := UpgradeCriticalPath(n100, 0.1, 1, 0, 1); got.Total != 8*time.Second {
		t.Errorf("scaled: %s", got.Total)
	}
}
