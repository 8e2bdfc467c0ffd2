package config

// Config is one cluster's bootstrap configuration (bootstrap.yaml).
// Field docs below feed `bootstrap config schema`. A field naming a file
// carries path:"file" (resolved against the config's directory, rebased
// through extends); one naming a file that holds a credential also carries
// secret:"file", and everything that keeps credentials safe derives from
// that mark (CredentialFiles): the 0600 check, log masking and the paths
// a git snapshot never serves.
type Config struct {
	Cluster   Cluster   `yaml:"cluster" doc:"The Talos/Kubernetes cluster."`
	Proxmox   Proxmox   `yaml:"proxmox" doc:"The Proxmox VE host the VMs run on."`
	Nodes     []Node    `yaml:"nodes" doc:"The cluster's VMs: at least one control plane."`
	Storage   Storage   `yaml:"storage" doc:"Persistent storage for the cluster."`
	CNI       CNI       `yaml:"cni" doc:"The pod network."`
	Flux      Flux      `yaml:"flux" doc:"GitOps with Flux."`
	Postcheck Postcheck `yaml:"postcheck" doc:"Exit-criteria checks run after the pipeline and nightly."`
	Backup    Backup    `yaml:"backup" doc:"etcd snapshots: taken by the postcheck (nightly), by bootstrap backup and before an upgrade."`
	Secrets   Secrets   `yaml:"secrets" doc:"How the cluster's secrets are kept at rest (SOPS with age)."`
	State     StateDirs `yaml:"state" doc:"Where generated files, run state and logs live."`

	src *source
}

// Cluster describes the Talos cluster.
type Cluster struct {
	Name              string `yaml:"name" doc:"Cluster name (DNS label); names .talos/<name> and ai/state/<name>. Env: TALOS_CLUSTER_NAME."`
	Endpoint          string `yaml:"endpoint" doc:"Kubernetes API endpoint, https://<vip or control plane IP>:6443."`
	VIP               string `yaml:"vip" doc:"Optional shared control-plane address (Talos Layer2 VIP); must be the endpoint's host."`
	TalosVersion      string `yaml:"talosVersion" doc:"Talos version of the ISO and installer, e.g. v1.13.3."`
	KubernetesVersion string `yaml:"kubernetesVersion" doc:"Kubernetes version, e.g. 1.36.1."`
	InstallImage      string `yaml:"installImage" doc:"Talos installer image; empty derives the factory's nocloud installer of cluster.schematic for talosVersion."`
	// Schematic is what the nodes' Talos carries besides the base image;
	// the ISO and the installer are both derived from it, so they agree.
	Schematic Schematic `yaml:"schematic" doc:"Image Factory customization of the ISO and the installer: system extensions and kernel arguments."`
	Factory   string    `yaml:"factory" doc:"Image Factory base URL (a self-hosted one works too)."`
	// FactoryCAFile verifies a self-hosted factory with a private CA.
	FactoryCAFile string   `yaml:"factoryCAFile" path:"file" doc:"CA file to verify the Image Factory's certificate with (default: the system's roots)."`
	Network       Network  `yaml:"network" doc:"The node network (static addresses via cloud-init nocloud)."`
	Patches       Patches  `yaml:"patches" doc:"Talos config patch files, applied common → role → node."`
	SANs          []string `yaml:"certSANs" doc:"Extra names/IPs for the API server and Talos API certificates."`
	// AllowSchedulingOnControlPlanes lets workloads run on control planes
	// (needed when there are no workers).
	AllowSchedulingOnControlPlanes bool `yaml:"allowSchedulingOnControlPlanes" doc:"Run workloads on control planes too (automatic when there are no workers)."`
	// MergeConfigs merges the talosconfig and kubeconfig into ~/.talos/config and ~/.kube/config.
	MergeConfigs bool `yaml:"mergeConfigs" doc:"Merge talosconfig into ~/.talos/config and kubeconfig into ~/.kube/config (backed up first)."`
	// Parallelism bounds how many nodes the talos stage configures at once.
	Parallelism int `yaml:"parallelism" doc:"How many nodes the talos stage configures (installs, reboots) at once; 0 means all."`
	// ServiceAccountKey is the kind of key Kubernetes signs service
	// account tokens with, chosen once, when the secrets bundle is made.
	ServiceAccountKey string `yaml:"serviceAccountKey" enum:"rsa,ecdsa" doc:"Key Kubernetes signs service account tokens with, chosen when the secrets bundle is generated (never changed after): rsa (default, as talosctl gen secrets makes it since Talos 1.7: some external systems, e.g. AWS IAM roles for service accounts, accept only RSA-signed tokens) or ecdsa (generated in a millisecond instead of up to seconds)."`
	// UpgradeParallelism speeds up large worker pools; control planes are
	// upgraded one at a time whatever it says (etcd keeps its quorum).
	UpgradeParallelism int `yaml:"upgradeParallelism" doc:"How many workers a Talos upgrade moves at once (control planes: always one)."`
	// Encryption is every node's default for nodes[].encryption.
	Encryption string `yaml:"encryption" enum:"none,tpm" doc:"Talos encryption of every node's STATE and EPHEMERAL volumes: none (default) or tpm (LUKS2 with the key sealed by the VM's TPM, bound to Secure Boot: every node then needs vm.secureBoot on); nodes[].encryption overrides it per node."`
	// Timeouts bound the talos stage's waits; slow hardware raises them.
	Timeouts TalosTimeouts `yaml:"timeouts" doc:"Bounds on the talos stage's waits (raise them for slow disks or networks)."`
}

