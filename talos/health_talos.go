package talos

// The Talos side of the health check: what each node's Talos API says
// (etcd, services, boot sequence, Talos' minimums), judged as talosctl
// health's Talos assertions judge it.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/imager/quirks"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc/codes"
)

// nodeFacts is what one health poll learnt from one node.
type nodeFacts struct {
	svcs      []Service
	svcErr    error
	members   []EtcdMember
	memberErr error
	stage     MachineStage
	stageErr  error
	versionOK error
	static    []string
	staticErr error
	memTotal  uint64 // bytes
	memErr    error
	ephemeral uint64 // bytes; 0 when the node does not report it
	ephErr    error
	diags     []string
	diagErr   error
}

// talosSideHealth judges the Talos side's assertions, in talosctl's
// order, from each node's facts.
func talosSideHealth(in HealthInput, cps, all []HealthTarget, facts map[string]*nodeFacts) HealthReport {
	var r HealthReport
	add := func(name string, problems []string) {
		c := HealthCheck{Name: name, OK: len(problems) == 0}
		c.Detail = strings.Join(problems, "; ")
		r = append(r, c)
	}
	// etcd healthy on every control plane.
	var problems []string
	for _, n := range cps {
		f := facts[n.Name]
		if f.svcErr != nil {
			problems = append(problems, fmt.Sprintf("%s: %s", n.Name, shortErr(f.svcErr)))
			continue
		}
		if s, ok := findService(f.svcs, "etcd"); !ok {
			problems = append(problems, n.Name+": etcd absent")
		} else if !s.Healthy {
			problems = append(problems, fmt.Sprintf("%s: etcd %s %s", n.Name, s.State, s.LastEvent))
		}
	}
	add(HealthEtcdHealthy, problems)

	// The same membership on every control plane.
	problems = nil
	var first []string
	firstNode := ""
	for _, n := range cps {
		f := facts[n.Name]
		if f.memberErr != nil {
			problems = append(problems, fmt.Sprintf("%s: %s", n.Name, shortErr(f.memberErr)))
			continue
		}
		view := memberView(f.members)
		if firstNode == "" {
			first, firstNode = view, n.Name
			continue
		}
		if !slices.Equal(view, first) {
			problems = append(problems, fmt.Sprintf("%s sees %s, %s sees %s", n.Name, strings.Join(view, ", "), firstNode, strings.Join(first, ", ")))
		}
	}
	add(HealthEtcdConsistent, problems)

	// The members are the control planes, matched by address (the peer
	// URLs' IPs, as talosctl's EtcdControlPlaneNodesAssertion reads them:
	// pkg/cluster/check/etcd.go at v1.13.3), so a hostname a user's patch
	// sets does not matter. Stricter than talosctl, which only wants every
	// member's IP to be a control plane's: here every control plane must
	// be a member too, and none a learner.
	problems = etcdMembersAreControlPlanes(in, cps, facts, firstNode)
	add(HealthEtcdControlPlanes, problems)

	problems = nil
	for _, n := range all {
		if err := facts[n.Name].versionOK; err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", n.Name, err))
		}
	}
	add(HealthApidReady, problems)

	// Talos' minimums (talosctl health's AllNodesMemorySizes and
	// AllNodesDiskSizes, pkg/cluster/check/nodes.go at v1.13.3) and no
	// active diagnostics: one problem per node that has one, its read
	// error first.
	perNode := func(name string, read func(f *nodeFacts) error, judge func(n HealthTarget, f *nodeFacts) string) {
		var problems []string
		for _, n := range all {
			f := facts[n.Name]
			if err := read(f); err != nil {
				problems = append(problems, fmt.Sprintf("%s: %s", n.Name, shortErr(err)))
			} else if p := judge(n, f); p != "" {
				problems = append(problems, p)
			}
		}
		add(name, problems)
	}
	perNode(HealthMemorySizes, func(f *nodeFacts) error { return f.memErr }, func(n HealthTarget, f *nodeFacts) string {
		if min := MinimumMemory(n.Role); f.memTotal < min {
			return fmt.Sprintf("node %s does not meet memory requirements: expected at least %d MiB, actual %d MiB", n.Name, min>>20, f.memTotal>>20)
		}
		return ""
	})
	perNode(HealthDiskSizes, func(f *nodeFacts) error { return f.ephErr }, func(n HealthTarget, f *nodeFacts) string {
		if f.ephemeral > 0 && f.ephemeral < MinimumEphemeral() {
			return fmt.Sprintf("the EPHEMERAL partition of %s is too small: expected at least %d MiB, actual %d MiB", n.Name, MinimumEphemeral()>>20, f.ephemeral>>20)
		}
		return ""
	})
	perNode(HealthNoDiagnostics, func(f *nodeFacts) error { return f.diagErr }, func(n HealthTarget, f *nodeFacts) string {
		if len(f.diags) > 0 {
			return fmt.Sprintf("%s: %s", n.Name, strings.Join(f.diags, ", "))
		}
		return ""
	})

	problems = nil
	for _, n := range cps {
		f := facts[n.Name]
		if f.svcErr != nil {
			problems = append(problems, fmt.Sprintf("%s: %s", n.Name, shortErr(f.svcErr)))
			continue
		}
		if s, ok := findService(f.svcs, "kubelet"); !ok || !s.Healthy {
			problems = append(problems, fmt.Sprintf("%s: kubelet %s %s", n.Name, s.State, s.LastEvent))
		}
	}
	add(HealthKubeletHealthy, problems)

	problems = nil
	for _, n := range all {
		f := facts[n.Name]
		switch {
		case f.stageErr != nil:
			problems = append(problems, fmt.Sprintf("%s: %s", n.Name, shortErr(f.stageErr)))
		case f.stage != StageRunning:
			problems = append(problems, fmt.Sprintf("%s: %s", n.Name, f.stage))
		}
	}
	add(HealthBootFinished, problems)
	return r
}

