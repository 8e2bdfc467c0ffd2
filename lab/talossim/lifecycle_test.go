package talossim_test

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"google.golang.org/grpc/codes"

	"github.com/homelab/bootstrap/lab/talossim"
)

var systemNS = &common.ContainerdInstance{Driver: common.ContainerDriver_CRI, Namespace: common.ContainerdNamespace_NS_SYSTEM}

// pull is ImageService.Pull's answer: the pinned name, or the error.
func pull(t *testing.T, c *client.Client, ref string) (string, error) {
	t.Helper()
	stream, err := c.ImageClient.Pull(callCtx(t), &machine.ImageServicePullRequest{Containerd: systemNS, ImageRef: ref})
	if err != nil {
		return "", err
	}
	name := ""
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return name, nil
		}
		if err != nil {
			return "", err
		}
		name = resp.GetName()
	}
}

// lifecycleUpgrade is LifecycleService.Upgrade's stream: the messages and
// the exit code (-1 without one), or the error.
func lifecycleUpgrade(t *testing.T, c *client.Client, name string) ([]string, int32, error) {
	t.Helper()
	stream, err := c.LifecycleClient.Upgrade(callCtx(t), &machine.LifecycleServiceUpgradeRequest{Containerd: systemNS, Source: &machine.InstallArtifactsSource{ImageName: name}})
	if err != nil {
		return nil, -1, err
	}
	var msgs []string
	code := int32(-1)
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return msgs, code, nil
		}
		if err != nil {
			return msgs, code, err
		}
		if m := resp.GetProgress().GetMessage(); m != "" {
			msgs = append(msgs, m)
		}
		if _, ok := resp.GetProgress().GetResponse().(*machine.LifecycleServiceInstallProgress_ExitCode); ok {
			code = resp.GetProgress().GetExitCode()
		}
	}
}

// TestLifecycleServiceRPCs: ImageService.Pull and LifecycleService.Upgrade
// as a v1.13 node answers them (internal/app/images/images.go,
// internal/app/lifecycle/lifecycle.go and container.go at v1.14.0-rc.1):
// the pull pins the image to a digest; Upgrade runs only what was pulled
// into that containerd instance, needs os:admin, streams the installer's
// exit code (non-zero included) and never reboots; the new Talos boots
// at the next reboot the client asks. A v1.12 node serves neither.
func TestLifecycleServiceRPCs(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "secrets.yaml")
	// Upgrade needs os:admin (services/machined.go rules at
	// v1.14.0-rc.1); in maintenance mode every client is a reader.
	_, _, err := lifecycleUpgrade(t, insecure(t, f.wk), "ghcr.io/siderolabs/installer:v1.13.4")
	wantCode(t, err, codes.PermissionDenied, "needs one of [os:admin]")
	f.installAndBootstrap()
	ctx := callCtx(t)
	wk := secure(t, f.cfg, f.wk)
	n := f.node(f.wk)
	from, before := n.Version(), n.Counters()

	_, _, err = lifecycleUpgrade(t, wk, "ghcr.io/siderolabs/installer@sha256:0000000000000000000000000000000000000000000000000000000000000000")
	wantCode(t, err, codes.Internal, "not found in containerd store")

	name, err := pull(t, wk, "ghcr.io/siderolabs/installer:v1.13.4")
	if err != nil || !strings.HasPrefix(name, "ghcr.io/siderolabs/installer@sha256:") {
		t.Fatalf("pull: %q %v", name, err)
	}
	// Pulled into the system namespace, not the CRI one.
	cri, err := wk.LifecycleClient.Upgrade(ctx, &machine.LifecycleServiceUpgradeRequest{
		Containerd: &common.ContainerdInstance{Driver: common.ContainerDriver_CRI, Namespace: common.ContainerdNamespace_NS_CRI},
		Source:     &machine.InstallArtifactsSource{ImageName: name}})
	if err == nil {
		_, err = cri.Recv()
	}
	wantCode(t, err, codes.Internal, "not found in containerd store")

	n.SetFaults(talossim.Faults{UpgradeSequenceFails: 1})
	msgs, code, err := lifecycleUpgrade(t, wk, name)
	if err != nil || code != 1 || !strings.Contains(strings.Join(msgs, "\n"), "no space left on device") {
		t.Fatalf("failing installer: %v %d %v", msgs, code, err)
	}
	if n.Version() != from || f.sim.InstalledVersion(f.wk) != from || n.Counters().Reboots != before.Reboots {
		t.Fatalf("a failed installer changed the node: runs %s, disk %s, %+v", n.Version(), f.sim.InstalledVersion(f.wk), n.Counters())
	}

	_, code, err = lifecycleUpgrade(t, wk, name)
	if err != nil || code != 0 {
		t.Fatalf("installer: %d %v", code, err)
	}
	if n.Version() != from || f.sim.InstalledVersion(f.wk) != "v1.13.4" || n.Counters().Reboots != before.Reboots {
		t.Fatalf("after the installer: runs %s, disk %s, %+v", n.Version(), f.sim.InstalledVersion(f.wk), n.Counters())
	}
	if _, err := wk.MachineClient.Reboot(ctx, &machine.RebootRequest{}); err != nil {
		t.Fatal(err)
	}
	f.waitRebooted(n, before.Reboots)
	if n.Version() != "v1.13.4" {
		t.Fatalf("after the reboot: %s", n.Version())
	}
}

// A v1.12 node has neither service (image.proto and lifecycle.proto
// appear at v1.13.0): gRPC answers Unimplemented, and talosctl falls back
// to MachineService.Upgrade.
func TestLifecycleServiceUnknownOnV112(t *testing.T) {
	t.Parallel()
	f := newFixtureOn(t, "secrets.yaml", talossim.Profile{}, "v1.12.6")
	wk := insecure(t, f.wk)
	_, err := pull(t, wk, "ghcr.io/siderolabs/installer:v1.13.4")
	wantCode(t, err, codes.Unimplemented, "unknown service machine.ImageService")
	_, _, err = lifecycleUpgrade(t, wk, "ghcr.io/siderolabs/installer:v1.13.4")
	wantCode(t, err, codes.Unimplemented, "unknown service machine.LifecycleService")
}

// installAndBootstrap applies both configs in maintenance mode, waits for
// the installed systems and bootstraps etcd.
func (f *fixture) installAndBootstrap() {
	t := f.t
	ctx := callCtx(t)
	for _, n := range []struct{ ip, name string }{{f.cp, "cp-1"}, {f.wk, "wk-1"}} {
		if _, err := insecure(t, n.ip).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: f.config(n.name), Mode: machine.ApplyConfigurationRequest_AUTO}); err != nil {
			t.Fatal(err)
		}
	}
	f.waitPhase(f.node(f.cp), talossim.PhaseRunning)
	f.waitPhase(f.node(f.wk), talossim.PhaseRunning)
	// Running is the booted system; its API may listen a moment later (a
	// loaded make test saw wk-1 refuse the next call).
	for _, ip := range []string{f.cp, f.wk} {
		c := secure(t, f.cfg, ip)
		deadline := time.Now().Add(10 * time.Second)
		for _, err := c.Version(ctx); err != nil; _, err = c.Version(ctx) {
			if time.Now().After(deadline) {
				t.Fatalf("node %s runs but its API does not answer: %v", ip, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if err := secure(t, f.cfg, f.cp).Bootstrap(ctx, &machine.BootstrapRequest{}); err != nil {
		t.Fatal(err)
	}
}