// Schematic is the Image Factory customization the nodes' images carry.
type Schematic struct {
	Extensions      []string `yaml:"extensions" doc:"Official system extensions by factory name, e.g. siderolabs/qemu-guest-agent (the VM gets agent: 1 only with it)."`
	ExtraKernelArgs []string `yaml:"extraKernelArgs" doc:"Extra kernel arguments baked into the ISO and the installer."`
}

// TalosTimeouts bound the waits of the talos stage and of the Talos checks.
type TalosTimeouts struct {
	Call      Duration `yaml:"call" doc:"Bound on one Talos API call."`
	Install   Duration `yaml:"install" doc:"Bound on a node's maintenance apply → install → reboot → configured."`
	Reboot    Duration `yaml:"reboot" doc:"Bound on a reboot after a configured node's config changed."`
	Bootstrap Duration `yaml:"bootstrap" doc:"Bound on waiting for the etcd bootstrap to be accepted."`
	Health    Duration `yaml:"health" doc:"Bound on waiting for etcd membership, service health and the Kubernetes API."`
}

// Network is the node network.
type Network struct {
	CIDR        string   `yaml:"cidr" doc:"Node network in CIDR form, e.g. 10.0.20.0/24."`
	Gateway     string   `yaml:"gateway" doc:"Default gateway inside the CIDR."`
	Nameservers []string `yaml:"nameservers" doc:"DNS servers for the nodes."`
}

// Patches lists Talos machine-config patch files (strategic merge).
type Patches struct {
	All          []string            `yaml:"all" path:"file" doc:"Patch files for every node."`
	ControlPlane []string            `yaml:"controlplane" path:"file" doc:"Patch files for control planes."`
	Worker       []string            `yaml:"worker" path:"file" doc:"Patch files for workers."`
	Nodes        map[string][]string `yaml:"nodes" path:"file" doc:"Patch files per node name."`
}

