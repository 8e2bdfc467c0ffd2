package postcheck

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/talos"
)

// talosReport runs the cluster health once for the checks that read it.
func (c *checker) talosReport(ctx context.Context) talos.HealthReport {
	c.healthOnce.Do(func() { c.health = c.o.Talos.Health(ctx) })
	return c.health
}

// healthVerdict passes when every named assertion passed (or was skipped).
func (c *checker) healthVerdict(ctx context.Context, ok string, names ...string) (check.Status, string) {
	if c.o.Talos == nil {
		return check.Warnf("no talosconfig to reach the Talos API with")
	}
	r := c.talosReport(ctx)
	var failing []string
	for _, name := range names {
		h, found := r.Get(name)
		switch {
		case !found:
			failing = append(failing, name+": not checked")
		case !h.OK:
			failing = append(failing, name+": "+h.Detail)
		}
	}
	if len(failing) > 0 {
		return check.Failf("%s", strings.Join(failing, "; "))
	}
	return check.Passf("%s", ok)
}

func (c *checker) etcd(ctx context.Context) (check.Status, string) {
	cps := 0
	for _, n := range c.o.Nodes {
		if n.Role == "controlplane" {
			cps++
		}
	}
	return c.healthVerdict(ctx, fmt.Sprintf("etcd healthy with %d member(s), one per control plane, the same on every control plane", cps),
		talos.HealthEtcdHealthy, talos.HealthEtcdConsistent, talos.HealthEtcdControlPlanes)
}

func (c *checker) talosAPI(ctx context.Context) (check.Status, string) {
	return c.healthVerdict(ctx, fmt.Sprintf("Talos API answers on all %d node(s)", len(c.o.Nodes)), talos.HealthApidReady)
}

// talosHealth is the rest of `talosctl health`: Talos' memory and disk
// minimums, no diagnostics, boot sequences, kubelets, static pods,
// registration, kube-proxy and CoreDNS where deployed.
func (c *checker) talosHealth(ctx context.Context) (check.Status, string) {
	return c.healthVerdict(ctx, "every node has Talos' minimum memory and disk, no diagnostics, finished its boot sequence and is the config's; kubelet, control-plane static pods and components, kube-proxy and CoreDNS (where deployed) ready",
		talos.HealthMemorySizes, talos.HealthDiskSizes, talos.HealthNoDiagnostics,
		talos.HealthKubeletHealthy, talos.HealthBootFinished, talos.HealthK8sNodesReported, talos.HealthStaticPods, talos.HealthControlPlaneReady,
		talos.HealthKubeProxyReady, talos.HealthCoreDNSReady, talos.HealthK8sNodesSchedulable)
}

// talosVersion warns when a node runs another Talos than the config names.
func (c *checker) talosVersion(ctx context.Context) (check.Status, string) {
	if c.o.Talos == nil {
		return check.Warnf("no talosconfig to reach the Talos API with")
	}
	versions, err := c.o.Talos.Versions(ctx)
	if err != nil {
		return check.Warnf("reading node versions: %v", err)
	}
	if c.o.Observed != nil {
		c.o.Observed.TalosVersions = versions
	}
	var drift []string
	for _, n := range c.o.Nodes {
		if v := versions[n.Name]; v != "" && v != c.o.TalosVersion {
			drift = append(drift, fmt.Sprintf("%s runs %s", n.Name, v))
		}
	}
	sort.Strings(drift)
	if len(drift) > 0 {
		return check.Warnf("the config says %s but %s: run the talos stage to upgrade them, or set cluster.talosVersion to what runs", c.o.TalosVersion, strings.Join(drift, ", "))
	}
	return check.Passf("every node runs Talos %s", c.o.TalosVersion)
}

// extensions fails when a node does not run every extension of the
// schematic, or runs another schematic: what the ISO and the installer
// were built with is what must be loaded (a node left on an old image
// after an interrupted rollout shows here; the talos stage upgrades it).
func (c *checker) extensions(ctx context.Context) (check.Status, string) {
	if c.o.Talos == nil {
		return check.Warnf("no talosconfig to reach the Talos API with")
	}
	got, err := c.o.Talos.Extensions(ctx)
	if c.o.Observed != nil {
		c.o.Observed.Extensions = got
	}
	if err != nil {
		// The nodes that did not answer.
		var silent []string
		for _, n := range c.o.Nodes {
			if _, ok := got[n.Name]; !ok {
				silent = append(silent, n.Name)
			}
		}
		c.vmsDown(ctx, CheckExtensions, silent)
		return check.Failf("reading the nodes' extensions: %v", err)
	}
	var bad, badNodes []string
	for _, n := range c.o.Nodes {
		before := len(bad)
		have := map[string]string{}
		for _, e := range got[n.Name] {
			have[e.Name] = e.Version
		}
		var missing []string
		for _, want := range c.o.Extensions {
			if _, ok := have[want]; !ok {
				missing = append(missing, want)
			}
		}
		if len(missing) > 0 {
			bad = append(bad, fmt.Sprintf("%s lacks %s", n.Name, strings.Join(missing, ", ")))
		}
		if have := talos.SchematicOf(got[n.Name]); c.o.Schematic != "" && have != c.o.Schematic {
			same, err := false, error(nil)
			if c.o.SameSchematic != nil && have != "" {
				same, err = c.o.SameSchematic(ctx, have)
			}
			switch {
			case err != nil:
				bad = append(bad, fmt.Sprintf("%s runs schematic %.12s, not %.12s (%v)", n.Name, have, c.o.Schematic, err))
			case !same:
				bad = append(bad, fmt.Sprintf("%s runs schematic %q, not %.12s", n.Name, have, c.o.Schematic))
			}
		}
		if len(bad) > before {
			badNodes = append(badNodes, n.Name)
		}
	}
	if len(bad) > 0 {
		c.vmsDown(ctx, CheckExtensions, badNodes)
		return check.Failf("%s: run the talos stage (it upgrades nodes to the schematic's installer)", strings.Join(bad, "; "))
	}
	if len(c.o.Extensions) == 0 {
		return check.Passf("no system extensions wanted")
	}
	return check.Passf("every node runs %s", strings.Join(c.o.Extensions, ", "))
}

// vmsDown records as the cause of row name's failure the VMs of nodes
// that Proxmox says are not running, from the VM row's reading: a node
// that is off answers nothing, and no upgrade brings it back. When every
// one of nodes is such a node, the row's usual next does not apply.
func (c *checker) vmsDown(ctx context.Context, name string, nodes []string) {
	if c.o.Proxmox == nil {
		return
	}
	st, err := c.vmState(ctx)
	if err != nil || len(st.Down) == 0 {
		return
	}
	var down []string
	all := true
	for _, n := range c.o.Nodes {
		if !slices.Contains(nodes, n.Name) {
			continue
		}
		if s, ok := st.Down[n.Name]; ok {
			down = append(down, fmt.Sprintf("%s is %s", n.Name, s))
		} else {
			all = false
		}
	}
	if len(down) == 0 {
		return
	}
	c.saw(name, Cause{Instead: all,
		Seen: fmt.Sprintf("Proxmox says the VM of %s: start it (bootstrap run --stage provision, or qm start VMID on its host), then run the postcheck again", strings.Join(down, ", "))})
}
