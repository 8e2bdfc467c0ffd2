package pvesim

import (
	"net/http"
	"net/netip"
	"time"

	"github.com/rs/zerolog"
)

// Options configure a simulated Proxmox VE host. The zero value is a usable
// N100-sized single node with the usual "local" and "local-lvm" storages, one
// bridge and one API token with administrator privileges.
type Options struct {
	// Addr is the listen address (default "127.0.0.1:0").
	Addr string
	// Hosts are extra DNS names or IPs for the node certificate.
	Hosts []string
	// Node describes the host.
	Node NodeSpec
	// Version is the pve-manager version reported by /version (default "8.2.4").
	Version string
	// QemuServer is the installed qemu-server version, as GET
	// /nodes/{node}/apt/versions reports it (default: the one current when
	// Version's release came out, see defaultQemuServer). Behaviours of
	// qemu-server follow it, not Version: pve-manager 9.2.x declares only
	// qemu-server >= 9.1.13 (debian/control at 9.2.11), so a 9.2 host
	// may run 9.1.13-9.1.19.
	QemuServer string
	// QemuServerCandidate is the qemu-server version apt would install
	// (default QemuServer: no upgrade pending).
	QemuServerCandidate string
	// PVEStorage is the installed pve-storage (libpve-storage-perl)
	// version (default: the one current when Version's release came out,
	// see defaultPVEStorage). The 'import' content type and what
	// download-url imports follow it (import.go).
	PVEStorage string
	// Storages replace the default storages when set.
	Storages []StorageSpec
	// Bridges replace the default vmbr0 when set.
	Bridges []BridgeSpec
	// ISOs are present on storage from the start.
	ISOs []ISOSpec
	// RemoteFiles are what download-url can fetch, by URL. Any other URL
	// fails the download task like wget's 404.
	RemoteFiles map[string]RemoteFile
	// HTTP, when set, fetches a URL that is not in RemoteFiles for real,
	// as the host's wget does (the file is hashed, not kept): the lab
	// passes a client that trusts its Image Factory's CA, as a host whose
	// trust store holds it would.
	HTTP *http.Client
	// GuestAgent says whether the guest of a running VM runs the QEMU
	// guest agent (the lab asks its Talos node for the extension); nil:
	// no guest does.
	GuestAgent func(vmid int) bool
	// Tokens are the API tokens that authenticate. When empty, one token
	// "root@pam!bootstrap" with a random secret and Admin privileges exists.
	Tokens []Token
	// Users can log in with a password (POST /access/ticket). A token's
	// user, when listed here, bounds a privilege-separated token.
	Users []User
	// PCIMappings are the cluster's PCI resource mappings (pci.go), the
	// same on every member; none by default.
	PCIMappings []PCIMapping
	// Guests hold VMIDs this node does not run (containers, VMs elsewhere).
	Guests []GuestSpec
	// Datacenter is the datacenter.cfg tag policy.
	Datacenter Datacenter
	// Profile is the latency model (default Instant).
	Profile Profile
	// TimeScale multiplies every profile duration (default 1); 0.01 runs
	// the n100 profile a hundred times faster.
	TimeScale float64
	// Seed makes probabilistic faults and generated MACs reproducible.
	Seed int64
	// LegacyErrors answers errors like pve-http-server before 5.2: the text
	// only in the HTTP status line, the JSON body without "message".
	LegacyErrors bool
	// OnStart and OnStop are called when a VM has started or stopped.
	OnStart []func(VMEvent) error
	OnStop  []func(VMEvent)
	// OnDestroy is called when a VM was destroyed, after the disks it
	// owned were freed (the event lists them).
	OnDestroy []func(VMEvent)
	// Log receives the simulator's own lines (task starts and ends, faults).
	Log zerolog.Logger
}

// NodeSpec describes the simulated host.
type NodeSpec struct {
	// Name is the node name (default "pve").
	Name string
	// CPUs is the number of logical CPUs (default 4).
	CPUs int
	// CPUModel is shown in node status (default "Intel(R) N100").
	CPUModel string
	// MemoryBytes is the host's RAM (default 16 GiB).
	MemoryBytes int64
	// HostUsedBytes is RAM the host itself uses (default 1.5 GiB).
	HostUsedBytes int64
	// PageCacheBytes is RAM the kernel uses for its page cache (default
	// 3 GiB, a warm host): MemAvailable counts it, MemFree does not.
	PageCacheBytes int64
	// PCIDevices are the host's PCI devices that GET hardware/pci lists
	// and hostpci options pass (pci.go); none by default.
	PCIDevices []PCIDevice
	// ARCBytes is the ZFS ARC's size (default 0: no ZFS). Linux counts it
	// as used, not in MemAvailable, so node status's 'used' includes it;
	// PVE 9 reports it only in the node RRD (arcsize in rrddata).
	ARCBytes int64
}