// Proxmox is the Proxmox VE host and where VMs go on it.
type Proxmox struct {
	URL             string   `yaml:"url" doc:"API URL, e.g. https://pve.lan:8006/api2/json."`
	Node            string   `yaml:"node" doc:"Proxmox node name, e.g. pve: the member the API URL reaches, and where VMs go when hosts is empty."`
	HA              bool     `yaml:"ha" doc:"Make every VM a Proxmox HA resource (state started) so HA restarts it, on another member when its host fails; needs Sys.Console on / and, to recover from a lost host, disks and ISO on shared storage."`
	Hosts           []string `yaml:"hosts" doc:"Proxmox cluster members to spread the VMs over (control planes on distinct members, workers by free memory); empty: every VM on node. A VM found on another member (migrated) is adopted where it is."`
	TokenID         string   `yaml:"tokenID" doc:"API token id user@realm!name; the secret comes from PROXMOX_TOKEN_SECRET or tokenSecretFile, never from this file."`
	TokenSecretFile string   `yaml:"tokenSecretFile" path:"file" secret:"file" doc:"File holding the API token secret (used when PROXMOX_TOKEN_SECRET is unset)."`
	TLSFingerprint  string   `yaml:"tlsFingerprint" doc:"SHA-256 fingerprint of the Proxmox certificate (as the GUI shows it) to pin."`
	CAFile          string   `yaml:"caFile" path:"file" doc:"CA file to verify the Proxmox certificate with, instead of a fingerprint."`
	Insecure        bool     `yaml:"insecure" doc:"Skip TLS verification (not recommended; warned loudly)."`
	DiskStorage     string   `yaml:"diskStorage" doc:"Storage for VM disks and cloud-init drives (content 'images')."`
	ISOStorage      string   `yaml:"isoStorage" doc:"Storage for the Talos ISO (content 'iso')."`
	Bridge          string   `yaml:"bridge" doc:"Bridge for the VMs' network, e.g. vmbr0."`
	VLAN            int      `yaml:"vlan" doc:"VLAN tag for the VMs (0 = untagged); the bridge must be VLAN-aware."`
	CPU             string   `yaml:"cpu" enum:"host,x86-64-v2,x86-64-v2-AES,x86-64-v3,x86-64-v4" doc:"CPU type of new VMs: host (default) passes the host's CPU through, fastest, but a live migration to a member with another CPU can stop the guest; x86-64-v2-AES (Proxmox's own default) or another generic x86-64 level migrates between any members that have it. A VM that exists keeps its type: the run reports the difference."`
	VM              VMShape  `yaml:"vm" doc:"The hardware of new VMs; each field may be set again per role (roleVM) and per node (nodes[].vm). The defaults are Talos' Proxmox guide's baseline VM."`
	RoleVM          RoleVM   `yaml:"roleVM" doc:"The hardware of one role's new VMs where it differs from vm (an empty field takes vm's); a node's own vm wins over its role's."`
	ISO             ISO      `yaml:"iso" doc:"The Talos nocloud ISO."`
	Boot            string   `yaml:"boot" enum:"auto,image,iso" doc:"How new VMs get Talos: image imports the Image Factory's nocloud disk image of cluster.schematic as each VM's disk (Proxmox VE 8.4+, a storage with the 'import' content type; no install, no reboot), iso boots the nocloud ISO and installs to disk; auto (default) takes the image where the host allows it, else the ISO, and the precheck says which and why."`
	Parallelism     int      `yaml:"parallelism" doc:"How many VMs to create/start at once."`
	TaskTimeout     Duration `yaml:"taskTimeout" doc:"Bound on one Proxmox task (create, start, download)."`
	BootTimeout     Duration `yaml:"bootTimeout" doc:"Bound on the wait for every node's Talos API in maintenance mode."`
}

// ISO is the Talos boot image on the ISO storage.
type ISO struct {
	URL      string `yaml:"url" doc:"Where to download the ISO from when missing; empty derives the factory's nocloud ISO of cluster.schematic."`
	File     string `yaml:"file" doc:"File name on the ISO storage; empty derives talos-<version>-<schematic>-nocloud-amd64.iso."`
	Checksum string `yaml:"checksum" doc:"Checksum of the download, <algorithm>:<hex> (sha256, sha512)."`
}

// Node is one VM of the cluster.
type Node struct {
	Name      string  `yaml:"name" doc:"Node and VM name (DNS label)."`
	Role      string  `yaml:"role" enum:"controlplane,worker" doc:"controlplane or worker."`
	VMID      int     `yaml:"vmid" doc:"Proxmox VMID (100-999999999), owned by this cluster."`
	IP        string  `yaml:"ip" doc:"Static IPv4 address inside cluster.network.cidr."`
	Cores     int     `yaml:"cores" doc:"vCPUs."`
	MemoryMiB int     `yaml:"memoryMiB" doc:"Memory in MiB (Talos needs at least 2048 for a control plane)."`
	DiskGiB   int     `yaml:"diskGiB" doc:"Install disk size in GiB (at least 10)."`
	MAC       string  `yaml:"mac" doc:"Optional MAC; empty derives a stable locally administered one from cluster+node."`
	Host      string  `yaml:"host" doc:"Optional Proxmox member to create this VM on (one of proxmox.hosts, or proxmox.node); empty places it automatically."`
	VM        VMShape `yaml:"vm" doc:"This node's VM hardware where it differs from proxmox.vm (an empty field takes proxmox.vm's)."`
	// Encryption is Talos' side, not the VM's: the VolumeConfig documents
	// of the node's machine config (see secureboot.go).
	Encryption string `yaml:"encryption" enum:"none,tpm" doc:"Talos encryption of this node's STATE and EPHEMERAL volumes where it differs from cluster.encryption: none, or tpm (LUKS2, the key sealed by the VM's TPM; needs vm.secureBoot on and vm.tpm on). Set before the node is installed: Talos does not encrypt a volume that exists."`
}

