package state

import "time"

// Outputs are the facts one stage records for later stages and for
// `bootstrap status`. Each section belongs to one stage.
type Outputs struct {
	// Nodes by name, recorded by provision (VM facts) and talos (config facts).
	Nodes       map[string]Node `json:"nodes,omitempty"`
	Talos       Talos           `json:"talos,omitzero"`
	Infra       Infra           `json:"infra,omitzero"`
	Flux        Flux            `json:"flux,omitzero"`
	GitSnapshot GitSnapshot     `json:"git_snapshot,omitzero"`
	Postcheck   *Postcheck      `json:"postcheck,omitempty"`
	// Replacing names the node `bootstrap node replace` took out and has
	// not yet seen created again: a resumed replace goes on with the
	// stages instead of taking the new VM out.
	Replacing string `json:"replacing,omitempty"`
}

// Node is what is known about one cluster node.
type Node struct {
	Name string `json:"name"`
	Role string `json:"role"`
	VMID int    `json:"vmid,omitempty"`
	IP   string `json:"ip,omitempty"`
	MAC  string `json:"mac,omitempty"`
	// Host is the Proxmox member that ran the VM when provision last
	// planned it.
	Host string `json:"host,omitempty"`
	// DiskBus is the bus of the VM's install disk ("scsi", "virtio"); the
	// talos stage derives the install disk from it.
	DiskBus string `json:"disk_bus,omitempty"`
	// InstallDisk is the device the node's config installs to.
	InstallDisk string `json:"install_disk,omitempty"`
	// ConfigSHA256 is the hash of the machine config last applied to the node.
	ConfigSHA256 string    `json:"config_sha256,omitempty"`
	AppliedAt    time.Time `json:"applied_at,omitzero"`
	// TalosVersion is the Talos version the node reported when the talos
	// stage last converged it.
	TalosVersion string `json:"talos_version,omitempty"`
	// KubernetesVersion is the Kubernetes version the talos stage last
	// took the node to (every component; without a leading "v").
	KubernetesVersion string `json:"kubernetes_version,omitempty"`
}

// Talos records the talos stage's outputs.
type Talos struct {
	SecretsPath     string `json:"secrets_path,omitempty"`
	TalosconfigPath string `json:"talosconfig_path,omitempty"`
	KubeconfigPath  string `json:"kubeconfig_path,omitempty"`
	// BootstrapNode is the control plane etcd was bootstrapped on.
	BootstrapNode  string    `json:"bootstrap_node,omitempty"`
	BootstrappedAt time.Time `json:"bootstrapped_at,omitzero"`
	// Restore is the last `bootstrap restore`: written before the snapshot
	// is uploaded, so a killed restore resumes instead of refusing the etcd
	// it started.
	Restore *Restore `json:"restore,omitempty"`
	// FirstTalosVersion is the Talos version the cluster's configs were
	// first rendered for (for a state older than this field, the oldest a
	// node ran): a cluster made before v1.14 keeps workload isolation off
	// after upgrading, as Talos itself does.
	FirstTalosVersion string `json:"first_talos_version,omitempty"`
	// ManifestSync is the Kubernetes version whose bootstrap manifests
	// (kube-proxy, CoreDNS) still have to be synced: set before a
	// Kubernetes rollout, cleared once the sync applied, so a killed run
	// syncs on resume.
	ManifestSync string `json:"manifest_sync,omitempty"`
}

// Restore records one etcd restore.
type Restore struct {
	From string `json:"from"`
	// SHA256 is the snapshot's own digest (its last 32 bytes).
	SHA256   string `json:"sha256"`
	Revision int64  `json:"revision"`
	// Forced: the etcd that ran was wiped for this restore (--force);
	// Bootstrapped: etcd was started from the snapshot.
	Forced       bool      `json:"forced,omitempty"`
	Bootstrapped bool      `json:"bootstrapped,omitempty"`
	Started      time.Time `json:"started"`
	Finished     time.Time `json:"finished,omitzero"`
}

// Infra records the infra stage's outputs.
type Infra struct {
	CNI          string `json:"cni,omitempty"`
	Release      string `json:"release,omitempty"`
	Namespace    string `json:"namespace,omitempty"`
	ChartVersion string `json:"chart_version,omitempty"`
	Revision     int    `json:"revision,omitempty"`
	StorageClass string `json:"storage_class,omitempty"`
}

// Flux records the flux stage's outputs.
type Flux struct {
	Version  string `json:"version,omitempty"`
	URL      string `json:"url,omitempty"`
	Branch   string `json:"branch,omitempty"`
	Path     string `json:"path,omitempty"`
	Revision string `json:"revision,omitempty"`
}

// GitSnapshot records a detached local git snapshot server.
type GitSnapshot struct {
	PID     int       `json:"pid,omitempty"`
	Listen  string    `json:"listen,omitempty"`
	URL     string    `json:"url,omitempty"`
	Hash    string    `json:"hash,omitempty"`
	Started time.Time `json:"started,omitzero"`
	// Withheld names the files the snapshot leaves out, each with its rule
	// ("infra/x.yaml (unencrypted Secret)"), never their content.
	Withheld []string `json:"withheld,omitempty"`
}

// Postcheck summarises the last postcheck.
type Postcheck struct {
	Overall         string    `json:"overall"`
	Started         time.Time `json:"started"`
	DurationSeconds float64   `json:"duration_seconds"`
	Passed          int       `json:"passed"`
	Warned          int       `json:"warned"`
	Failed          int       `json:"failed"`
	Archive         string    `json:"archive,omitempty"`
	// Page is the history page the postcheck rewrote
	// (ai/state/<cluster>/postcheck/index.html).
	Page string `json:"page,omitempty"`
	// Unsent names the notifications (notify.Label: position and
	// service) that were due and could not be sent: the next run sends
	// them again, whatever its result, until they go through.
	Unsent []string `json:"unsent,omitempty"`
}