// GuestSpec is a guest this node does not run for the test (a container,
// or a VM on another cluster node): it holds its VMID cluster-wide.
type GuestSpec struct {
	VMID int
	// Type is "lxc" or "qemu".
	Type string
	// Node runs it (default: this node).
	Node   string
	Name   string
	Tags   string
	Status string
}

// Datacenter is what datacenter.cfg says about tags
// (pve-cluster src/PVE/DataCenterConfig.pm).
type Datacenter struct {
	// UserTagAccess is user-tag-access's user-allow: free (default),
	// existing, list or none.
	UserTagAccess string
	// UserAllowList is user-tag-access's user-allow-list.
	UserAllowList []string
	// RegisteredTags need Sys.Modify on / to set.
	RegisteredTags []string
}

// StorageSpec describes one storage.
type StorageSpec struct {
	// Name is the storage ID ("local", "local-lvm").
	Name string
	// Type is the plugin type: "dir", "lvmthin", "lvm", "zfspool", "nfs".
	Type string
	// Content lists content types ("images", "iso", "rootdir", "vztmpl", "backup").
	Content []string
	// TotalBytes is the capacity; UsedBytes what is in use before any VM.
	TotalBytes int64
	UsedBytes  int64
	// Path is the mount point of file-based storages (default /var/lib/vz for "local").
	Path string
	// Shared marks shared storages.
	Shared bool
	// Sparse makes a zfspool create sparse zvols (storage.cfg 'sparse 1'):
	// thin, like lvmthin and image files on file-based storages.
	Sparse bool
	// Disabled storages are configured but not enabled.
	Disabled bool
	// Offline storages are enabled but cannot be activated (an NFS server
	// that is down): listed with active 0 and no sizes, and anything that
	// activates them fails with "storage '<id>' is not online" (pve-storage
	// 9.1.7 src/PVE/Storage.pm activate_storage). SetStorageOffline
	// changes it.
	Offline bool
}

// BridgeSpec describes one bridge on the node: a Linux bridge, an Open
// vSwitch bridge (OVS) or an SDN VNet (Zone).
type BridgeSpec struct {
	Name string
	// OVS makes it an Open vSwitch bridge (type OVSBridge, ports in
	// ovs_ports): it tags a VM's port itself and has no VLAN-aware flag.
	OVS       bool
	VLANAware bool
	// VIDs is a VLAN-aware bridge's bridge-vids ("10 20 30", "2-4094"
	// when empty, as pve-common 9.2.1 src/PVE/Network/Interfaces.pm
	// writes it): the VLANs its ports carry.
	VIDs string
	// Ports are the bridge's ports, space-separated ("enp1s0"); a Linux
	// bridge that is not VLAN aware needs one to carry a tagged NIC.
	Ports string
	// CIDR is the host address on the bridge ("10.0.20.5/24"), if any.
	CIDR    string
	Gateway string
	// Zone makes it an SDN VNet of that zone (listed with type vnet);
	// plain bridges belong to the zone localnetwork.
	Zone string
	// MTU is the bridge's MTU (default 1500): a VirtIO NIC asking for
	// more fails the VM start (see netdevLocked).
	MTU int
}

// ISOSpec is an ISO already on storage.
type ISOSpec struct {
	Storage string
	Name    string
	// Content is the file's bytes; when nil, Size gives its size.
	Content []byte
	Size    int64
}

// RemoteFile is a file download-url can fetch. Either Content, or Size and
// SHA256 (hex) for files too big to keep in memory.
type RemoteFile struct {
	Content []byte
	Size    int64
	SHA256  string
	// Head is the file's first bytes (up to 4 KiB), which is what an
	// import's image check reads (a qcow2 header); taken from Content
	// when that is set.
	Head []byte
}

// Token is an API token. Its ACL is the token's effective privileges, i.e.
// with privilege separation already applied.
type Token struct {
	// ID is "user@realm!tokenname".
	ID     string
	Secret string
	ACL    []ACE
	// NoPrivsep gives the token its user's privileges. By default, as
	// `pveum user token add` creates them, a token is privilege-separated:
	// it holds what its own ACL and its user's both grant.
	NoPrivsep bool
}

