package config

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/Masterminds/semver/v3"
)

// validator collects every problem of a config at once.
type validator struct {
	c    *Config
	errs *Errors
}

func (v *validator) add(warning bool, path, format string, a ...any) {
	fe := &FieldError{File: v.c.src.file, Path: path, Msg: message(format, a...), Warning: warning}
	if env, ok := v.c.src.fromEnv[path]; ok {
		fe.Msg += fmt.Sprintf(" (value from environment %s)", env)
	}
	// Point at the field, or at its nearest ancestor present in the file.
	for p := path; p != ""; p = parentPath(p) {
		if ps, ok := v.c.src.positions[p]; ok {
			fe.Line, fe.Col = ps.line, ps.col
			if ps.file != "" {
				fe.File = ps.file
			}
			break
		}
	}
	v.errs.Items = append(v.errs.Items, fe)
}

func (v *validator) errf(path, format string, a ...any)  { v.add(false, path, format, a...) }
func (v *validator) warnf(path, format string, a ...any) { v.add(true, path, format, a...) }

func parentPath(p string) string {
	i := strings.LastIndexAny(p, ".[")
	if i < 0 {
		return ""
	}
	return p[:i]
}

// Validate runs the semantic checks on a decoded config. Load calls it.
func (c *Config) Validate() error { return c.validate() }