// VMShape is the hardware of a new VM: Talos' Proxmox guide's baseline
// by default (the Talos docs' proxmox.mdx, "VM resource requirements",
// v1.13 and v1.14). A VM that exists keeps what it was created with: the
// provision stage reports a difference and never changes it.
type VMShape struct {
	BIOS       string `yaml:"bios" enum:"ovmf,seabios" doc:"Firmware: ovmf (UEFI, default; the VM gets a 4 MiB EFI disk without pre-enrolled keys, as Talos' guide says) or seabios."`
	Machine    string `yaml:"machine" doc:"QEMU machine type: q35 (default), pc (i440fx), or a versioned type such as pc-q35-9.2+pve1 that pins it."`
	SCSIHW     string `yaml:"scsihw" enum:"virtio-scsi-pci,virtio-scsi-single" doc:"SCSI controller of the install disk: virtio-scsi-pci (default; Talos' guide warns against VirtIO SCSI single after installs that hung, siderolabs/talos#11173) or virtio-scsi-single (gives the disk an IO thread)."`
	Cache      string `yaml:"cache" enum:"writethrough,none,writeback,directsync,unsafe" doc:"Cache mode of the install disk: writethrough (default, Talos' guide), none (the guide's choice for clustered storage), or another of Proxmox's modes."`
	Ballooning string `yaml:"ballooning" enum:"off,on" doc:"Memory ballooning device: off (default; Talos does not support memory hotplug and would not see all of its memory) or on."`
	RNG        string `yaml:"rng" enum:"off,on" doc:"A VirtIO RNG fed from the host's /dev/urandom: off (default) or on (Talos' guide: optional, better entropy)."`
	// SecureBoot and TPM are the firmware side of Talos' Trusted Boot
	// (see secureboot.go): the Secure Boot ISO and installer, and a
	// TPM 2.0 the volume encryption seals its key with.
	SecureBoot string `yaml:"secureBoot" enum:"off,on" doc:"Secure Boot: off (default) or on: the VM boots the Image Factory's Secure Boot ISO of cluster.schematic, which enrolls Sidero Labs' keys into the EFI disk (created without pre-enrolled keys, in setup mode), and installs with the Secure Boot installer; needs bios ovmf and the ISO (never proxmox.boot image). Switching it on an installed node needs a reinstall (bootstrap node replace)."`
	TPM        string `yaml:"tpm" enum:"off,on" doc:"A virtual TPM 2.0 (tpmstate0, 4 MiB on proxmox.diskStorage): default on with secureBoot on, else off. Needed by encryption tpm."`
	CPU        string `yaml:"cpu" enum:"host,x86-64-v2,x86-64-v2-AES,x86-64-v3,x86-64-v4" doc:"CPU type where it differs from proxmox.cpu (which it overrides, in proxmox.vm too)."`
	// CPUFlags are the VM-specific flags Proxmox lets a token set.
	CPUFlags []string `yaml:"cpuFlags" doc:"CPU flags to enable (+flag) or disable (-flag), from the set Proxmox allows per VM: aes, amd-no-ssb, amd-ssbd, hv-evmcs, hv-tlbflush, ibpb, md-clear, pcid, pdpe1gb, spec-ctrl, ssbd, virt-ssbd, and nested-virt from Proxmox VE 9.1; e.g. [+aes, +pdpe1gb]."`
	// Disks and NICs are lists: a node's non-empty list replaces
	// proxmox.vm's whole list (VMShapeOf), it does not merge with it.
	Disks []VMDisk `yaml:"disks" doc:"Extra disks besides the install disk (scsi0), e.g. for Longhorn, Rook or OpenEBS; a role's (roleVM) or node's non-empty list replaces the wider one's. Each gets a Proxmox serial derived from cluster, node and disk name, which a user volume selects it by."`
	NICs  []VMNIC  `yaml:"nics" doc:"Extra network interfaces besides net0 (net1, net2, … in this order), e.g. a storage network; a role's (roleVM) or node's non-empty list replaces the wider one's."`
	// PCI are host devices passed by resource mapping (validate_pci.go).
	PCI []PCIDevice `yaml:"pci" doc:"Host PCI devices passed through to the VM (an iGPU for transcoding, a NIC, an HBA), each by a Proxmox resource mapping (Datacenter → Resource Mappings); raw host addresses are not offered (Proxmox lets only root@pam set them). A list replaces the one it would inherit; an empty list clears it. At most 16."`
}

