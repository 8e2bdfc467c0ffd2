package proxmox

import (
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"strings"
)

// VMSpec is what one cluster node's VM should look like.
type VMSpec struct {
	// Cluster names the cluster; the VM is tagged bootstrap-<Cluster>.
	Cluster string
	// Name is the VM (and node) name.
	Name string
	// Role is "controlplane" or "worker"; it becomes a tag.
	Role string
	// VMID comes from config: IDs are never taken from /cluster/nextid,
	// which reserves nothing and races between parallel creates.
	VMID int
	// Node is the Proxmox cluster member the VM runs on or is created on
	// (see Place); "" is the client's node.
	Node      string
	Cores     int
	MemoryMiB int
	// CPU is the VM's CPU type (proxmox.cpu; "" is host).
	CPU string
	// CPUFlags are "+flag"/"-flag" entries of the cpu option's flags
	// (the VM-specific ones qemu-server allows; config validates them).
	CPUFlags []string
	// Hardware is the firmware, machine, controller, cache, ballooning
	// and RNG of a new VM (proxmox.vm); its zero value is Talos' baseline.
	Hardware Hardware
	// DiskStorage and DiskGiB describe the install disk.
	DiskStorage string
	DiskGiB     int
	// DiskBus is "scsi" (default, on Hardware's SCSI controller: /dev/sda)
	// or "virtio" (/dev/vda).
	DiskBus string
	Bridge  string
	// VLAN tags net0 when non-zero.
	VLAN int
	// MAC of net0; empty derives a stable one from Cluster and Name.
	MAC string
	// ISOStorage and ISOFile are the Talos nocloud ISO on ide2.
	ISOStorage string
	ISOFile    string
	// Image, when set, is the volume ID of the Talos disk image on an
	// import storage ("local:import/talos-….qcow2"): a new VM's install
	// disk is created from it (import-from) and grown to DiskGiB before
	// its first start, and it gets no ISO (see boot.go).
	Image string
	// GuestAgent enables the QEMU guest agent device (agent: 1): only when
	// the image runs the agent, or Proxmox waits for it in vain (shutdown
	// falls back to ACPI after a timeout, no addresses in the GUI).
	GuestAgent bool
	// CloudInitStorage holds the cloud-init drive (default DiskStorage).
	CloudInitStorage string
	// IPv4 is the node's static address with prefix; Gateway its router.
	IPv4        netip.Prefix
	Gateway     netip.Addr
	Nameservers []string
	// Disks are the extra disks besides the install disk, NICs the extra
	// NICs besides net0 (net1, net2, …); see extras.go.
	Disks []ExtraDisk
	NICs  []ExtraNIC
}

// CPUType is the VM's CPU type: CPU, or host when unset. host is not a
// custom model, so the create asks no Sys.Audit on /nodes for it
// (qemu-server 9.2.6 src/PVE/API2/Qemu.pm, CPUConfig.pm); neither are the
// built-in x86-64 levels.
func (s VMSpec) CPUType() string {
	if s.CPU == "" {
		return "host"
	}
	return s.CPU
}

// cpuOption is the create's cpu property: the type, and the flags when
// any (qemu-server's pve-vm-cpu-conf format: [cputype=]<type>,flags=<+f;-g>,
// 9.2.6 src/PVE/QemuServer/CPUConfig.pm).
func (s VMSpec) cpuOption() string {
	if len(s.CPUFlags) == 0 {
		return s.CPUType()
	}
	return s.CPUType() + ",flags=" + strings.Join(s.CPUFlags, ";")
}

// Hardware is a VM's firmware, machine type, SCSI controller, install
// disk cache, ballooning and RNG. An empty field is the baseline VM of
// Talos' Proxmox guide (the Talos docs, v1.13 and v1.14
// platform-specific-installations/virtualized-platforms/proxmox.mdx, "VM
// resource requirements"): OVMF with a 4 MiB EFI disk whose Secure Boot
// keys are not pre-enrolled, q35, VirtIO SCSI (not single: installs that
// hung, siderolabs/talos#11173), write-through cache, no ballooning (Talos
// does not support memory hotplug), and the optional RNG left out.
type Hardware struct {
	BIOS, Machine, SCSIHW, Cache string
	// Ballooning keeps Proxmox's balloon device (the create sends no
	// balloon: 0); RNG adds a VirtIO RNG fed from the host's /dev/urandom.
	Ballooning, RNG bool
	// PCI are the host PCI devices passed by resource mapping (pci.go).
	PCI []PCIDevice
	// SecureBoot: the VM boots the Secure Boot ISO (ISOFile names it);
	// TPM adds a TPM 2.0 state volume (see secureboot.go).
	SecureBoot, TPM bool
}

// BIOSType is the VM's firmware: ovmf unless set.
func (h Hardware) BIOSType() string { return cmp.Or(h.BIOS, "ovmf") }

