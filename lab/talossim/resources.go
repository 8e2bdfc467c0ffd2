package talossim

import (
	"context"
	"strconv"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/extensions"
	"github.com/siderolabs/talos/pkg/machinery/imager/quirks"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"

	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/homelab/bootstrap/lab/imagefactory"
)

// publishMachineStatus keeps the node's MachineStatus resource (runtime
// namespace, ID "machine") at stage, as machined's MachineStatusController
// does from its sequence, phase and task events
// (internal/app/machined/pkg/controllers/runtime/machine_status.go at
// v1.13.3): maintenance while waiting for a config, booting when that wait
// ends and when an installed system boots, installing during the install
// phase, rebooting from kexec/reboot, running when the boot sequence ends
// without error. What makes Status.Ready true in each stage is unverified
// here: running and maintenance count as ready.
func publishMachineStatus(st state.State, stage runtime.MachineStage, ready bool) {
	ctx := context.Background()
	_ = safe.StateModify(ctx, st, runtime.NewMachineStatus(), func(ms *runtime.MachineStatus) error {
		ms.TypedSpec().Stage = stage
		ms.TypedSpec().Status.Ready = ready
		return nil
	})
}

// staticPods are the control-plane static pods kubelet reports on a control
// plane once it runs them (k8s.StaticPodStatus, read by talosctl health's
// K8sControlPlaneStaticPods in pkg/cluster/check/kubernetes.go at v1.13.3).
var staticPods = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// publishExtensions sets the node's ExtensionStatus resources (runtime
// namespace) to the extensions of the installed image, as machined's
// ExtensionStatusController does once at boot from the extensions config
// (internal/app/machined/pkg/controllers/runtime/extension_status.go at
// v1.13.3): one resource per layer, its spec the layer's manifest
// metadata, its ID the layer's image file without ".sqsh". The imager
// unpacks the j-th extension of its input into a directory named j and
// squashes it to "<j>.sqsh" (pkg/imager/imager.go buildInitramfs,
// internal/pkg/extensions/compress.go, pkg/imager/extensions/extensions.go
// at v1.13.3), so the IDs are "0", "1", ….
func publishExtensions(st state.State, exts []imagefactory.Extension) {
	ctx := context.Background()
	old, _ := safe.StateListAll[*runtime.ExtensionStatus](ctx, st)
	for r := range old.All() {
		_ = st.Destroy(ctx, r.Metadata())
	}
	for i, e := range exts {
		_ = safe.StateModify(ctx, st, runtime.NewExtensionStatus(runtime.NamespaceName, strconv.Itoa(i)), func(r *runtime.ExtensionStatus) error {
			r.TypedSpec().Image = strconv.Itoa(i) + ".sqsh"
			r.TypedSpec().Metadata = extensions.Metadata{Name: e.Name, Version: e.Version, Author: e.Author, Description: e.Description}
			return nil
		})
	}
}

// kernelReservedBytes is what the kernel and firmware keep of a VM's RAM
// before /proc/meminfo's MemTotal: Talos' minimal memory limits allow 150
// MiB for it (pkg/minimal/limits.go at v1.13.3); the amount on a real VM
// is unverified, talossim takes 128 MiB.
const kernelReservedBytes = 128 << 20

// Memory implements machine.MachineServiceServer: MemTotal in KiB, as
// machined reads /proc/meminfo (only the total is simulated).
func (a *apid) Memory(context.Context, *emptypb.Empty) (*machine.MemoryResponse, error) {
	total := a.n.spec.MemoryBytes
	if total == 0 {
		total = 2 << 30
	}
	return &machine.MemoryResponse{Messages: []*machine.Memory{{Meminfo: &machine.MemInfo{Memtotal: (total - kernelReservedBytes) / 1024}}}}, nil
}

// publishEphemeral sets the EPHEMERAL VolumeStatus (runtime namespace) of
// an installed system to what the install disk leaves it: the disk less
// the EFI (UKI), META and STATE partitions and the GPT's overhead and
// alignment (machinery imager/quirks PartitionSizes at v1.13.3; the 10 MiB
// overhead is the allowance talosctl health's AllNodesDiskSizes makes in
// pkg/cluster/check/nodes.go, the real layout's is unverified).
func publishEphemeral(st state.State, diskSize uint64, location string) {
	ps := quirks.New("").PartitionSizes()
	publishEphemeralBeside(st, diskSize, ps.UKIEFISize()+ps.METASize()+ps.StateSize()+10<<20, location)
}

// publishEphemeralBeside publishes EPHEMERAL Ready at location, taking the
// disk less the other partitions' bytes.
func publishEphemeralBeside(st state.State, diskSize, other uint64, location string) {
	size := uint64(0)
	if diskSize > other {
		size = diskSize - other
	}
	_ = safe.StateModify(context.Background(), st, block.NewVolumeStatus(block.NamespaceName, "EPHEMERAL"), func(v *block.VolumeStatus) error {
		v.TypedSpec().Phase = block.VolumePhaseReady
		v.TypedSpec().Location = location
		v.TypedSpec().SetSize(size)
		return nil
	})
}

// SetDiagnostic publishes (or, with an empty message, withdraws) one of
// the node's runtime Diagnostics, as machined's diagnostic controllers do
// for a problem they detect (runtime.Diagnostic, read by talosctl health's
// NoDiagnostics in pkg/cluster/check/diagnostics.go at v1.13.3).
func (n *Node) SetDiagnostic(id, message string) {
	ctx := context.Background()
	if message == "" {
		_ = n.cosi.Destroy(ctx, runtime.NewDiagnostic(runtime.NamespaceName, id).Metadata())
		return
	}
	_ = safe.StateModify(ctx, n.cosi, runtime.NewDiagnostic(runtime.NamespaceName, id), func(d *runtime.Diagnostic) error {
		d.TypedSpec().Message = message
		return nil
	})
}