// VMDisk is one extra disk of a VM.
type VMDisk struct {
	Name    string `yaml:"name" doc:"Disk name (lowercase letters, digits and '-', at most 34 characters), unique per node; a user volume is called this (Talos: u-<name>, mounted at /var/mnt/<name>)."`
	SizeGiB int    `yaml:"sizeGiB" doc:"Size in GiB (at least 1)."`
	Storage string `yaml:"storage" doc:"Proxmox storage for the disk (content 'images'); empty: proxmox.diskStorage."`
	Bus     string `yaml:"bus" enum:"scsi,virtio,sata" doc:"scsi (default: on the VM's SCSI controller, scsi1 and up), virtio (virtio-blk, virtio0 and up) or sata (sata0 and up)."`
	Volume  string `yaml:"volume" enum:"raw,user" doc:"raw (default): Talos leaves the disk alone, for software that takes a whole block device (Rook/Ceph OSDs, OpenEBS Mayastor); user: Talos formats the whole disk (xfs) as a user volume and mounts it at /var/mnt/<name> (Longhorn, OpenEBS LocalPV)."`
}

// VMNIC is one extra network interface of a VM.
type VMNIC struct {
	Bridge   string `yaml:"bridge" doc:"Bridge (or SDN VNet) of the interface; empty: proxmox.bridge."`
	VLAN     int    `yaml:"vlan" doc:"VLAN tag (1-4094; 0 = untagged); a tagged NIC needs a VLAN-aware bridge that carries it."`
	MTU      int    `yaml:"mtu" doc:"MTU of the VirtIO NIC: 0 (default) leaves it to Proxmox, 1 takes the bridge's MTU, else 576-65520 (Proxmox refuses to start the VM when it exceeds the bridge's MTU)."`
	Firewall bool   `yaml:"firewall" doc:"Put the interface behind the Proxmox firewall (firewall=1)."`
	IP       string `yaml:"ip" doc:"Address of the interface through cloud-init: a static IPv4 address with prefix (10.0.30.21/24, only under nodes[].vm), dhcp, or empty for none. No gateway: the default route stays on net0."`
}

// PCIDevice is one host PCI device of a VM, by its Proxmox resource
// mapping: qemu-server's hostpci<N> with mapping=<id> (qemu-server 9.2.6
// and 8.4.10 src/PVE/QemuServer/PCI.pm $hostpci_fmt).
type PCIDevice struct {
	Mapping    string `yaml:"mapping" doc:"ID of the cluster-wide PCI resource mapping, e.g. igpu (letters, digits, '-' and '_', starting with a letter); it must have an entry for the member the VM runs on."`
	PCIe       string `yaml:"pcie" enum:"on,off" doc:"Put the device on the PCI Express bus: on by default with a q35 machine (Proxmox refuses it on pc/i440fx), off otherwise."`
	PrimaryGPU bool   `yaml:"primaryGPU" doc:"Make the device the VM's primary GPU (x-vga): the VM's emulated display is dropped, so the Proxmox console shows nothing. Not needed for transcoding; at most one per VM."`
	ROMBar     string `yaml:"rombar" enum:"on,off" doc:"Show the device's option ROM in the guest's memory map: on (Proxmox's default) or off."`
	MDev       string `yaml:"mdev" doc:"Mediated device type to create on the mapped device at start (one of the types Proxmox lists for the device); the mapping must be marked for mediated devices. Empty passes the device itself."`
}

// RoleVM is the hardware of each role's new VMs (proxmox.roleVM).
type RoleVM struct {
	ControlPlane VMShape `yaml:"controlplane" doc:"The control planes' VM hardware where it differs from proxmox.vm."`
	Worker       VMShape `yaml:"worker" doc:"The workers' VM hardware where it differs from proxmox.vm."`
}

// Storage holds the storage settings.
type Storage struct {
	NFS NFS `yaml:"nfs" doc:"NFS dynamic provisioning (nfs-subdir-external-provisioner)."`
}

// NFS configures the NFS export and its provisioner.
type NFS struct {
	Server          string   `yaml:"server" doc:"NFS server host or IP."`
	Path            string   `yaml:"path" doc:"Exported path, e.g. /export/k8s."`
	MountOptions    []string `yaml:"mountOptions" doc:"Mount options for provisioned volumes, e.g. nfsvers=4.1."`
	StorageClass    string   `yaml:"storageClass" doc:"Name of the StorageClass made the only default."`
	ReclaimPolicy   string   `yaml:"reclaimPolicy" enum:"Delete,Retain" doc:"Delete or Retain."`
	ArchiveOnDelete bool     `yaml:"archiveOnDelete" doc:"Keep a volume's directory (renamed archived-*) when it is deleted."`
	ChartRepo       string   `yaml:"chartRepo" doc:"Helm repository of nfs-subdir-external-provisioner."`
	ChartVersion    string   `yaml:"chartVersion" doc:"Chart version to pin."`
	ValuesFile      string   `yaml:"valuesFile" path:"file" doc:"Optional Helm values file merged on top of the generated values."`
	Probe           NFSProbe `yaml:"probe" doc:"How precheck probes the export."`
}