// MachineType is the VM's machine type: q35 unless set.
func (h Hardware) MachineType() string { return cmp.Or(h.Machine, "q35") }

// Controller is the VM's SCSI controller: virtio-scsi-pci unless set.
func (h Hardware) Controller() string { return cmp.Or(h.SCSIHW, "virtio-scsi-pci") }

// CacheMode is the install disk's cache: writethrough unless set.
func (h Hardware) CacheMode() string { return cmp.Or(h.Cache, "writethrough") }

// efidisk0 is the EFI vars disk OVMF keeps its settings and Secure Boot
// keys in: 4m (the OVMF build with Secure Boot support; "2m" is the
// schema's default for old VMs) and no pre-enrolled Microsoft keys, as
// Talos' guide says (its own keys are enrolled by the Secure Boot ISO).
// The size in the volume string is ignored: qemu-server allocates the
// size of the OVMF vars file (src/PVE/QemuServer/OVMF.pm create_efidisk
// at 9.2.6).
func (s VMSpec) efidisk0() string {
	return s.DiskStorage + ":1,efitype=4m,pre-enrolled-keys=0"
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// Validate checks the spec before anything is sent to Proxmox.
func (s VMSpec) Validate() error {
	var errs []error
	if !nameRE.MatchString(s.Cluster) {
		errs = append(errs, fmt.Errorf("cluster name %q must be lower-case letters, digits and dashes", s.Cluster))
	}
	if !nameRE.MatchString(s.Name) {
		errs = append(errs, fmt.Errorf("VM name %q must be a DNS label", s.Name))
	}
	if s.VMID < 100 || s.VMID > 999999999 {
		errs = append(errs, fmt.Errorf("VM %s: vmid %d is outside 100..999999999", s.Name, s.VMID))
	}
	if s.Cores < 1 || s.MemoryMiB < 512 || s.DiskGiB < 1 {
		errs = append(errs, fmt.Errorf("VM %s: needs cores >= 1, memory >= 512 MiB and a disk >= 1 GiB", s.Name))
	}
	if s.DiskStorage == "" || s.Bridge == "" || (s.Image == "" && (s.ISOStorage == "" || s.ISOFile == "")) {
		errs = append(errs, fmt.Errorf("VM %s: disk storage, bridge and ISO storage/file (or a disk image) are required", s.Name))
	}
	if s.DiskBus != "" && s.DiskBus != "scsi" && s.DiskBus != "virtio" {
		errs = append(errs, fmt.Errorf("VM %s: disk bus %q must be scsi or virtio", s.Name, s.DiskBus))
	}
	if s.VLAN < 0 || s.VLAN > 4094 {
		errs = append(errs, fmt.Errorf("VM %s: VLAN %d is outside 1..4094", s.Name, s.VLAN))
	}
	if !s.IPv4.IsValid() || !s.IPv4.Addr().Is4() {
		errs = append(errs, fmt.Errorf("VM %s: a static IPv4 address with prefix is required", s.Name))
	}
	if s.MAC != "" {
		if _, err := normalizeMAC(s.MAC); err != nil {
			errs = append(errs, fmt.Errorf("VM %s: %w", s.Name, err))
		}
	}
	errs = append(errs, s.validateExtras()...)
	return errors.Join(errs...)
}

// Bus is the install disk's bus ("scsi" unless set).
func (s VMSpec) Bus() string {
	if s.DiskBus == "" {
		return "scsi"
	}
	return s.DiskBus
}

// DiskSlot is the config key of the install disk ("scsi0").
func (s VMSpec) DiskSlot() string { return s.Bus() + "0" }

// InstallDisk is the device the guest sees the install disk as.
func (s VMSpec) InstallDisk() string {
	if s.Bus() == "virtio" {
		return "/dev/vda"
	}
	return "/dev/sda"
}

// EffectiveMAC is the configured MAC or the derived one.
func (s VMSpec) EffectiveMAC() string {
	if s.MAC != "" {
		m, _ := normalizeMAC(s.MAC)
		return m
	}
	return DeriveMAC(s.Cluster, s.Name)
}

// Tags are the tags the VM must carry: talos, bootstrap-<cluster>, role.
func (s VMSpec) Tags() []string {
	tags := []string{"talos", ClusterTag(s.Cluster)}
	if s.Role != "" {
		tags = append(tags, s.Role)
	}
	sort.Strings(tags)
	return tags
}

func (s VMSpec) cloudInitStorage() string {
	if s.CloudInitStorage != "" {
		return s.CloudInitStorage
	}
	return s.DiskStorage
}

func (s VMSpec) net0() string {
	v := "virtio=" + s.EffectiveMAC() + ",bridge=" + s.Bridge
	if s.VLAN != 0 {
		v += fmt.Sprintf(",tag=%d", s.VLAN)
	}
	return v
}

func (s VMSpec) ipconfig0() string {
	v := "ip=" + s.IPv4.String()
	if s.Gateway.IsValid() {
		v += ",gw=" + s.Gateway.String()
	}
	return v
}

// createParams is the POST /nodes/{node}/qemu body: a Talos nocloud VM
// whose static address reaches the guest through the cloud-init drive,
// booting from disk first and the ISO until Talos is installed; with a
// disk image, the disk is imported from it (`<storage>:0,import-from=`,
// the size 0 that qemu-server's $check_drive_param requires) and the VM
// has no ISO.
func (s VMSpec) createParams() map[string]any {
	disk := fmt.Sprintf("%s:%d,discard=on", s.DiskStorage, s.DiskGiB)
	if s.Image != "" {
		disk = fmt.Sprintf("%s:0,import-from=%s,discard=on", s.DiskStorage, s.Image)
	}
	disk += ",cache=" + s.Hardware.CacheMode()
	// qemu-server gives a SCSI disk its own IO thread only on
	// virtio-scsi-single and ignores the option, with a warning, on the
	// other controllers (src/PVE/QemuServer.pm config_to_command at 9.2.6).
	if s.Bus() == "scsi" && s.Hardware.Controller() == "virtio-scsi-single" {
		disk += ",iothread=1"
	}
	p := map[string]any{
		"vmid":       s.VMID,
		"name":       s.Name,
		"cores":      s.Cores,
		"sockets":    1,
		"cpu":        s.cpuOption(),
		"memory":     s.MemoryMiB,
		"scsihw":     s.Hardware.Controller(),
		"bios":       s.Hardware.BIOSType(),
		"machine":    s.Hardware.MachineType(),
		s.DiskSlot(): disk,
		"ide2":       s.ISOStorage + ":iso/" + s.ISOFile + ",media=cdrom",
		"ide3":       s.cloudInitStorage() + ":cloudinit",
		"ipconfig0":  s.ipconfig0(),
		"net0":       s.net0(),
		"boot":       "order=" + s.DiskSlot() + ";ide2",
		"agent":      s.agent(),
		"ostype":     "l26",
		"tags":       strings.Join(s.Tags(), ";"),
		// Start with the host (pve-guests runs startall at boot, which
		// starts only guests with onboot: pve-manager PVE/API2/Nodes.pm
		// get_start_stop_list). No startup order: setting 'startup'
		// needs Sys.Modify on / besides VM.Config.Options (qemu-server
		// API2/Qemu.pm $check_vm_modify_config_perm, "changes host
		// behaviour"), which the runner's role leaves out; startall
		// starts guests without an order by ascending VMID, so control
		// planes numbered below the workers (the default) come first.
		"onboot": 1,
	}
	if len(s.Nameservers) > 0 {
		p["nameserver"] = strings.Join(s.Nameservers, " ")
	}
	if s.Hardware.BIOSType() == "ovmf" {
		p["efidisk0"] = s.efidisk0()
	}
	if !s.Hardware.Ballooning {
		// 0 removes the balloon device; unset, Proxmox adds one.
		p["balloon"] = 0
	}
	if s.Hardware.RNG {
		p["rng0"] = "source=/dev/urandom"
	}
	for k, v := range s.Hardware.hostpciParams() {
		p[k] = v
	}
	if s.Hardware.TPM {
		p["tpmstate0"] = s.tpmstate0()
	}
	if s.Image != "" {
		delete(p, "ide2")
		p["boot"] = "order=" + s.DiskSlot()
	}
	s.addExtras(p)
	return p
}

// DeriveMAC returns a stable, locally administered unicast MAC for a
// cluster's node, so a recreated VM keeps its DHCP reservations and switch
// entries.
func DeriveMAC(cluster, node string) string {
	sum := sha256.Sum256([]byte("bootstrap-mac\x00" + cluster + "\x00" + node))
	b := sum[:6]
	b[0] = (b[0] | 0x02) &^ 0x01
	return fmt.Sprintf("%02X:%02X:%02X:%02X:%02X:%02X", b[0], b[1], b[2], b[3], b[4], b[5])
}

var macRE = regexp.MustCompile(`^[0-9A-Fa-f]{2}([:-][0-9A-Fa-f]{2}){5}$`)

func normalizeMAC(m string) (string, error) {
	if !macRE.MatchString(m) {
		return "", fmt.Errorf("MAC %q is not six hex pairs", m)
	}
	m = strings.ToUpper(strings.ReplaceAll(m, "-", ":"))
	var first byte
	fmt.Sscanf(m[:2], "%02X", &first)
	if first&1 == 1 {
		return "", fmt.Errorf("MAC %q is a multicast address", m)
	}
	return m, nil
}

// agent is the VM's agent option: "1" or "0".
func (s VMSpec) agent() string {
	if s.GuestAgent {
		return "1"
	}
	return "0"
}
