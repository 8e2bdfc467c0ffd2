package talossim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/distribution/reference"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/homelab/bootstrap/lab/imagefactory"
)

// Since Talos v1.13 a node serves two services talosctl upgrade uses in
// place of MachineService.Upgrade (cmd/talosctl/cmd/talos/upgrade.go at
// v1.14.0-rc.1: upgradeViaLifecycleService for nodes in
// ">1.13.0-alpha.2 <2.0.0"): ImageService.Pull puts the installer image
// in a containerd instance, then LifecycleService.Upgrade runs the
// installer from that image in a container while the node keeps running,
// and streams its output and exit code. Nothing reboots: the client
// drains the node and reboots it itself. api/machine/image.proto and
// lifecycle.proto exist from v1.13.0 on, not at v1.12.6: a v1.12 node
// answers both as gRPC does for a service it does not register (apid's
// admit, before any role check).

// pulledImage is an installer image in a node's containerd store.
type pulledImage struct {
	version string
	exts    []imagefactory.Extension
}

// imageService implements machine.ImageServiceServer's Pull.
type imageService struct {
	machine.UnimplementedImageServiceServer
	a *apid
}

// lifecycleService implements machine.LifecycleServiceServer's Upgrade.
type lifecycleService struct {
	machine.UnimplementedLifecycleServiceServer
	a *apid
}

// hasLifecycle: the node's Talos serves ImageService and
// LifecycleService (v1.13.0 and later).
func hasLifecycle(talosVersion string) bool {
	return atLeastMinor(talosVersion, 13)
}

// lifecycleServiceOf names the v1.13 service a full method belongs to.
func lifecycleServiceOf(method string) (string, bool) {
	for _, svc := range []string{"machine.ImageService", "machine.LifecycleService"} {
		if strings.HasPrefix(method, "/"+svc+"/") {
			return svc, true
		}
	}
	return "", false
}

func imageKey(inst *common.ContainerdInstance, ref string) string {
	return inst.GetDriver().String() + "/" + inst.GetNamespace().String() + "/" + ref
}

// Pull is internal/app/images/images.go Pull at v1.14.0-rc.1: the image
// is pulled into the named containerd instance (skipped when present) and
// answered by name, pinned to its digest when the reference had none
// (parsedRef.Name() + "@" + digest: the tag goes). A registry that does
// not have it answers NotFound "error pulling image: …".
//
// Not simulated: layer progress messages (a client that is no terminal
// ignores them, talosctl's imagePullInternal); the digest is the
// reference's own hash, not the manifest's (the lab's registry is not
// asked for one).
func (s imageService) Pull(req *machine.ImageServicePullRequest, ss grpc.ServerStreamingServer[machine.ImageServicePullResponse]) error {
	n := s.a.n
	n.mu.Lock()
	n.counters.ImagePulls++
	ref := req.GetImageRef()
	parsed, err := reference.ParseDockerRef(ref)
	if err != nil {
		n.mu.Unlock()
		return status.Errorf(codes.InvalidArgument, "error pulling image: failed to parse image reference %q: %v", ref, err)
	}
	if n.faults.UpgradePullFails > 0 {
		n.faults.UpgradePullFails--
		n.mu.Unlock()
		return status.Errorf(codes.NotFound, "error pulling image: %s: not found (injected)", ref)
	}
	exts, err := n.sim.pullInstaller(ref)
	if err != nil {
		n.mu.Unlock()
		return status.Errorf(codes.NotFound, "error pulling image: %s", err)
	}
	pinned := ref
	if _, ok := parsed.(reference.Canonical); !ok {
		sum := sha256.Sum256([]byte(ref))
		pinned = parsed.Name() + "@sha256:" + hex.EncodeToString(sum[:])
	}
	if n.images == nil {
		n.images = map[string]pulledImage{}
	}
	n.images[imageKey(req.GetContainerd(), pinned)] = pulledImage{version: installerVersion(ref, n.version), exts: exts}
	n.mu.Unlock()
	return ss.Send(&machine.ImageServicePullResponse{Response: &machine.ImageServicePullResponse_Name{Name: pinned}})
}