// NFSProbe configures the precheck's NFS probe.
type NFSProbe struct {
	WriteTest      bool     `yaml:"writeTest" doc:"Create and remove a file on the export to catch root squashing."`
	PortmapperPort int      `yaml:"portmapperPort" doc:"Portmapper port (111)."`
	MountPort      int      `yaml:"mountPort" doc:"Fixed MOUNT port; 0 asks the portmapper."`
	NFSPort        int      `yaml:"nfsPort" doc:"Fixed NFS port; 0 asks the portmapper."`
	Timeout        Duration `yaml:"timeout" doc:"Deadline for the whole probe."`
}

// CNI selects the pod network.
type CNI struct {
	Name   string `yaml:"name" enum:"flannel,cilium,none" doc:"flannel (Talos default, nothing to install), cilium, or none (bring your own: the infra stage stops until a CNI is installed, then waits up to 5 min for its agents to make the nodes Ready)."`
	Cilium Cilium `yaml:"cilium" doc:"Cilium chart settings, used when name is cilium."`
}

// TalosDeploysCNI reports whether Talos deploys the CNI itself (flannel).
// With cilium or none the nodes run no CNI until one is installed on the
// cluster: they stay NotReady and CoreDNS cannot run, so the health wait
// skips both as `talosctl health` does (talos pkg/cluster/check
// default.go, cniDisabledStatus, v1.13.3).
func (c CNI) TalosDeploysCNI() bool { return c.Name == "" || c.Name == "flannel" }

// Cilium is the Cilium Helm chart.
type Cilium struct {
	ChartRepo    string `yaml:"chartRepo" doc:"Helm repository of Cilium."`
	ChartVersion string `yaml:"chartVersion" doc:"Cilium chart version."`
	ValuesFile   string `yaml:"valuesFile" path:"file" doc:"Optional values merged on top (kube-proxy replacement is always on; operator.replicas may not exceed the node count)."`
}

// Flux configures GitOps.
type Flux struct {
	Repo          string         `yaml:"repo" doc:"Git repository URL (http, https or ssh) Flux syncs from. Env: GIT_REPO."`
	Branch        string         `yaml:"branch" doc:"Branch to sync. Env: GIT_BRANCH."`
	Path          string         `yaml:"path" doc:"Path inside the repository to apply."`
	Version       string         `yaml:"version" doc:"Flux version to install."`
	Manifests     string         `yaml:"manifests" doc:"Flux install manifests: empty for the release download, a mirror URL of manifests.tar.gz, or a local tarball/directory."`
	Components    []string       `yaml:"components" doc:"Flux controllers to install."`
	Interval      Duration       `yaml:"interval" doc:"Reconcile interval of the GitRepository and Kustomization."`
	Auth          FluxAuth       `yaml:"auth" doc:"Credentials for a private remote repository."`
	LocalSnapshot LocalSnapshot  `yaml:"localSnapshot" doc:"Serve a snapshot of a local git work tree for the cluster to pull."`
	Timeout       Duration       `yaml:"timeout" doc:"Bound on the wait for Flux to become Ready."`
	Decryption    FluxDecryption `yaml:"decryption" doc:"SOPS decryption of the repository's encrypted manifests by kustomize-controller."`
}

// FluxDecryption hands the age identity of secrets.age to Flux.
type FluxDecryption struct {
	Enabled bool `yaml:"enabled" doc:"Create the Secret sops-age in flux-system holding the age identities that open the SOPS files under flux.path (or, with none yet, secrets.age.recipients), taken from secrets.age.keyFile or where the sops CLI looks (as identity.agekey: kustomize-controller only reads keys ending in .agekey), and set the Kustomization's decryption to provider sops with it. The precheck decrypts one SOPS file under flux.path with exactly those identities first."`
}

// Secrets says how secrets are kept at rest.
type Secrets struct {
	Age Age `yaml:"age" doc:"age keys for SOPS."`
}