// etcdMembersAreControlPlanes judges HealthEtcdControlPlanes from the
// members firstNode listed (see talosSideHealth).
func etcdMembersAreControlPlanes(in HealthInput, cps []HealthTarget, facts map[string]*nodeFacts, firstNode string) []string {
	if firstNode == "" {
		return []string{"no control plane lists the etcd members"}
	}
	var problems, got, extra []string
	isCP := func(ip string) bool { return slices.ContainsFunc(cps, func(n HealthTarget) bool { return n.IP == ip }) }
	for _, m := range facts[firstNode].members {
		if m.Learner {
			problems = append(problems, m.Hostname+" is still a learner")
		}
		got = append(got, m.Hostname)
		// A member outside the control planes (one removed from the
		// config) is, like an unexpected Node, the user's to take out:
		// the waits tolerate it, the postcheck names the command.
		if !slices.ContainsFunc(m.IPs, isCP) {
			extra = append(extra, m.Hostname)
		}
	}
	var want, missing []string
	for _, n := range cps {
		want = append(want, n.Name)
		if !slices.ContainsFunc(facts[firstNode].members, func(m EtcdMember) bool { return slices.Contains(m.IPs, n.IP) }) {
			missing = append(missing, n.Name)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if len(missing) > 0 || len(extra) > 0 && !in.TolerateUnexpected {
		p := fmt.Sprintf("members %s, want the control planes %s", strings.Join(got, ", "), strings.Join(want, ", "))
		if len(missing) > 0 {
			p += " (no member at the address of " + strings.Join(missing, ", ") + ")"
		}
		if len(extra) > 0 {
			p += " (take " + strings.Join(extra, ", ") + " out with " + removeCommands(extra) + ")"
		}
		problems = append(problems, p)
	}
	return problems
}

// memberView is one control plane's view of the membership, comparable
// across nodes: id, hostname and learner state (EtcdConsistentAssertion).
func memberView(members []EtcdMember) []string {
	out := make([]string, 0, len(members))
	for _, m := range members {
		s := fmt.Sprintf("%s(%x)", m.Hostname, m.ID)
		if m.Learner {
			s += "[learner]"
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

func findService(svcs []Service, id string) (Service, bool) {
	i := slices.IndexFunc(svcs, func(s Service) bool { return s.ID == id })
	if i < 0 {
		return Service{}, false
	}
	return svcs[i], true
}

// staticPodsOn lists the static pods kubelet reports on a control plane
// (k8s.StaticPodStatus, "namespace/name-hostname").
func staticPodsOn(ctx context.Context, c *client.Client) ([]string, error) {
	list, err := safe.StateListAll[*k8s.StaticPodStatus](ctx, c.COSI)
	if err != nil {
		return nil, err
	}
	var out []string
	for p := range list.All() {
		out = append(out, p.Metadata().ID())
	}
	return out, nil
}

// MinimumMemory is the RAM Talos wants a node's kernel to report
// (MemTotal): 1848 MiB for a control plane and 1 GiB for a worker, each
// less 150 MiB the kernel keeps (pkg/minimal/limits.go Memory at v1.13.3,
// which talosctl health checks).
func MinimumMemory(r Role) uint64 {
	if r == RoleControlPlane {
		return (1848 - 150) << 20
	}
	return (1024 - 150) << 20
}

// MinimumEphemeral is the smallest EPHEMERAL partition talosctl health
// accepts: a 6 GiB disk (pkg/minimal DiskSize) less the EFI, STATE and
// META partitions and 10 MiB of GPT overhead (pkg/cluster/check/nodes.go
// AllNodesDiskSizes at v1.13.3, partition sizes from machinery's quirks).
func MinimumEphemeral() uint64 {
	ps := quirks.New("").PartitionSizes()
	return 6<<30 - (ps.UKIEFISize() + ps.StateSize() + ps.METASize() + 10<<20)
}

func memTotalOn(ctx context.Context, c *client.Client) (uint64, error) {
	resp, err := c.Memory(ctx)
	if err != nil {
		return 0, err
	}
	for _, m := range resp.GetMessages() {
		return m.GetMeminfo().GetMemtotal() * 1024, nil
	}
	return 0, errors.New("no memory information in the answer")
}

// ephemeralSizeOn reads the EPHEMERAL volume's size; a Talos that does
// not expose VolumeStatus (PermissionDenied, as talosctl health allows)
// reports 0.
func ephemeralSizeOn(ctx context.Context, c *client.Client) (uint64, error) {
	vs, err := safe.StateGetByID[*block.VolumeStatus](ctx, c.COSI, constants.EphemeralPartitionLabel)
	if err != nil {
		if client.StatusCode(err) == codes.PermissionDenied {
			return 0, nil
		}
		return 0, err
	}
	return vs.TypedSpec().Size, nil
}

// diagnosticsOn lists the node's active runtime diagnostics.
func diagnosticsOn(ctx context.Context, c *client.Client) ([]string, error) {
	list, err := safe.StateListAll[*runtime.Diagnostic](ctx, c.COSI)
	if err != nil {
		if client.StatusCode(err) == codes.PermissionDenied {
			return nil, nil
		}
		return nil, err
	}
	var out []string
	for d := range list.All() {
		out = append(out, d.TypedSpec().Message)
	}
	return out, nil
}
