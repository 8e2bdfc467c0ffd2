package postcheck

import (
	"strings"

	"github.com/homelab/bootstrap/check"
)

// CheckArchive is the row for the run's own archive: the nightly that
// cannot keep its evidence fails, or the night after has nothing to debug
// from. The stage runs it (it knows where the archive goes).
const CheckArchive = "archive"

// nextSteps says, per check, what a person does about a row that did not
// pass: the command to run or the place to look. The reason names the
// object (the node, the member, the Flux object); this names the way on.
var nextSteps = map[string]string{
	CheckKubeconfig:   "check the API server answers: kubectl --kubeconfig <(bootstrap kubeconfig) get --raw /readyz; an expired admin certificate is renewed by bootstrap run --stage talos",
	CheckNodesReady:   "kubectl --kubeconfig <(bootstrap kubeconfig) describe node NAME shows its conditions; talosctl -n IP service kubelet shows its kubelet",
	CheckDefaultClass: "bootstrap run --stage infra makes the configured class the only default (it removes the annotation from the others)",
	CheckFlux:         "flux get sources git -A and flux get kustomizations -A show the error; for an authentication failure check flux.auth, then bootstrap run --stage flux",
	CheckFluxObjects:  "flux get all -A shows each object's error; fix it in git (flux reconcile kustomization NAME --with-source re-reads it); a suspended object resumes with flux resume",
	CheckNFS:          "kubectl --kubeconfig <(bootstrap kubeconfig) -n nfs-provisioner get events and the provisioner's log; bootstrap run --stage precheck probes the export (exported, root squash, writable)",
	CheckEtcd:         "talosctl -n CONTROL-PLANE-IP etcd members and etcd status; a member that is gone or stuck: bootstrap node replace NAME",
	CheckTalosAPI:     "look at the node's console in Proxmox; talosctl -n IP version tells whether apid answers",
	CheckTalosHealth:  "talosctl -n IP health, and kubectl --kubeconfig <(bootstrap kubeconfig) -n kube-system get pods -o wide for the component named",
	CheckTalosVersion: "bootstrap run --stage talos upgrades the nodes to cluster.talosVersion (or set it to what runs)",
	CheckKubeVersion:  "bootstrap run --stage talos moves the API server and the kubelets to cluster.kubernetesVersion (or set it to what runs)",
	CheckCerts:        "bootstrap run --stage talos renews the talosconfig and kubeconfig client certificates in their last 30 days",
	CheckVMs:          "bootstrap run --stage provision starts a stopped VM (qm start VMID on the host does too); move a control plane to another member with qm migrate",
	CheckEtcdBackup:   "bootstrap backup takes one now and says why it cannot; ls ai/state/CLUSTER/etcd/ for the local ones, backup.s3 and backup.copyDir for the copies",
	CheckExtensions:   "bootstrap run --stage talos upgrades the node to the schematic's installer",
	CheckGuestAgent:   "qm agent VMID ping on the Proxmox host; the node's image must carry siderolabs/qemu-guest-agent (bootstrap run --stage talos)",
	CheckUserVolumes:  "talosctl -n IP get volumestatus u-NAME shows the phase and error, talosctl -n IP get disks the disks with their serials; a VM without the disk: qm config VMID, and the qm set command bootstrap run --stage provision prints",
	CheckSecurity:     "talosctl -n IP get securitystate and get volumestatus; Secure Boot or encryption cannot be switched under an installed node: bootstrap node replace NAME reinstalls it as the config says",
	CheckRunWarnings:  "the night's run.log (in its archive) has each warning with the lines around it",
	CheckArchive:      "df -h and ls -ld ai/state/CLUSTER/postcheck: free space, or make it a writable directory",
}

// Next is what to do about a check of cluster that did not pass ("" for a
// pass or an unknown check).
func Next(cluster, name string, st check.Status) string {
	if st == check.Pass {
		return ""
	}
	return strings.ReplaceAll(nextSteps[name], "CLUSTER", cluster)
}

// NextSeen is Next led by the cause the check saw (Observed.Causes): the
// thing to fix first is the one observed, the usual way on after it (or
// not at all when the cause says it does not apply).
func NextSeen(cluster, name string, st check.Status, cause Cause) string {
	next := Next(cluster, name, st)
	switch {
	case st == check.Pass || cause.Seen == "":
		return next
	case cause.Instead || next == "":
		return cause.Seen
	}
	return cause.Seen + "; else: " + next
}

// SetCauses leads each non-passing row's next with the cause its check saw
// (NextSeen).
func (r *Report) SetCauses(causes map[string]Cause) {
	for i, c := range r.Checks {
		if cause, ok := causes[c.Name]; ok {
			r.Checks[i].Next = NextSeen(r.Cluster, c.Name, c.Status, cause)
		}
	}
}

// WithNext returns the results with each non-passing reason followed by
// what to do next (led by the cause its check saw, NextSeen), for the
// table and the log a person reads. A reason quoting a multi-line message
// (a Flux condition's git error) is put on one line: the table has one row
// per check.
func WithNext(cluster string, results []check.Result, causes map[string]Cause) []check.Result {
	out := make([]check.Result, len(results))
	for i, r := range results {
		r.Reason = strings.Join(strings.Fields(r.Reason), " ")
		if next := NextSeen(cluster, r.Name, r.Status, causes[r.Name]); next != "" {
			r.Reason += " → next: " + next
		}
		out[i] = r
	}
	return out
}