func (c *Config) validate() error {
	v := &validator{c: c, errs: &Errors{File: c.src.file}}
	v.cluster()
	v.talosTimeouts(c.Cluster.Timeouts)
	v.nodes()
	v.nodeResources()
	v.nodeExtras()
	v.proxmox()
	v.security()
	v.storage()
	v.cni()
	v.flux()
	v.fluxDecryption()
	v.secrets()
	v.gitBranch()
	v.stateDirs()
	v.postcheck()
	v.credentialModes()
	v.misplacedSecrets()
	v.s3Grammar()
	v.snapshotPatterns()
	v.placeholders()
	v.outputPaths()
	v.ciliumValuesAnyCNI()
	// Patches are applied to a config generated from the rest: only once
	// the rest is valid.
	if len(v.errs.Fatal()) == 0 {
		v.patchContents()
	}
	c.maskMessages(v.errs)
	v.errs.sortItems()
	c.src.warnings = v.errs.Warnings()
	if len(v.errs.Fatal()) > 0 {
		return v.errs
	}
	return nil
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func (v *validator) requireLabel(path, val, what string) {
	switch {
	case val == "":
		v.errf(path, "is required: set a %s (lowercase letters, digits and '-')", what)
	case !dnsLabel.MatchString(val):
		v.errf(path, "%q is not a valid %s: use lowercase letters, digits and '-', at most 63 characters, starting and ending with a letter or digit", val, what)
	}
}

func (v *validator) cidr() (netip.Prefix, bool) {
	p, err := netip.ParsePrefix(v.c.Cluster.Network.CIDR)
	if err != nil || !p.Addr().Is4() {
		return netip.Prefix{}, false
	}
	return p.Masked(), true
}

func (v *validator) cluster() {
	c := &v.c.Cluster
	v.requireLabel("cluster.name", c.Name, "cluster name")

	v.talosVersions()
	v.serviceAccountKey()
	v.cidrHostBits()
	v.certSANs()
	v.installImage()
	v.schematic()

	prefix, okCIDR := v.cidr()
	n := c.Network
	if n.CIDR == "" {
		v.errf("cluster.network.cidr", "is required: the node network, e.g. 10.0.20.0/24")
	} else if !okCIDR {
		v.errf("cluster.network.cidr", "%q is not an IPv4 CIDR: use the form 10.0.20.0/24", n.CIDR)
	}
	if n.Gateway == "" {
		v.errf("cluster.network.gateway", "is required: the default gateway of the node network")
	} else if gw, err := netip.ParseAddr(n.Gateway); err != nil || !gw.Is4() {
		v.errf("cluster.network.gateway", "%q is not an IPv4 address", n.Gateway)
	} else if okCIDR && !prefix.Contains(gw) {
		v.errf("cluster.network.gateway", "%s is outside cluster.network.cidr %s: use an address inside the CIDR", n.Gateway, prefix)
	} else if okCIDR && prefix.Bits() < 31 && (gw == prefix.Masked().Addr() || gw == lastAddr(prefix)) {
		v.errf("cluster.network.gateway", "%s is the %s address of %s, not a host: use the router's address (e.g. %s)", n.Gateway,
			map[bool]string{true: "network", false: "broadcast"}[gw == prefix.Masked().Addr()], prefix.Masked(), prefix.Masked().Addr().Next())
	}
	if len(n.Nameservers) == 0 {
		v.errf("cluster.network.nameservers", "is required: list at least one DNS server")
	}
	for i, ns := range n.Nameservers {
		if _, err := netip.ParseAddr(ns); err != nil {
			v.errf(fmt.Sprintf("cluster.network.nameservers[%d]", i), "%q is not an IP address", ns)
		}
	}

	// Endpoint and VIP must agree, and something must answer at the endpoint.
	u, err := url.Parse(c.Endpoint)
	endpointHost := ""
	switch {
	case c.Endpoint == "":
		v.errf("cluster.endpoint", "is required: https://<vip or first control plane IP>:6443")
	case err != nil || u.Scheme != "https" || u.Hostname() == "" || u.Port() == "" || (u.Path != "" && u.Path != "/"):
		v.errf("cluster.endpoint", "%q must be https://<host>:<port>, e.g. https://10.0.20.10:6443", c.Endpoint)
	case !portInRange(u.Port()):
		v.errf("cluster.endpoint", "port %s is not a TCP port (1-65535): the API server listens on 6443, e.g. https://%s:6443", u.Port(), u.Hostname())
	default:
		endpointHost = u.Hostname()
	}
	if c.VIP != "" {
		vip, err := netip.ParseAddr(c.VIP)
		switch {
		case err != nil || !vip.Is4():
			v.errf("cluster.vip", "%q is not an IPv4 address", c.VIP)
		case okCIDR && !prefix.Contains(vip):
			v.errf("cluster.vip", "%s is outside cluster.network.cidr %s: the VIP must be on the node network", c.VIP, prefix)
		case c.Network.Gateway == c.VIP:
			v.errf("cluster.vip", "%s is the gateway: pick a free address", c.VIP)
		case okCIDR && prefix.Bits() < 31 && (vip == prefix.Masked().Addr() || vip == lastAddr(prefix)):
			v.errf("cluster.vip", "%s is the %s address of %s: no host can answer there; pick an unused host address of the network",
				c.VIP, map[bool]string{true: "network", false: "broadcast"}[vip == prefix.Masked().Addr()], prefix.Masked())
		default:
			if ip := net.ParseIP(endpointHost); ip != nil && endpointHost != c.VIP {
				v.errf("cluster.endpoint", "host %s differs from cluster.vip %s: point the endpoint at the VIP (https://%s:6443)", endpointHost, c.VIP, c.VIP)
			}
		}
	} else if ip := net.ParseIP(endpointHost); ip != nil {
		isCP := false
		for _, node := range v.c.Nodes {
			if node.Role == RoleControlPlane && node.IP == endpointHost {
				isCP = true
			}
		}
		if !isCP {
			v.errf("cluster.endpoint", "host %s is neither cluster.vip nor a control plane's IP: nothing would answer there", endpointHost)
		} else if len(v.c.ControlPlanes()) > 1 {
			v.warnf("cluster.endpoint", "with %d control planes and no VIP the API is reachable only while %s is up: consider cluster.vip", len(v.c.ControlPlanes()), endpointHost)
		}
	}

	if c.Parallelism < 0 {
		v.errf("cluster.parallelism", "must be 0 (all nodes at once) or more, got %d", c.Parallelism)
	}
	if c.UpgradeParallelism < 1 {
		v.errf("cluster.upgradeParallelism", "must be at least 1, got %d", c.UpgradeParallelism)
	}
	for i, san := range c.SANs {
		if san == "" {
			v.errf(fmt.Sprintf("cluster.certSANs[%d]", i), "is empty: remove it or set a name or IP")
		}
	}
	v.patchFiles()
}

func (v *validator) patchFiles() {
	p := v.c.Cluster.Patches
	check := func(path string, files []string) {
		for i, f := range files {
			fp := fmt.Sprintf("%s[%d]", path, i)
			if f == "" {
				v.errf(fp, "is empty: remove it or name a patch file")
				continue
			}
			if st, err := os.Stat(v.c.Resolve(f)); err != nil {
				v.errf(fp, "patch file %s does not exist (paths are relative to the config file)", f)
			} else if st.IsDir() {
				v.errf(fp, "%s is a directory: list the patch files themselves", f)
			}
		}
	}
	check("cluster.patches.all", p.All)
	check("cluster.patches.controlplane", p.ControlPlane)
	check("cluster.patches.worker", p.Worker)
	names := map[string]bool{}
	for _, n := range v.c.Nodes {
		names[n.Name] = true
	}
	for _, name := range sortedKeys(p.Nodes) {
		path := "cluster.patches.nodes." + name
		if !names[name] {
			v.errf(path, "no node named %q in nodes: fix the name or remove the entry", name)
		}
		check(path, p.Nodes[name])
	}
}

var macRe = regexp.MustCompile(`^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$`)

func (v *validator) nodes() {
	nodes := v.c.Nodes
	if len(nodes) == 0 {
		v.errf("nodes", "is required: list at least one control plane node")
		return
	}
	prefix, okCIDR := v.cidr()
	names, vmids, ips, macs := map[string]string{}, map[int]string{}, map[string]string{}, map[string]string{}
	cps := 0
	for i, n := range nodes {
		p := fmt.Sprintf("nodes[%d]", i)
		v.requireLabel(p+".name", n.Name, "node name")
		if prev, dup := names[n.Name]; dup && n.Name != "" {
			v.errf(p+".name", "%q is already used by %s: node names must be unique", n.Name, prev)
		}
		names[n.Name] = p
		v.vmShape(p+".vm", n.VM, true)
		v.nodePCI(p, n)

		switch n.Role {
		case RoleControlPlane:
			cps++
		case RoleWorker:
		case "":
			v.errf(p+".role", "is required: controlplane or worker")
		default:
			v.errf(p+".role", "%q is not a role: use controlplane or worker", n.Role)
		}

		switch {
		case n.VMID == 0:
			v.errf(p+".vmid", "is required: a free Proxmox VMID (100-999999999) for this node")
		case n.VMID < 100 || n.VMID > 999999999:
			v.errf(p+".vmid", "%d is out of range: Proxmox VMIDs are 100-999999999", n.VMID)
		default:
			if prev, dup := vmids[n.VMID]; dup {
				v.errf(p+".vmid", "%d is already used by %s: VMIDs must be unique", n.VMID, prev)
			}
			vmids[n.VMID] = p
		}

		ip, err := netip.ParseAddr(n.IP)
		switch {
		case n.IP == "":
			v.errf(p+".ip", "is required: a static IPv4 address inside cluster.network.cidr")
		case err != nil || !ip.Is4():
			v.errf(p+".ip", "%q is not an IPv4 address", n.IP)
		default:
			if okCIDR && !prefix.Contains(ip) {
				v.errf(p+".ip", "%s is outside cluster.network.cidr %s: use an address inside the CIDR or change the CIDR", n.IP, prefix)
			} else if okCIDR && (ip == prefix.Addr() || ip == broadcast(prefix)) && prefix.Bits() < 31 {
				v.errf(p+".ip", "%s is the network's %s address: pick a host address", n.IP, map[bool]string{true: "network", false: "broadcast"}[ip == prefix.Addr()])
			}
			if n.IP == v.c.Cluster.Network.Gateway {
				v.errf(p+".ip", "%s is the gateway: pick a free address", n.IP)
			}
			if n.IP == v.c.Cluster.VIP {
				v.errf(p+".ip", "%s is the cluster VIP: the VIP must be an address no node owns", n.IP)
			}
			if prev, dup := ips[n.IP]; dup {
				v.errf(p+".ip", "%s is already used by %s: node addresses must be unique", n.IP, prev)
			}
			ips[n.IP] = p
		}

		if n.Host != "" {
			hosts := v.c.Proxmox.Hosts
			if len(hosts) == 0 {
				hosts = []string{v.c.Proxmox.Node}
			}
			if !slices.Contains(hosts, n.Host) {
				v.errf(p+".host", "%q is not one of proxmox.hosts (%s): add it there or pick one of them", n.Host, strings.Join(hosts, ", "))
			}
		}
		if n.Cores < 1 {
			v.errf(p+".cores", "must be at least 1, got %d", n.Cores)
		}
		minMem := 1024
		if n.Role == RoleControlPlane {
			minMem = 2048
		}
		if n.MemoryMiB < minMem {
			v.errf(p+".memoryMiB", "must be at least %d for a %s (Talos' minimum), got %d", minMem, orRole(n.Role), n.MemoryMiB)
		}
		if n.DiskGiB < 10 {
			v.errf(p+".diskGiB", "must be at least 10 (Talos' minimum install disk), got %d", n.DiskGiB)
		}
		if n.MAC != "" {
			if !macRe.MatchString(n.MAC) {
				v.errf(p+".mac", "%q is not a MAC address: use the form BC:24:11:00:00:01", n.MAC)
			} else {
				b, _ := strconv.ParseUint(n.MAC[:2], 16, 8)
				if b&1 == 1 {
					v.errf(p+".mac", "%s is a multicast address: the first octet must be even", n.MAC)
				}
				key := strings.ToLower(n.MAC)
				if prev, dup := macs[key]; dup {
					v.errf(p+".mac", "%s is already used by %s: MACs must be unique", n.MAC, prev)
				}
				macs[key] = p
			}
		}
	}
	if cps == 0 {
		v.errf("nodes", "has no control plane: give at least one node role controlplane")
	} else if cps%2 == 0 {
		v.warnf("nodes", "%d control planes: etcd tolerates no more failures than with %d; use an odd count", cps, cps-1)
	}
}

func orRole(r string) string {
	if r == "" {
		return "node"
	}
	return r
}

func broadcast(p netip.Prefix) netip.Addr {
	a := p.Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

var (
	tokenIDRe     = regexp.MustCompile(`^[^@!\s]+@[^@!\s]+![A-Za-z][A-Za-z0-9._-]*$`)
	fingerprintRe = regexp.MustCompile(`^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){31}$`)
	checksumRe    = regexp.MustCompile(`^(sha256:[0-9a-fA-F]{64}|sha512:[0-9a-fA-F]{128})$`)
)

func (v *validator) proxmox() {
	p := v.c.Proxmox
	u, err := url.Parse(p.URL)
	switch {
	case p.URL == "":
		v.errf("proxmox.url", "is required: https://<host>:8006/api2/json")
	case err != nil || u.Scheme != "https" || u.Host == "":
		v.errf("proxmox.url", "%q must be an https URL such as https://pve.lan:8006/api2/json", p.URL)
	case strings.TrimSuffix(u.Path, "/") != "/api2/json":
		v.errf("proxmox.url", "%q must end in /api2/json, e.g. https://%s/api2/json", p.URL, u.Host)
	}
	if p.Node == "" {
		v.errf("proxmox.node", "is required: the Proxmox node name (Datacenter → node), e.g. pve")
	} else if !pveNodeRe.MatchString(p.Node) {
		v.errf("proxmox.node", "%q is not a Proxmox node name (letters, digits and inner hyphens, as the node's hostname; PVE refuses anything else): e.g. pve", p.Node)
	}
	seenHosts := map[string]bool{}
	for i, h := range p.Hosts {
		path := fmt.Sprintf("proxmox.hosts[%d]", i)
		switch {
		case !pveNodeRe.MatchString(h):
			v.errf(path, "%q is not a Proxmox node name (letters, digits and inner hyphens): e.g. pve2", h)
		case seenHosts[h]:
			v.errf(path, "%q is listed twice: list each Proxmox member once", h)
		}
		seenHosts[h] = true
	}
	if len(p.Hosts) > 0 && p.Node != "" && !seenHosts[p.Node] {
		v.errf("proxmox.hosts", "does not list proxmox.node %q: list every member VMs may go to, the API's own node among them (or leave hosts empty for one host)", p.Node)
	}
	if p.Bridge != "" && !pveBridgeRe.MatchString(p.Bridge) {
		v.errf("proxmox.bridge", "%q is not a Proxmox bridge name (letters, digits, '-', '_', '.'): e.g. vmbr0", p.Bridge)
	}
	if p.TokenID == "" {
		v.errf("proxmox.tokenID", "is required: an API token id such as bootstrap@pve!ci (Datacenter → Permissions → API Tokens)")
	} else if !tokenIDRe.MatchString(p.TokenID) {
		v.errf("proxmox.tokenID", "%q is not a token id: use user@realm!tokenname", p.TokenID)
	}
	v.secretFile("proxmox.tokenSecretFile", p.TokenSecretFile)
	modes := 0
	if p.TLSFingerprint != "" {
		modes++
		if !fingerprintRe.MatchString(p.TLSFingerprint) {
			v.errf("proxmox.tlsFingerprint", "%q is not a SHA-256 fingerprint: copy it from the node's Certificates page (32 hex bytes separated by ':')", p.TLSFingerprint)
		}
	}
	if p.CAFile != "" {
		modes++
		v.caFile("proxmox.caFile", p.CAFile)
	}
	if p.Insecure {
		modes++
		v.warnf("proxmox.insecure", "TLS verification is off: anyone on the path can read the API token; pin proxmox.tlsFingerprint instead")
	}
	if modes == 0 {
		v.errf("proxmox.tlsFingerprint", "is required: pin the Proxmox certificate's SHA-256 fingerprint, or set proxmox.caFile (insecure: true only as a last resort)")
	} else if modes > 1 {
		v.errf("proxmox", "set only one of tlsFingerprint, caFile and insecure")
	}
	for path, val := range map[string]string{"proxmox.diskStorage": p.DiskStorage, "proxmox.isoStorage": p.ISOStorage, "proxmox.bridge": p.Bridge} {
		if val == "" {
			v.errf(path, "is required")
		}
	}
	if p.VLAN < 0 || p.VLAN > 4094 {
		v.errf("proxmox.vlan", "%d is not a VLAN id: use 1-4094, or 0 for untagged", p.VLAN)
	}
	if p.ISO.File != "" {
		v.isoFile(p.ISO.File)
	}
	v.boot(p)
	v.cpu(p.CPU)
	v.vmShape("proxmox.vm", p.VM, false)
	v.vmShape("proxmox.roleVM.controlplane", p.RoleVM.ControlPlane, true)
	v.vmShape("proxmox.roleVM.worker", p.RoleVM.Worker, true)
	v.pciList("proxmox.vm.pci", p.VM.PCI, p.VM.Machine)
	v.pciList("proxmox.roleVM.controlplane.pci", p.RoleVM.ControlPlane.PCI, cmp.Or(p.RoleVM.ControlPlane.Machine, p.VM.Machine))
	v.pciList("proxmox.roleVM.worker.pci", p.RoleVM.Worker.PCI, cmp.Or(p.RoleVM.Worker.Machine, p.VM.Machine))
	if p.ISO.URL != "" {
		if u, err := url.Parse(p.ISO.URL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			v.errf("proxmox.iso.url", "%q is not an http(s) URL", p.ISO.URL)
		}
		if p.ISO.Checksum == "" {
			v.warnf("proxmox.iso.checksum", "no checksum: the downloaded ISO will not be verified")
		}
	}
	if p.ISO.Checksum != "" && !checksumRe.MatchString(p.ISO.Checksum) {
		v.errf("proxmox.iso.checksum", "%q must be sha256:<64 hex> or sha512:<128 hex>", p.ISO.Checksum)
	}
	if p.Parallelism < 1 {
		v.errf("proxmox.parallelism", "must be at least 1, got %d", p.Parallelism)
	}
	v.positive("proxmox.taskTimeout", p.TaskTimeout)
	v.positive("proxmox.bootTimeout", p.BootTimeout)
}

func (v *validator) talosTimeouts(t TalosTimeouts) {
	v.positive("cluster.timeouts.call", t.Call)
	v.positive("cluster.timeouts.install", t.Install)
	v.positive("cluster.timeouts.reboot", t.Reboot)
	v.positive("cluster.timeouts.bootstrap", t.Bootstrap)
	v.positive("cluster.timeouts.health", t.Health)
}

func (v *validator) positive(path string, d Duration) {
	if d <= 0 {
		v.errf(path, "must be a positive duration such as 5m")
	}
}

func (v *validator) file(path, f string) {
	if f == "" {
		return
	}
	if _, err := os.Stat(v.c.Resolve(f)); err != nil {
		v.errf(path, "%s cannot be read: %v", f, unwrapPathErr(err))
	}
}

func (v *validator) chart(path, repo, version string) {
	if u, err := url.Parse(repo); repo == "" || err != nil || (u.Scheme != "https" && u.Scheme != "http" && u.Scheme != "oci") || u.Host == "" {
		v.errf(path+"Repo", "%q is not a chart repository URL (https://… or oci://…)", repo)
	} else {
		v.ociRepository(path+"Repo", repo)
	}
	if _, err := semver.StrictNewVersion(strings.TrimPrefix(version, "v")); err != nil {
		v.errf(path+"Version", "%q is not an exact chart version: pin one such as 4.0.18", version)
	}
}

func (v *validator) storage() {
	n := v.c.Storage.NFS
	if n.Server == "" {
		v.errf("storage.nfs.server", "is required: the NFS server's host name or IP")
	} else if strings.ContainsAny(n.Server, "/: ") && net.ParseIP(n.Server) == nil {
		v.errf("storage.nfs.server", "%q must be a host name or IP, without scheme, port or path", n.Server)
	}
	if n.Path == "" {
		v.errf("storage.nfs.path", "is required: the exported directory, e.g. /export/k8s")
	} else if !strings.HasPrefix(n.Path, "/") {
		v.errf("storage.nfs.path", "%q must be an absolute path such as /export/k8s", n.Path)
	}
	if n.StorageClass == "" || !dnsSubdomain.MatchString(n.StorageClass) {
		v.errf("storage.nfs.storageClass", "%q is not a valid StorageClass name (lowercase DNS subdomain)", n.StorageClass)
	}
	if n.ReclaimPolicy != "Delete" && n.ReclaimPolicy != "Retain" {
		v.errf("storage.nfs.reclaimPolicy", "%q must be Delete or Retain", n.ReclaimPolicy)
	}
	v.chart("storage.nfs.chart", n.ChartRepo, n.ChartVersion)
	v.valuesFile("storage.nfs.valuesFile", n.ValuesFile)
	for path, port := range map[string]int{"storage.nfs.probe.portmapperPort": n.Probe.PortmapperPort, "storage.nfs.probe.mountPort": n.Probe.MountPort, "storage.nfs.probe.nfsPort": n.Probe.NFSPort} {
		if port < 0 || port > 65535 {
			v.errf(path, "%d is not a port", port)
		}
	}
	v.positive("storage.nfs.probe.timeout", n.Probe.Timeout)
}

var dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$`)

func (v *validator) cni() {
	c := v.c.CNI
	switch c.Name {
	case "flannel", "none":
	case "cilium":
		v.chart("cni.cilium.chart", c.Cilium.ChartRepo, c.Cilium.ChartVersion)
		v.file("cni.cilium.valuesFile", c.Cilium.ValuesFile)
		v.ciliumCompatibility()
		v.ciliumValues()
	default:
		v.errf("cni.name", "%q is not supported: use flannel (Talos default), cilium, or none", c.Name)
	}
}

// minFluxVersion is the oldest Flux whose controllers serve every API
// version bootstrap writes: GitRepository and Kustomization v1 (Flux
// v2.0.0) and HelmRelease v2 (helm-controller v1.0.0, shipped with Flux
// v2.3.0; the pairing is from flux2's release notes, unverified here).
var minFluxVersion = semver.MustParse("2.3.0")

// fluxKubernetesFloors are the oldest Kubernetes `flux check --pre`
// accepts, per Flux minor, read from flux2's cmd/flux/check.go
// kubernetesConstraints at every tag from v2.3.0 to v2.9.4 (and v2.9.5 in
// the module cache): every patch release of a minor has its minor's
// floor. A minor after the newest listed is held to that newest floor
// (floors only rose from v2.3 to v2.9); its own is unverified here.
var fluxKubernetesFloors = []struct{ flux, kubernetes *semver.Version }{
	{semver.MustParse("2.3.0"), semver.MustParse("1.28.0")},
	{semver.MustParse("2.4.0"), semver.MustParse("1.28.0")},
	{semver.MustParse("2.5.0"), semver.MustParse("1.30.0")},
	{semver.MustParse("2.6.0"), semver.MustParse("1.31.0")},
	{semver.MustParse("2.7.0"), semver.MustParse("1.32.0")},
	{semver.MustParse("2.8.0"), semver.MustParse("1.33.0")},
	{semver.MustParse("2.9.0"), semver.MustParse("1.33.0")},
}

// fluxKubernetesFloor is the oldest Kubernetes Flux fv runs on, and the
// newest Flux before fv's floor rose past kv (nil when none runs on kv).
func fluxKubernetesFloor(fv, kv *semver.Version) (floor, fits *semver.Version) {
	for _, f := range fluxKubernetesFloors {
		if !fv.LessThan(f.flux) {
			floor = f.kubernetes
		}
	}
	for _, f := range fluxKubernetesFloors {
		if !kv.LessThan(f.kubernetes) {
			fits = f.flux
		}
	}
	return floor, fits
}

var knownFluxComponents = map[string]bool{
	"source-controller": true, "kustomize-controller": true, "helm-controller": true,
	"notification-controller": true, "image-reflector-controller": true, "image-automation-controller": true,
	// An extra component since Flux v2.7 (flux2 v2.9.5
	// pkg/manifestgen/install/options.go ComponentsExtra).
	"source-watcher": true,
}

func (v *validator) flux() {
	f := v.c.Flux
	ls := f.LocalSnapshot
	if f.Repo == "" && !ls.Enabled {
		v.errf("flux.repo", "is required unless flux.localSnapshot.enabled is true: the git URL Flux syncs from (env %s)", EnvGitRepo)
	} else if f.Repo != "" {
		u, err := url.Parse(f.Repo)
		switch {
		case strings.HasPrefix(f.Repo, "git://"):
			v.errf("flux.repo", "%q uses git://, which Flux refuses: use https:// or ssh://, or flux.localSnapshot for a local tree", f.Repo)
		case err != nil || (u.Scheme != "https" && u.Scheme != "http" && u.Scheme != "ssh") || u.Host == "":
			v.errf("flux.repo", "%q must be an http(s):// or ssh:// URL (scp-style git@host:repo is not accepted by Flux: write ssh://git@host/repo)", f.Repo)
		case u.Scheme == "ssh":
			if f.Auth.SSHKeyFile == "" {
				v.errf("flux.auth.sshKeyFile", "is required for the ssh repository %s: a deploy key file", f.Repo)
			}
			v.knownHosts(u)
		}
	}
	if f.Branch == "" {
		v.errf("flux.branch", "is required (env %s)", EnvGitBranch)
	}
	if !strings.HasPrefix(f.Path, "./") {
		v.errf("flux.path", "%q must be relative to the repository root and start with ./ (e.g. ./infra)", f.Path)
	}
	if fv, err := semver.StrictNewVersion(strings.TrimPrefix(f.Version, "v")); err != nil || !strings.HasPrefix(f.Version, "v") {
		v.errf("flux.version", "%q is not a Flux version: use the form v2.9.5", f.Version)
	} else if fv.LessThan(minFluxVersion) || fv.Major() != 2 {
		v.errf("flux.version", "%s cannot be installed by bootstrap: it writes helm.toolkit.fluxcd.io/v2 HelmReleases and source/kustomize v1 objects, which Flux serves from %s on (Flux 1 is end-of-life); use %s or later in v2", f.Version, "v"+minFluxVersion.String(), "v"+minFluxVersion.String())
	} else if kv, err := semver.NewVersion(strings.TrimPrefix(v.c.Cluster.KubernetesVersion, "v")); err == nil {
		if floor, fits := fluxKubernetesFloor(fv, kv); floor != nil && kv.LessThan(floor) {
			hint := "upgrade Kubernetes first"
			if fits != nil {
				hint += fmt.Sprintf(", or pin Flux v%d.%d (the newest minor that runs on %s)", fits.Major(), fits.Minor(), v.c.Cluster.KubernetesVersion)
			}
			v.errf("flux.version", "%s needs Kubernetes %s or later (flux check --pre: flux2 %s cmd/flux/check.go kubernetesConstraints), and cluster.kubernetesVersion is %s: %s",
				f.Version, floor, f.Version, v.c.Cluster.KubernetesVersion, hint)
		}
	}
	if len(f.Components) == 0 {
		v.errf("flux.components", "is empty: source-controller and kustomize-controller are needed")
	}
	has := map[string]bool{}
	for i, c := range f.Components {
		if !knownFluxComponents[c] {
			v.errf(fmt.Sprintf("flux.components[%d]", i), "%q is not a Flux component", c)
		}
		has[c] = true
	}
	if len(f.Components) > 0 && (!has["source-controller"] || !has["kustomize-controller"]) {
		v.errf("flux.components", "must include source-controller and kustomize-controller (the GitRepository and Kustomization need them)")
	}
	v.positive("flux.interval", f.Interval)
	v.positive("flux.timeout", f.Timeout)
	v.sshKey("flux.auth.sshKeyFile", f.Auth.SSHKeyFile)
	if f.Auth.SSHKeyFile != "" && strings.HasPrefix(f.Repo, "http") {
		v.warnf("flux.auth.sshKeyFile", "is set but flux.repo %s is %s: the key is not used (set tokenFile or tokenEnv, or use the ssh:// URL)", f.Repo, strings.SplitN(f.Repo, ":", 2)[0])
	}
	v.manifests()
	if f.Path != "" && strings.HasPrefix(f.Path, "./") {
		if clean := path.Clean(f.Path); clean == ".." || strings.HasPrefix(clean, "../") {
			v.errf("flux.path", "%q leaves the repository (it cleans to %s): name a directory inside it, e.g. ./infra", f.Path, clean)
		}
	}
	if u, err := url.Parse(f.Repo); err != nil || u.Scheme != "ssh" {
		v.file("flux.auth.knownHostsFile", f.Auth.KnownHostsFile)
	}
	if data, ok := v.secretFile("flux.auth.tokenFile", f.Auth.TokenFile); ok && strings.TrimSpace(string(data)) == "" {
		v.errf("flux.auth.tokenFile", "%s is empty: put the HTTPS token in it (the clone would go without one)", f.Auth.TokenFile)
	}
	if f.Auth.TokenEnv != "" && f.Auth.TokenFile != "" {
		v.errf("flux.auth", "set only one of tokenFile and tokenEnv")
	}
	if f.Auth.Username != "" && f.Auth.TokenFile == "" && f.Auth.TokenEnv == "" {
		v.warnf("flux.auth.username", "is set but neither tokenFile nor tokenEnv is: the clone goes without credentials (anonymous); set one, or remove the user name")
	}
	if ls.Enabled {
		if _, port, err := net.SplitHostPort(ls.Listen); err != nil {
			v.errf("flux.localSnapshot.listen", "%q is not host:port (e.g. 0.0.0.0:8418)", ls.Listen)
		} else if !portInRange(port) {
			v.errf("flux.localSnapshot.listen", "port %s is not a TCP port to listen on (1-65535; 0 would pick a random one the url cannot name), e.g. 0.0.0.0:8418", port)
		}
		u, err := url.Parse(ls.URL)
		switch {
		case ls.URL == "":
			v.errf("flux.localSnapshot.url", "is required: the URL the cluster reaches this host at, e.g. http://10.0.20.2:8418/homelab.git")
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
			v.errf("flux.localSnapshot.url", "%q must be an http(s) URL (Flux refuses git://)", ls.URL)
		default:
			if ip := net.ParseIP(u.Hostname()); ip != nil && ip.IsLoopback() {
				v.warnf("flux.localSnapshot.url", "%s is a loopback address: pods on the cluster cannot reach it; use this host's LAN address", u.Hostname())
			}
		}
		if st, err := os.Stat(v.c.Resolve(ls.Source)); err != nil || !st.IsDir() {
			v.errf("flux.localSnapshot.source", "%s is not a directory (relative to the config file)", ls.Source)
		}
		if ls.Refresh < 0 {
			v.errf("flux.localSnapshot.refresh", "must not be negative")
		}
		v.snapshotTLS(u)
	}
}

func (v *validator) postcheck() {
	p := v.c.Postcheck
	v.positive("postcheck.timeout", p.Timeout)
	v.positive("postcheck.pvcTimeout", p.PVCTimeout)
	if p.Keep < 1 {
		v.errf("postcheck.keep", "must be at least 1, got %d", p.Keep)
	}
	if p.CertWarnDays < 0 {
		v.errf("postcheck.certWarnDays", "must not be negative")
	}
	if b := v.c.Backup; b.Keep < 1 {
		v.errf("backup.keep", "must be at least 1, got %d", b.Keep)
	}
	v.positive("backup.maxAge", v.c.Backup.MaxAge)
	v.backupCopy()
	v.notify()
	if v.c.State.KeepRuns < 1 {
		v.errf("state.keepRuns", "must be at least 1, got %d", v.c.State.KeepRuns)
	}
	if v.c.State.Dir == "" {
		v.errf("state.dir", "is required")
	}
	if v.c.State.TalosDir == "" {
		v.errf("state.talosDir", "is required")
	}
}

func unwrapPathErr(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return sortedCopy(out)
}

// portInRange reports whether p is a TCP port a server can be reached at:
// 1 to 65535 (0 asks the kernel for any free port).
func portInRange(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}

// stateDirs warns when the run state and the Talos files share a
// directory: the per-cluster subdirectories then mix (state.json and the
// lock beside secrets.yaml), and a tool that archives or cleans one (the
// run logs, `bootstrap destroy`) reaches into the other.
func (v *validator) stateDirs() {
	d, t := v.c.Resolve(v.c.State.Dir), v.c.Resolve(v.c.State.TalosDir)
	if d == "" || t == "" {
		return
	}
	inside := func(a, b string) bool {
		rel, err := filepath.Rel(b, a)
		return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
	}
	switch {
	case d == t:
		v.warnf("state.talosDir", "%s is also state.dir: run state and the cluster's secrets would share %s/<cluster>/; give each its own directory (defaults: ai/state and .talos)", v.c.State.TalosDir, v.c.State.TalosDir)
	case inside(t, d) || inside(d, t):
		v.warnf("state.talosDir", "%s and state.dir %s are nested: keep the run state and the cluster's secrets apart (defaults: ai/state and .talos)", v.c.State.TalosDir, v.c.State.Dir)
	}
}