// Upgrade is internal/app/lifecycle/lifecycle.go Upgrade at v1.14.0-rc.1
// (the same at v1.13.3):
//   - one install or upgrade at a time: FailedPrecondition "another
//     installation/upgrade is already in progress";
//   - an uninstalled machine: FailedPrecondition "machine is not
//     installed"; no image name: InvalidArgument;
//   - the image must be in the instance's store (container.go
//     runInstallerContainer: "installer image %q not found in containerd
//     store"), answered as Internal "upgrade failed: …";
//   - the installer runs in a container beside the running node, in
//     upgrade mode and not forced, streaming its output as messages and
//     ending with its exit code, which the server sends whatever it is
//     (non-zero is the client's to handle: lifecycle.proto). The node
//     keeps running its Talos, its services and its stage; the new Talos
//     boots at its next reboot, which is the client's to ask.
//
// The installer's own checks are the legacy upgrade's: its pre-flight
// (the installer's Talos must accept the host's, installerPreflight) and
// UpgradeSequenceFails (a bootloader that cannot be written). A failed
// installer leaves the disk booting the Talos the node runs; which partial
// writes a real failed installer leaves is unverified. Its output lines
// are talossim's own words.
func (l lifecycleService) Upgrade(req *machine.LifecycleServiceUpgradeRequest, ss grpc.ServerStreamingServer[machine.LifecycleServiceUpgradeResponse]) error {
	n := l.a.n
	n.mu.Lock()
	n.counters.UpgradeCalls++
	n.counters.LifecycleUpgrades++
	if n.installing {
		n.mu.Unlock()
		return status.Error(codes.FailedPrecondition, "another installation/upgrade is already in progress")
	}
	if n.phase != PhaseRunning || n.sim.installedSystem(n.ip).config == nil {
		n.mu.Unlock()
		return status.Error(codes.FailedPrecondition, "machine is not installed")
	}
	name := req.GetSource().GetImageName()
	if name == "" {
		n.mu.Unlock()
		return status.Error(codes.InvalidArgument, "installer image name is required")
	}
	img, ok := n.images[imageKey(req.GetContainerd(), name)]
	if !ok {
		n.mu.Unlock()
		return status.Errorf(codes.Internal, "upgrade failed: installer image %q not found in containerd store: image %q: not found", name, name)
	}
	n.installing = true
	gen := n.gen
	installErr := installerPreflight(img.version, n.version)
	if installErr == nil && n.faults.UpgradeSequenceFails > 0 {
		n.faults.UpgradeSequenceFails--
		installErr = fmt.Errorf("(injected) failed to install bootloader: no space left on device")
	}
	from := n.version
	took := n.sim.scaled(n.sim.opts.Profile.RebootStart)
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		n.installing = false
		n.mu.Unlock()
	}()

	send := func(msg string) error {
		return ss.Send(&machine.LifecycleServiceUpgradeResponse{Progress: &machine.LifecycleServiceInstallProgress{
			Response: &machine.LifecycleServiceInstallProgress_Message{Message: msg}}})
	}
	exit := func(code int32) error {
		return ss.Send(&machine.LifecycleServiceUpgradeResponse{Progress: &machine.LifecycleServiceInstallProgress{
			Response: &machine.LifecycleServiceInstallProgress_ExitCode{ExitCode: code}}})
	}
	if err := send(fmt.Sprintf("talossim installer: upgrading Talos %s to %s", from, img.version)); err != nil {
		return err
	}
	select {
	case <-ss.Context().Done():
		return ss.Context().Err()
	case <-time.After(took):
	}
	n.mu.Lock()
	if n.gen != gen {
		// The node rebooted or powered off under the installer.
		n.mu.Unlock()
		return status.Error(codes.Unavailable, "talossim: the node went down during the upgrade")
	}
	if installErr != nil {
		n.counters.FailedUpgrades++
		n.mu.Unlock()
		n.log.Warn().Err(installErr).Msg("talossim: the installer failed; the node keeps running its Talos")
		if err := send("talossim installer: " + installErr.Error()); err != nil {
			return err
		}
		return exit(1)
	}
	sys := n.sim.installedSystem(n.ip)
	sys.version, sys.extensions, sys.secureBoot = img.version, img.exts, secureBootImage(name)
	n.sim.persist(n.ip, sys)
	n.counters.Upgrades++
	n.mu.Unlock()
	if err := send(fmt.Sprintf("talossim installer: Talos %s installed; it boots at the next reboot", img.version)); err != nil {
		return err
	}
	return exit(0)
}
