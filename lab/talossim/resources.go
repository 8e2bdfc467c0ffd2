package talossim

import (
	"context"
	"strconv"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/extensions"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"

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