// Age names age recipients and the identity file; never a key itself.
type Age struct {
	Recipients []string `yaml:"recipients" doc:"age public keys (age1…). When set, .talos/<cluster>/secrets.yaml is stored SOPS-encrypted to them (the sops CLI reads and writes it) and is only ever decrypted in memory, and the configs, talosconfig and kubeconfig derived from it are kept age-encrypted to them (<name>.age); bootstrap secrets encrypt migrates plaintext ones."`
	KeyFile    string   `yaml:"keyFile" path:"file" secret:"file" doc:"age identity file (AGE-SECRET-KEY-1…) that decrypts; empty: every identity in $SOPS_AGE_KEY, $SOPS_AGE_KEY_FILE, the output of $SOPS_AGE_KEY_CMD and ~/.config/sops/age/keys.txt together, as the sops CLI reads them."`
}

// FluxAuth holds references to credentials, never the credentials.
type FluxAuth struct {
	SSHKeyFile     string `yaml:"sshKeyFile" path:"file" secret:"file" doc:"SSH deploy key file for an ssh:// repository."`
	KnownHostsFile string `yaml:"knownHostsFile" path:"file" doc:"known_hosts holding the git host's key; required for ssh:// repositories (source-controller refuses SSH without it). Write it with ssh-keyscan and check the fingerprint."`
	TokenFile      string `yaml:"tokenFile" path:"file" secret:"file" doc:"File holding an HTTPS token."`
	TokenEnv       string `yaml:"tokenEnv" doc:"Environment variable holding an HTTPS token."`
	Username       string `yaml:"username" doc:"HTTPS user name sent with the token."`
}

// LocalSnapshot serves a local work tree over git smart HTTP.
type LocalSnapshot struct {
	Enabled bool     `yaml:"enabled" doc:"Serve a snapshot instead of using flux.repo. Env: USE_LOCAL_GIT_SNAPSHOT=1."`
	Source  string   `yaml:"source" path:"file" doc:"Work tree to snapshot."`
	Listen  string   `yaml:"listen" doc:"Listen address host:port of the snapshot server."`
	URL     string   `yaml:"url" doc:"URL the cluster uses to reach the server (this host's LAN address)."`
	Exclude []string `yaml:"exclude" doc:"Extra path patterns never served (.talos/, ai/state/, kubeconfigs and secrets are always excluded)."`
	// ServePlaintext is the way out of the guard's refusal for a Secret kept
	// in plaintext on purpose: what a git remote would serve anyway.
	ServePlaintext []string `yaml:"servePlaintext" doc:"Gitignore-style patterns of files served as git holds them although they hold a plaintext Secret value (a Secret, secretGenerator input, secrets.yaml or .env* you keep unencrypted on purpose). Keys, tokens, kubeconfigs, Talos files and bootstrap's own files are never served."`
	Refresh        Duration `yaml:"refresh" doc:"Re-snapshot interval when the tree changed (0 = only on SIGHUP)."`
	// Serve is what the snapshot holds: need-to-know by default.
	Serve string `yaml:"serve" doc:"What the snapshot serves: build (default) serves only the files the cluster's build reads from flux.path (every Kustomization and HelmRelease it finds, their kustomizations, components, patches, generator files, charts, valuesFiles), proven with kustomize each time; tree serves every file git lists, for a cluster that builds paths the tree does not declare (a Kustomization made by hand). The secret guard applies to both."`
	// TLS is optional: the credential already keeps strangers out, TLS also
	// keeps the LAN from reading the tree and the credential in transit.
	TLSCertFile string `yaml:"tlsCertFile" path:"file" doc:"Serve over HTTPS with this PEM certificate (chain); url must then be https://. Flux trusts it as its CA, so a self-signed certificate works."`
	TLSKeyFile  string `yaml:"tlsKeyFile" path:"file" secret:"file" doc:"PEM private key of tlsCertFile (keep it 0600)."`
}

// Postcheck configures the exit-criteria checks.
type Postcheck struct {
	Timeout        Duration `yaml:"timeout" doc:"Bound on the whole postcheck."`
	PVCTimeout     Duration `yaml:"pvcTimeout" doc:"Bound on the test PVC binding."`
	Keep           int      `yaml:"keep" doc:"Postcheck archives to keep."`
	CertWarnDays   int      `yaml:"certWarnDays" doc:"Warn when a client certificate expires within this many days."`
	PrometheusFile string   `yaml:"prometheusFile" path:"file" doc:"Optional textfile-collector file to write metrics to."`
	Notify         Notify   `yaml:"notify" doc:"Tell people when the result changes: notification URLs (ntfy, Gotify, Discord, Slack, Telegram, Matrix, email, webhooks)."`
}

