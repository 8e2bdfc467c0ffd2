package postcheck

import (
	"context"
	"errors"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/talos"
)

// A claim nobody provisions: the next names the provisioner's replicas
// before the events and logs.
func TestProvisionerDownIsTheCause(t *testing.T) {
	dep := func(name string, want *int32, ready int32) *appsv1.Deployment {
		return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "nfs-provisioner"},
			Spec: appsv1.DeploymentSpec{Replicas: want}, Status: appsv1.DeploymentStatus{ReadyReplicas: ready}}
	}
	one, zero := int32(1), int32(0)
	c := &checker{o: Options{Cluster: "lab", PVCNamespace: "nfs-provisioner"}}
	cases := []struct {
		what string
		dep  *appsv1.Deployment
		want string
	}{
		{"not ready", dep("nfs-subdir", &one, 0), "the NFS provisioner nfs-provisioner/nfs-subdir has 0/1 ready replicas: "},
		{"scaled to 0", dep("nfs-subdir", &zero, 0), "the NFS provisioner nfs-provisioner/nfs-subdir has 0/0 ready replicas (scaled to 0): "},
		{"ready", dep("nfs-subdir", &one, 1), ""},
	}
	for _, tc := range cases {
		got := c.provisionerDown(t.Context(), fake.NewClientset(tc.dep))
		if tc.want == "" && got != "" || !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: %q, want %q…", tc.what, got, tc.want)
		}
	}
	seen := Cause{Seen: c.provisionerDown(t.Context(), fake.NewClientset(dep("nfs-subdir", &one, 0)))}
	next := NextSeen("lab", CheckNFS, check.Fail, seen)
	if !strings.HasPrefix(next, "the NFS provisioner nfs-provisioner/nfs-subdir has 0/1 ready replicas") || !strings.HasSuffix(next, Next("lab", CheckNFS, check.Fail)) {
		t.Errorf("next %q", next)
	}
	r := NewReport("lab", c.o.now(), 0, []check.Result{{Name: CheckNFS, Status: check.Fail, Reason: "phase Pending"}, {Name: CheckCerts, Status: check.Pass}})
	r.SetCauses(map[string]Cause{CheckNFS: seen, CheckCerts: seen})
	if r.Checks[0].Next != next || r.Checks[1].Next != "" {
		t.Errorf("report rows: %+v", r.Checks)
	}
}

type downProbe struct{ down map[string]string }

func (p downProbe) VMs(context.Context) (VMState, error)                  { return VMState{Down: p.down}, nil }
func (p downProbe) GuestAgents(context.Context) (map[string]error, error) { return nil, nil }

// A node whose VM is stopped answers nothing: its extensions row says to
// start it, not to upgrade Talos.
func TestStoppedVMIsTheExtensionsCause(t *testing.T) {
	nodes := []Node{{Name: "cp-1"}, {Name: "wk-1"}}
	ok := []talos.Extension{{Name: "i915", Version: "v1"}}
	c := &checker{o: Options{Nodes: nodes, Extensions: []string{"i915"}, Observed: &Observed{},
		Talos:   extProbe{exts: map[string][]talos.Extension{"cp-1": ok}, err: errors.New("wk-1: connection refused")},
		Proxmox: downProbe{down: map[string]string{"wk-1": "stopped"}}}}
	if st, _ := c.extensions(t.Context()); st != check.Fail {
		t.Fatalf("extensions: %s", st)
	}
	cause := c.o.Observed.Causes[CheckExtensions]
	next := NextSeen("lab", CheckExtensions, check.Fail, cause)
	if !cause.Instead || !strings.Contains(next, "wk-1 is stopped: start it") || strings.Contains(next, "upgrade") {
		t.Errorf("next %q (%+v)", next, cause)
	}

	// A node that runs and lacks an extension beside one that is off:
	// the stopped one is named first, the upgrade still applies.
	c = &checker{o: Options{Nodes: nodes, Extensions: []string{"i915"},
		Talos:   extProbe{exts: map[string][]talos.Extension{"cp-1": nil, "wk-1": nil}},
		Proxmox: downProbe{down: map[string]string{"wk-1": "stopped"}}}}
	c.extensions(t.Context())
	if cause := c.causes[CheckExtensions]; cause.Instead || !strings.Contains(cause.Seen, "wk-1 is stopped") || strings.Contains(cause.Seen, "cp-1") {
		t.Errorf("cause %+v", cause)
	}

	// Every VM runs: no cause, the usual next.
	c = &checker{o: Options{Nodes: nodes, Extensions: []string{"i915"},
		Talos: extProbe{exts: map[string][]talos.Extension{"cp-1": ok}}, Proxmox: downProbe{}}}
	c.extensions(t.Context())
	if len(c.causes) != 0 {
		t.Errorf("causes %+v", c.causes)
	}
}
