package talossim_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
)

// staticPod reads a static pod's image and readiness from the status the
// node reports over COSI.
func staticPod(ctx context.Context, c *client.Client, id string) (image string, ready bool, err error) {
	p, err := safe.StateGet[*k8s.StaticPodStatus](ctx, c.COSI, resource.NewMetadata(k8s.NamespaceName, k8s.StaticPodStatusType, id, resource.VersionUndefined))
	if err != nil {
		return "", false, err
	}
	st := p.TypedSpec().PodStatus
	if cs, ok := st["containerStatuses"].([]any); ok && len(cs) > 0 {
		image, _ = cs[0].(map[string]any)["image"].(string)
	}
	for _, c := range st["conditions"].([]any) {
		m := c.(map[string]any)
		if m["type"] == "Ready" {
			ready = m["status"] == "True"
		}
	}
	return image, ready, nil
}

func waitStaticPod(t *testing.T, ctx context.Context, c *client.Client, id, image string, ready bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, r, err := staticPod(ctx, c, id)
		if err == nil && got == image && r == ready {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: image %q ready %v (%v), want %q ready %v", id, got, r, err, image, ready)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestKubernetesImagesFollowTheConfig: a config applied without a reboot
// that names a new API server and kubelet image changes what the node's
// controllers publish (APIServerConfig, KubeletSpec) at once; the static
// pod goes not Ready until the control plane runs the new image, and the
// kubelet restarts with its image. Unchanged static pods are not touched.
// A new image that does not start leaves the pod not Ready.
func TestKubernetesImagesFollowTheConfig(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "secrets.yaml")
	ctx := callCtx(t)
	cp := f.bootstrappedControlPlane(ctx)
	const (
		oldAPI = "registry.k8s.io/kube-apiserver:v1.36.1"
		newAPI = "registry.k8s.io/kube-apiserver:v1.36.0"
	)
	waitStaticPod(t, ctx, cp, "kube-system/kube-apiserver-cp-1", oldAPI, true)
	ks, err := safe.StateGet[*k8s.KubeletSpec](ctx, cp.COSI, resource.NewMetadata(k8s.NamespaceName, k8s.KubeletSpecType, k8s.KubeletID, resource.VersionUndefined))
	if err != nil || ks.TypedSpec().Image != "ghcr.io/siderolabs/kubelet:v1.36.1" {
		t.Fatalf("kubelet spec %v %v", ks, err)
	}

	cfg := bytes.ReplaceAll(f.config("cp-1"), []byte(oldAPI), []byte(newAPI))
	cfg = bytes.ReplaceAll(cfg, []byte("ghcr.io/siderolabs/kubelet:v1.36.1"), []byte("ghcr.io/siderolabs/kubelet:v1.36.0"))
	if bytes.Equal(cfg, f.config("cp-1")) {
		t.Fatal("the test config names no images to change")
	}
	resp, err := cp.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: cfg, Mode: machine.ApplyConfigurationRequest_NO_REBOOT})
	if err != nil || resp.GetMessages()[0].GetMode() != machine.ApplyConfigurationRequest_NO_REBOOT {
		t.Fatalf("apply %v %v", resp, err)
	}
	api, err := safe.StateGet[*k8s.APIServerConfig](ctx, cp.COSI, k8s.NewAPIServerConfig(k8s.APIServerConfigID).Metadata())
	if err != nil || api.TypedSpec().Image != newAPI {
		t.Fatalf("APIServerConfig %v %v", api, err)
	}
	waitStaticPod(t, ctx, cp, "kube-system/kube-apiserver-cp-1", newAPI, true)
	deadline := time.Now().Add(5 * time.Second)
	want := []string{"cp-1/kube-apiserver=" + newAPI, "cp-1/kubelet=ghcr.io/siderolabs/kubelet:v1.36.0"}
	for {
		got := f.cluster.ImageUpdates()
		slices.Sort(got)
		if slices.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("image updates %v, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c := f.node(f.cp).Counters(); c.Reboots != 1 {
		t.Fatalf("reboots %d, want only the install's", c.Reboots)
	}

	f.cluster.FailStaticPods(errors.New("ImagePullBackOff"))
	broken := bytes.ReplaceAll(cfg, []byte(newAPI), []byte("registry.k8s.io/kube-apiserver:v1.36.2"))
	if _, err := cp.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: broken, Mode: machine.ApplyConfigurationRequest_NO_REBOOT}); err != nil {
		t.Fatal(err)
	}
	waitStaticPod(t, ctx, cp, "kube-system/kube-apiserver-cp-1", "registry.k8s.io/kube-apiserver:v1.36.2", false)
	time.Sleep(50 * time.Millisecond)
	waitStaticPod(t, ctx, cp, "kube-system/kube-apiserver-cp-1", "registry.k8s.io/kube-apiserver:v1.36.2", false)
}