// Notify names where the nightly's result is sent. The URLs carry the
// services' credentials: by reference only, never in this file.
type Notify struct {
	URLsFile     string `yaml:"urlsFile" path:"file" secret:"file" doc:"File (0600) with notification URLs in shoutrrr's forms, one per line (# comments): ntfy://, gotify://, discord://, slack://, telegram://, matrix://, smtp://, generic+https://. Sent when the result changes (fail after pass, pass after fail)."`
	URLsEnv      string `yaml:"urlsEnv" doc:"Name of an environment variable holding the notification URLs (space or newline separated), instead of urlsFile."`
	EveryFailure bool   `yaml:"everyFailure" doc:"Also notify on every failed night, not only when the result changes."`
}

// Backup keeps etcd snapshots under ai/state/<cluster>/etcd/.
type Backup struct {
	Keep   int      `yaml:"keep" doc:"Verified snapshots to keep (oldest removed first)."`
	MaxAge Duration `yaml:"maxAge" doc:"The postcheck fails when the newest snapshot is older than this (a nightly run takes one first)."`
	// CopyDir is typically an NFS mount or a USB disk: the host's own disk
	// is what a homelab loses.
	CopyDir       string   `yaml:"copyDir" path:"file" doc:"Optional directory every verified snapshot is also copied to (keep copies there too)."`
	AgeRecipients []string `yaml:"ageRecipients" doc:"age public keys (age1…): copies in copyDir and in the S3 bucket are encrypted to them (.snapshot.age)."`
	// S3 is where homelabs keep backups off the host: MinIO, Garage,
	// SeaweedFS, Backblaze B2, AWS.
	S3 BackupS3 `yaml:"s3" doc:"Optional S3-compatible bucket every verified snapshot is also uploaded to (and read back before it counts)."`
}

// BackupS3 is an S3-compatible copy target. Its credentials come from the
// environment or a 0600 file, never from the config file.
type BackupS3 struct {
	Endpoint  string `yaml:"endpoint" doc:"Endpoint URL, https://host[:port] (http:// only for a server on a network you trust). Empty: no S3 copies."`
	Bucket    string `yaml:"bucket" doc:"Bucket the copies go to; it must exist (bootstrap never creates or deletes buckets)."`
	Prefix    string `yaml:"prefix" doc:"Key prefix of the copies; empty means <cluster>/etcd/."`
	Region    string `yaml:"region" doc:"Region the bucket is in (MinIO, Garage and SeaweedFS accept their default, us-east-1)."`
	PathStyle bool   `yaml:"pathStyle" doc:"Address the bucket as <endpoint>/<bucket> (most self-hosted servers); false: as <bucket>.<host> (virtual-hosted: AWS, and a server set up with a wildcard DNS name)."`
	// The keys are a credential: by reference only.
	CredentialsFile string `yaml:"credentialsFile" path:"file" secret:"file" doc:"AWS shared credentials file (0600) with aws_access_key_id, aws_secret_access_key and, for temporary keys, aws_session_token; used when AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are unset. Empty: $AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials, as the AWS SDK reads them."`
	Profile         string `yaml:"profile" doc:"Profile of the credentials file; set, it wins over AWS_ACCESS_KEY_ID (as a profile a program names does in the AWS SDK). Empty: $AWS_PROFILE, $AWS_DEFAULT_PROFILE, else default."`
	CAFile          string `yaml:"caFile" path:"file" doc:"PEM CA certificates the endpoint's certificate is checked against (a self-signed server), besides the system's."`
}

// Enabled reports whether snapshots are uploaded to S3.
func (s BackupS3) Enabled() bool { return s.Endpoint != "" }

// StateDirs says where generated files and run state live. Relative paths
// are relative to the config file's directory.
type StateDirs struct {
	Dir        string `yaml:"dir" path:"file" doc:"Run state, locks, logs and archives: <dir>/<cluster>/."`
	TalosDir   string `yaml:"talosDir" path:"file" doc:"Generated Talos files: <talosDir>/<cluster>/. Env: TALOS_CONFIG_DIR (the cluster's directory itself)."`
	Kubeconfig string `yaml:"kubeconfig" path:"file" doc:"Where the kubeconfig is written; empty means <talos dir>/kubeconfig. Env: TALOS_KUBECONFIG."`
	KeepRuns   int    `yaml:"keepRuns" doc:"Run logs to keep."`
}