// User can authenticate with a password. root@pam has every privilege
// regardless of its ACL, as on PVE.
type User struct {
	ID       string
	Password string
	ACL      []ACE
}

// ACE grants privileges on a path. Without NoPropagate they also apply to
// every path below; a more specific path with its own entries overrides.
type ACE struct {
	Path        string
	Privileges  []string
	NoPropagate bool
}

// VMEvent describes a VM that started or stopped, as the guest would see it:
// its cloud-init network settings, disks and NIC.
type VMEvent struct {
	Node string
	VMID int
	Name string
	Tags []string
	// IPv4 is the static address from ipconfig0 ("ip=10.0.20.11/24"); not
	// valid when the VM has no static cloud-init address.
	IPv4        netip.Prefix
	Gateway     netip.Addr
	Nameservers []string
	Disks       []Disk
	// MemoryMiB is the VM's configured memory.
	MemoryMiB int64
	// MAC of net0, upper case.
	MAC    string
	Bridge string
	VLAN   int
	// Isolated: net0's VLAN is not among the bridge-vids of its VLAN-aware
	// bridge. PVE starts the VM all the same (only the tap gets the tag,
	// pve-common 9.2.1 src/PVE/Network.pm $bridge_add_interface), and its
	// traffic never leaves the host: the lab boots no reachable node.
	Isolated bool
	// NICs are the VM's network interfaces besides net0, in key order.
	NICs []NIC
	// Firmware is what the VM's firmware holds for the guest (Secure Boot
	// keys, TPM) and the ISO in its drive (see tpm.go).
	Firmware Firmware
	// At is when the event happened.
	At time.Time
}

// Firmware is a VM's UEFI and TPM setup as its config gives them.
type Firmware struct {
	// UEFI: bios ovmf. EFIDisk: it has an efidisk0; PreEnrolledKeys:
	// created with pre-enrolled-keys=1 (Microsoft's keys, not in setup mode).
	UEFI, EFIDisk, PreEnrolledKeys bool
	// TPM is the tpmstate0 version ("v2.0", "v1.2"); "" without one.
	TPM string
	// CDROM is the ISO volume in ide2 ("" for none), and CDROMURL where
	// it was downloaded from ("" when not downloaded).
	CDROM, CDROMURL string
}

// Disk is one VM disk (CD-ROMs and the cloud-init drive are left out).
type Disk struct {
	// Slot is the config key ("scsi0", "virtio0").
	Slot string
	// Bus is "scsi", "virtio", "sata" or "ide".
	Bus       string
	Storage   string
	Volume    string
	SizeBytes int64
	// ImportedFrom is the volume the disk was imported from at create
	// (import-from), and ImportURL where that volume was downloaded from
	// ("" when it was not downloaded): what the guest finds on the disk.
	ImportedFrom, ImportURL string
	// Serial is the drive's serial= as the guest reads it (url-decoded).
	Serial string
}

// NIC is one VM network interface with its cloud-init address.
type NIC struct {
	// Key is the config key ("net1").
	Key    string
	MAC    string
	Bridge string
	VLAN   int
	// IPv4 is the static address of the matching ipconfigN; not valid
	// without one (or with ip=dhcp).
	IPv4 netip.Prefix
}

// FaultKind selects what an injected fault does.
type FaultKind string

// The fault kinds.
const (
	// FaultStatus answers with Status (default 500) and Message.
	FaultStatus FaultKind = "status"
	// FaultLock answers 500 "can't lock file '/var/lock/qemu-server/lock-<vmid>.conf' - got timeout".
	FaultLock FaultKind = "lock"
	// FaultTaskError lets the request start its task, which then ends with
	// Message as exit status instead of doing the work.
	FaultTaskError FaultKind = "task-error"
	// FaultSlow holds the answer for Delay, then answers normally.
	FaultSlow FaultKind = "slow"
	// FaultUnauthorized answers 401 as PVE does for bad credentials.
	FaultUnauthorized FaultKind = "unauthorized"
)

// Fault is an injected failure. Faults are checked in the order injected;
// the first that matches and fires decides.
type Fault struct {
	Kind FaultKind
	// Method matches the HTTP method ("" matches any).
	Method string
	// Path is a glob (path.Match) on the path below /api2/json, e.g.
	// "/nodes/*/qemu/*/status/start" ("" matches any).
	Path    string
	Status  int
	Message string
	Delay   time.Duration
	// Skip lets the first Skip matching requests through.
	Skip int
	// Times is how often the fault fires; 0 means every time.
	Times int
	// Probability fires the fault on a matching request with this chance
	// (0 means always).
	Probability float64
}
