package proxmox

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	pxapi "github.com/Telmate/proxmox-api-go/proxmox"
	"golang.org/x/sync/errgroup"

	"github.com/homelab/bootstrap/internal/retry"
)

// Version is the pve-manager version.
type Version struct {
	Major, Minor, Patch int
	// Release is "8.2"; Full the whole string ("8.2.4").
	Release string
	Full    string
}

func (v Version) String() string { return v.Full }

// AtLeast reports whether v >= major.minor.
func (v Version) AtLeast(major, minor int) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

// Version reads the API's version (GET /version).
func (c *Client) Version(ctx context.Context) (Version, error) {
	m, err := c.getMap(ctx, "/version")
	if err != nil {
		return Version{}, err
	}
	full, _ := m["version"].(string)
	v, err := ParseVersion(full)
	v.Release, _ = m["release"].(string)
	return v, err
}

// ParseVersion reads "9.2.11" (a Debian version's upstream part: "-1" or
// "~bpo" suffixes are dropped).
func ParseVersion(full string) (Version, error) {
	v := Version{Full: full}
	parts := strings.Split(full, ".")
	nums := []*int{&v.Major, &v.Minor, &v.Patch}
	for i := 0; i < len(parts) && i < 3; i++ {
		digits := parts[i]
		if j := strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }); j >= 0 {
			digits = digits[:j]
		}
		n, err := strconv.Atoi(digits)
		if err != nil {
			return v, fmt.Errorf("unreadable Proxmox version %q", full)
		}
		*nums[i] = n
	}
	if v.Release == "" {
		v.Release = fmt.Sprintf("%d.%d", v.Major, v.Minor)
	}
	return v, nil
}

// AtLeastPatch reports whether v >= major.minor.patch.
func (v Version) AtLeastPatch(major, minor, patch int) bool {
	if v.Major != major || v.Minor != minor {
		return v.AtLeast(major, minor)
	}
	return v.Patch >= patch
}

// InstalledPackage reads the installed version of a Proxmox package from
// GET /nodes/{node}/apt/versions (Sys.Audit on /nodes/{node}, which every
// run needs for node status). In each entry OldVersion is the installed
// version and Version apt's candidate (pve-manager 9.2.11
// PVE/API2/APT.pm $assemble_pkginfo): they differ while an upgrade is
// pending, so the candidate is used only when no OldVersion is given.
// found is false when the package is not listed.
func (c *Client) InstalledPackage(ctx context.Context, pkg string) (v Version, found bool, err error) {
	all, err := c.InstalledPackages(ctx, pkg)
	if err != nil {
		return Version{}, false, err
	}
	v, found = all[pkg]
	return v, found, nil
}

// InstalledPackages reads the installed versions of Proxmox packages with
// one GET /nodes/{node}/apt/versions (see InstalledPackage); a package
// the list lacks has no entry.
func (c *Client) InstalledPackages(ctx context.Context, pkgs ...string) (map[string]Version, error) {
	list, err := c.getList(ctx, "/nodes/"+c.node+"/apt/versions")
	if err != nil {
		return nil, err
	}
	out := map[string]Version{}
	for _, e := range list {
		name, _ := e["Package"].(string)
		if !slices.Contains(pkgs, name) {
			continue
		}
		ver, _ := e["OldVersion"].(string)
		if ver == "" {
			ver, _ = e["Version"].(string)
		}
		v, err := ParseVersion(ver)
		if err != nil {
			return nil, fmt.Errorf("reading the version of %s on %s: %w", name, c.node, err)
		}
		out[name] = v
	}
	return out, nil
}

// NodeInfo is one cluster member from GET /nodes.
type NodeInfo struct {
	Name   string
	Online bool
	Status string
}

// Nodes lists the cluster's nodes and whether they are online.
func (c *Client) Nodes(ctx context.Context) ([]NodeInfo, error) {
	list, err := c.getList(ctx, "/nodes")
	if err != nil {
		return nil, err
	}
	out := make([]NodeInfo, 0, len(list))
	for _, e := range list {
		st := str(e["status"])
		out = append(out, NodeInfo{Name: str(e["node"]), Status: st, Online: st == "online"})
	}
	return out, nil
}

// ClusterStatus is GET /cluster/status (pve-manager 9.2.11
// PVE/API2/Cluster.pm get_status).
type ClusterStatus struct {
	// Cluster: the node is a member of a PVE cluster (a standalone node
	// has no "cluster" row).
	Cluster bool
	Name    string
	// Quorate: corosync has its majority; without it pmxcfs is read-only
	// and creates, starts and migrations fail ("cluster not ready - no
	// quorum?", pve-cluster src/PVE/Cluster.pm check_cfs_quorum).
	Quorate bool
	// Members and Online count the cluster's members and those online.
	Members, Online int
}

// ClusterStatus reads GET /cluster/status (Sys.Audit on /).
func (c *Client) ClusterStatus(ctx context.Context) (ClusterStatus, error) {
	list, err := c.getList(ctx, "/cluster/status")
	if err != nil {
		return ClusterStatus{}, err
	}
	var out ClusterStatus
	for _, e := range list {
		switch str(e["type"]) {
		case "cluster":
			out.Cluster, out.Name, out.Quorate = true, str(e["name"]), num(e["quorate"]) == 1
		case "node":
			out.Members++
			if num(e["online"]) == 1 {
				out.Online++
			}
		}
	}
	if !out.Cluster {
		out.Quorate = true
	}
	return out, nil
}

// NodeStatus is the capacity of the node.
type NodeStatus struct {
	CPUs        int
	CPUModel    string
	MemoryTotal int64
	MemoryUsed  int64
	// MemoryAvailable is what new VMs can have: the kernel's MemAvailable,
	// which counts the page cache it can drop. PVE 9 reports it as
	// memory.available; before, used is total − MemAvailable (since
	// pve-common 8.3.1), so total − used. memory.free is not read: from
	// pve-common 8.3.1 (commit 219fe33) it is the raw MemFree, far too low
	// on a host with a warm cache; before, it counted buffers and cache.
	MemoryAvailable int64
	Uptime          int64
}

// NodeStatus reads GET /nodes/{node}/status.
func (c *Client) NodeStatus(ctx context.Context) (NodeStatus, error) {
	m, err := c.getMap(ctx, "/nodes/"+c.node+"/status")
	if err != nil {
		return NodeStatus{}, err
	}
	ns := NodeStatus{Uptime: num(m["uptime"])}
	if mem, ok := m["memory"].(map[string]any); ok {
		ns.MemoryTotal, ns.MemoryUsed = num(mem["total"]), num(mem["used"])
		if avail, ok := mem["available"]; ok {
			ns.MemoryAvailable = num(avail)
		} else {
			ns.MemoryAvailable = ns.MemoryTotal - ns.MemoryUsed
		}
	}
	if ci, ok := m["cpuinfo"].(map[string]any); ok {
		ns.CPUs, ns.CPUModel = int(num(ci["cpus"])), str(ci["model"])
	}
	return ns, nil
}

// ZFSARC reads the ZFS ARC's current size from the node's RRD (GET
// /nodes/{node}/rrddata?timeframe=hour): node status does not report it,
// and Linux counts the ARC as used memory, not in MemAvailable, although
// ZFS gives it back under memory pressure. PVE 9 records it as arcsize
// (pve-manager 9.2.11 PVE/Service/pvestatd.pm, pve-node-9.0 schema); its
// UI shows 'used without ZFS ARC' as memused − arcsize. known is false
// when the RRD has no arcsize, as on PVE 8 (pve2-node schema).
func (c *Client) ZFSARC(ctx context.Context) (arc int64, known bool, err error) {
	rows, err := c.getList(ctx, "/nodes/"+c.node+"/rrddata?timeframe=hour&cf=AVERAGE")
	if err != nil {
		return 0, false, err
	}
	// Rows run oldest first; the current step is not consolidated yet and
	// carries no values, so the newest row with a value is the one to read.
	for i := len(rows) - 1; i >= 0; i-- {
		if v, ok := rows[i]["arcsize"]; ok {
			return num(v), true, nil
		}
	}
	return 0, false, nil
}

// Storage is one storage as the node sees it.
type Storage struct {
	Name    string
	Type    string
	Content []string
	Active  bool
	Enabled bool
	Shared  bool
	Total   int64
	Used    int64
	Avail   int64
}

// HasContent reports whether the storage holds content type ct ("images", "iso").
func (s Storage) HasContent(ct string) bool {
	for _, c := range s.Content {
		if c == ct {
			return true
		}
	}
	return false
}

// Provisioning says how a new disk image takes space on a storage type:
// ThickProvisioned takes its whole size from the free space at once,
// ThinProvisioned takes what the guest writes, MaybeThin depends on a
// storage.cfg option a token without Datastore.Allocate cannot read.
type Provisioning int

// The ways a storage type provisions disk images (see Storage.Provisioning).
const (
	ThickProvisioned Provisioning = iota
	ThinProvisioned
	MaybeThin
)

// Provisioning tells how the storage's plugin allocates a new disk image
// (pve-storage 9.1.7): lvmthin creates thin volumes (LvmThinPlugin.pm,
// whose status is the pool's data allocation); image files on dir, nfs,
// cifs, glusterfs, cephfs and btrfs storages are sparse (Plugin.pm
// preallocation_cmd_opt: qcow2 'metadata', raw 'off') unless the storage
// sets 'preallocation'; Ceph RBD images are created with "rbd create
// --size", which allocates nothing (RBDPlugin.pm alloc_image); a
// zfspool's zvols, and those of ZFS over iSCSI (ZFSPlugin.pm, through
// ZFSPoolPlugin's zfs_create_zvol), are thin only with 'sparse' (-s),
// otherwise their refreservation takes the whole size. Storage config
// (GET /storage/{id}) needs Datastore.Allocate: StorageSparse reads
// 'sparse' where the token may; 'preallocation' is not read.
func (s Storage) Provisioning() Provisioning {
	switch s.Type {
	case "lvmthin", "dir", "nfs", "cifs", "glusterfs", "cephfs", "btrfs", "rbd":
		return ThinProvisioned
	case "zfspool", "zfs":
		return MaybeThin
	}
	return ThickProvisioned
}

// StorageSparse reads a storage's 'sparse' option (GET /storage/{id},
// pve-storage 9.1.7 src/PVE/API2/Storage/Config.pm read, which needs
// Datastore.Allocate on /storage/<id>): known is false when the token may
// not read it.
func (c *Client) StorageSparse(ctx context.Context, name string) (sparse, known bool, err error) {
	m, err := c.getMap(ctx, "/storage/"+url.PathEscape(name))
	switch {
	case IsForbidden(err):
		return false, false, nil
	case err != nil:
		return false, false, err
	}
	return num(m["sparse"]) == 1, true, nil
}

// ImagesSize sums the virtual sizes of the disk images on a storage the
// token may see (GET /nodes/{node}/storage/{storage}/content?content=images).
// The index skips every volume check_volume_access refuses (pve-storage
// 9.1.7 src/PVE/API2/Storage/Content.pm index, src/PVE/Storage.pm): an
// image shows only with Datastore.Allocate on the storage, or
// Datastore.Audit on it and VM.Config.Disk on its VM (see ImagesVisible).
// On thin storage this is what the guests may write, against the pool's
// total.
func (c *Client) ImagesSize(ctx context.Context, storage string) (int64, int, error) {
	list, err := c.getList(ctx, "/nodes/"+c.node+"/storage/"+storage+"/content?content=images")
	if err != nil {
		return 0, 0, err
	}
	var sum int64
	for _, e := range list {
		sum += num(e["size"])
	}
	return sum, len(list), nil
}

// Visibility is how much of a storage's images the content index shows
// the token (see ImagesVisible).
type Visibility int

// The answers of ImagesVisible.
const (
	// ImagesHidden: the token has neither Datastore.Allocate nor
	// Datastore.Audit on the storage; the index lists no image.
	ImagesHidden Visibility = iota
	// ImagesOfSomeVMs: Datastore.Audit, but VM.Config.Disk not on every
	// VM (not on /vms): images of the other VMs are left out.
	ImagesOfSomeVMs
	// ImagesAll: every image is listed.
	ImagesAll
)

// ImagesVisible tells what the content index will show of a storage's
// images, from the token's privileges on /storage/<id> and /vms
// (check_volume_access, see ImagesSize).
func (c *Client) ImagesVisible(ctx context.Context, storage string) (Visibility, error) {
	sp := "/storage/" + storage
	held, err := c.Permissions(ctx, []string{sp, "/vms"})
	if err != nil {
		return ImagesHidden, err
	}
	switch {
	case held[sp]["Datastore.Allocate"]:
		return ImagesAll, nil
	case !held[sp]["Datastore.Audit"]:
		return ImagesHidden, nil
	case held["/vms"]["VM.Config.Disk"]:
		return ImagesAll, nil
	}
	return ImagesOfSomeVMs, nil
}

// Storages lists the node's storages the token can see (GET /nodes/{node}/storage).
func (c *Client) Storages(ctx context.Context) ([]Storage, error) {
	list, err := c.getList(ctx, "/nodes/"+c.node+"/storage")
	if err != nil {
		return nil, err
	}
	out := make([]Storage, 0, len(list))
	for _, e := range list {
		st := Storage{
			Name: str(e["storage"]), Type: str(e["type"]),
			Active: num(e["active"]) == 1, Enabled: num(e["enabled"]) == 1, Shared: num(e["shared"]) == 1,
			Total: num(e["total"]), Used: num(e["used"]), Avail: num(e["avail"]),
		}
		for _, ct := range strings.Split(str(e["content"]), ",") {
			if ct = strings.TrimSpace(ct); ct != "" {
				st.Content = append(st.Content, ct)
			}
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Bridge is a Linux bridge, an Open vSwitch bridge or an SDN VNet on the
// node.
type Bridge struct {
	Name string
	// OVS is an Open vSwitch bridge (type OVSBridge): PVE tags a VM's
	// port on it natively (ovs-vsctl add-port … tag=N, pve-common
	// src/PVE/Network.pm tap_plug), so any VLAN works without a
	// VLAN-aware flag, which OVS bridges never have.
	OVS       bool
	VLANAware bool
	// VIDs are the VLANs a VLAN-aware Linux bridge carries on its ports
	// (bridge_vids; "2-4094" when unset, which pve-common 9.2.1
	// src/PVE/Network/Interfaces.pm writes as bridge-vids).
	VIDs string
	// Ports are the bridge's ports (bridge_ports, or ovs_ports).
	Ports  []string
	Active bool
	CIDR   string
	// Zone is the SDN zone whose privileges govern it: localnetwork for a
	// plain bridge, the VNet's zone for a VNet ("" when the token cannot
	// read the VNet's config).
	Zone string
	VNet bool
	// MTU is the bridge's mtu in /etc/network/interfaces (0 when not
	// set there).
	MTU int
}

// Carries says whether a VLAN-aware bridge's ports carry VLAN tag. Only
// the VM's tap is given its tag at start (pve-common 9.2.1
// src/PVE/Network.pm $bridge_add_interface: bridge vlan add dev <tap>
// vid <tag>); the ports carry the VLANs of bridge-vids alone, so a VM on
// another VLAN starts and reaches nothing beyond the host. bridge_vids is
// a pve-vlan-id-or-range-list: tags and lo-hi ranges of 2-4094
// (JSONSchema.pm pve_verify_vlan_id_or_range), split on commas,
// semicolons and white space (pve-common 9.2.1 src/PVE/ParseUtils.pm
// split_list; pve-manager 9.2.11 PVE/API2/Network.pm writes it back
// space-separated).
//
// VLAN 1 is carried whatever bridge-vids says: it is the VLAN
// $bridge_add_interface gives an untagged VM's tap too ($tag = 1 if
// !$tag, pvid untagged), and the ports keep PVID 1, untagged, unless the
// interfaces file sets bridge-pvid (ifupdown2 addons/bridge.py
// _query_check_bridge_port_vidinfo expects a running pvid 1 without it,
// CumulusNetworks/ifupdown2 164248fa; Proxmox ships its own fork of it,
// whose difference there is unverified). bridge-pvid is not in the
// network index, so a port with another PVID is not judged.
func (b Bridge) Carries(tag int) bool {
	if !b.VLANAware || b.VNet || b.OVS || tag <= 1 {
		return true
	}
	for _, part := range strings.FieldsFunc(b.VIDs, func(r rune) bool { return r == ',' || r == ';' || unicode.IsSpace(r) }) {
		lo, hi, rng := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return true // not understood: not judged
		}
		z := a
		if rng {
			if z, err = strconv.Atoi(hi); err != nil {
				return true
			}
		}
		if tag >= a && tag <= z {
			return true
		}
	}
	return false
}

// LocalZone is the SDN zone of plain bridges.
const LocalZone = "localnetwork"

// Bridges lists the node's bridges, Linux and Open vSwitch, and SDN VNets
// (GET /nodes/{node}/network?type=any_bridge, which matches types bridge
// and OVSBridge: pve-manager 9.2.11 and 8.4.21 PVE/API2/Network.pm index). On PVE 8+ the list leaves out
// what the token may neither audit nor use (SDN.Audit/SDN.Use on
// /sdn/zones/<zone>/<bridge>, pve-manager PVE/API2/Network.pm), silently.
func (c *Client) Bridges(ctx context.Context) ([]Bridge, error) {
	list, err := c.getList(ctx, "/nodes/"+c.node+"/network?type=any_bridge")
	if err != nil {
		return nil, err
	}
	var out []Bridge
	for _, e := range list {
		b := Bridge{Name: str(e["iface"]), Active: num(e["active"]) == 1, CIDR: str(e["cidr"]), Zone: LocalZone, MTU: int(num(e["mtu"]))}
		if str(e["type"]) == "vnet" {
			// A VNet's privileges live under its own zone
			// (check_vnet_access, pve-guest-common GuestHelpers.pm); only
			// its config names the zone.
			b.VNet, b.VLANAware, b.Zone = true, num(e["vlanaware"]) == 1, ""
			if m, err := c.getMap(ctx, "/cluster/sdn/vnets/"+url.PathEscape(b.Name)); err == nil {
				b.Zone = str(m["zone"])
			} else if !IsForbidden(err) {
				return nil, err
			}
		} else if str(e["type"]) == "OVSBridge" {
			b.OVS, b.Ports = true, strings.Fields(str(e["ovs_ports"]))
		} else {
			b.VLANAware, b.Ports = num(e["bridge_vlan_aware"]) == 1, strings.Fields(str(e["bridge_ports"]))
			if b.VLANAware {
				b.VIDs = str(e["bridge_vids"])
				if b.VIDs == "" {
					b.VIDs = "2-4094"
				}
			}
		}
		out = append(out, b)
	}
	return out, nil
}

// ISOFile is an ISO on a storage.
type ISOFile struct {
	Storage string
	Name    string
	Size    int64
}

// VolID is "storage:iso/name".
func (f ISOFile) VolID() string { return f.Storage + ":iso/" + f.Name }

// FindISO reports whether file is on storage, using Telmate's content listing.
func (c *Client) FindISO(ctx context.Context, storage, file string) (ISOFile, bool, error) {
	var found ISOFile
	var ok bool
	path := "/nodes/" + c.node + "/storage/" + storage + "/content?content=iso"
	err := retry.Do(ctx, c.opts.Retry, c.log, "list ISOs on "+storage, func(ctx context.Context) error {
		cctx, cl := withCall(ctx)
		files, err := pxapi.ListFiles(cctx, c.px, c.node, storage, pxapi.ContentType_Iso)
		if err != nil {
			return cl.classify("GET", path, err)
		}
		ok = pxapi.CheckFileExistence(file, files)
		for _, f := range *files {
			if f.Name == file {
				found = ISOFile{Storage: storage, Name: f.Name, Size: int64(f.Size)}
			}
		}
		return nil
	})
	return found, ok, err
}

// DownloadRequest asks the node to fetch an ISO from a URL.
type DownloadRequest struct {
	Storage  string
	URL      string
	Filename string
	// Checksum (hex) and ChecksumAlgorithm ("sha256", "sha512", ...) are
	// verified by PVE before the file is kept.
	Checksum          string
	ChecksumAlgorithm string
	// Compression ("gz", "zst", ...) decompresses after download (ISOs
	// only: pve-storage refuses it for any other content).
	Compression string
	// Content is "iso" (the default) or "import" (a disk image).
	Content string
}

// DownloadISO runs POST /nodes/{node}/storage/{storage}/download-url and
// waits for the download task. A failed checksum is fatal.
func (c *Client) DownloadISO(ctx context.Context, r DownloadRequest) error {
	content := r.Content
	if content == "" {
		content = "iso"
	}
	params := map[string]any{"url": r.URL, "content": content, "filename": r.Filename}
	if r.Checksum != "" {
		algo := r.ChecksumAlgorithm
		if algo == "" {
			algo = "sha256"
		}
		params["checksum"], params["checksum-algorithm"] = r.Checksum, algo
	}
	if r.Compression != "" {
		params["compression"] = r.Compression
	}
	path := "/nodes/" + c.node + "/storage/" + r.Storage + "/download-url"
	what := fmt.Sprintf("download of %s to %s", r.Filename, r.Storage)
	return retry.Do(ctx, c.opts.Retry, c.log, what, func(ctx context.Context) error {
		upid, err := c.post(ctx, path, params)
		if err != nil {
			return err
		}
		// Every VM boots from this image, so nothing else can go on
		// while it downloads: its polls start closer than a VM task's
		// (and back off as theirs do, a long download seen at most an
		// eighth of its time late).
		return c.waitTaskFrom(ctx, upid, what, c.opts.DownloadTimeout, min(c.opts.TaskPoll, downloadPoll))
	})
}

// downloadPoll is the first interval between the polls of an ISO
// download's task.
const downloadPoll = 50 * time.Millisecond

// Privileges maps a privilege name to whether it is granted.
type Privileges map[string]bool

// Permissions returns the token's effective privileges on each path (GET
// /access/permissions?path=...), which already accounts for inheritance
// and privilege separation.
func (c *Client) Permissions(ctx context.Context, paths []string) (map[string]Privileges, error) {
	paths = slices.Compact(slices.Sorted(slices.Values(paths)))
	got := make([]Privileges, len(paths))
	// One question per path, up to 16 at once: a run needs six to a dozen
	// paths, and the check waits for the slowest answer, not the sum.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i, p := range paths {
		g.Go(func() error {
			m, err := c.getMap(gctx, "/access/permissions?path="+url.QueryEscape(p))
			if err != nil {
				return err
			}
			privs := Privileges{}
			if pm, ok := m[p].(map[string]any); ok {
				for k := range pm {
					privs[k] = true
				}
			}
			got[i] = privs
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	out := make(map[string]Privileges, len(paths))
	for i, p := range paths {
		out[p] = got[i]
	}
	return out, nil
}

func str(v any) string {
	switch t := v.(type) {
	case string:
		return t
	case nil:
		return ""
	case float64:
		return strconv.FormatFloat(t, 'f', -1, 64)
	default:
		return fmt.Sprint(t)
	}
}

func num(v any) int64 {
	switch t := v.(type) {
	case float64:
		return int64(t)
	case string:
		n, _ := strconv.ParseInt(t, 10, 64)
		return n
	case bool:
		if t {
			return 1
		}
	}
	return 0
}

// TagPolicy is datacenter.cfg's tag policy as the token sees it (GET
// /cluster/options, pve-manager PVE/API2/Cluster.pm get_options).
type TagPolicy struct {
	// Known is true when the token could read user-tag-access and
	// registered-tags (Sys.Audit on /).
	Known bool
	// UserAllow is user-tag-access's user-allow (default free).
	UserAllow string
	// Registered tags need Sys.Modify on /.
	Registered map[string]bool
	// Allowed are the tags the token may set besides free-form ones
	// (allowed-tags: existing ones, the allow-list).
	Allowed map[string]bool
}

// Allows reports whether a user without Sys.Modify on / may set tag
// (get_allowed_tags and assert_tag_permissions in pve-guest-common
// src/PVE/GuestHelpers.pm): not registered, and free-form or allowed.
func (p TagPolicy) Allows(tag string) bool {
	if p.Registered[tag] {
		return false
	}
	return (p.Known && p.UserAllow == "free") || p.Allowed[tag]
}

// TagPolicy reads the datacenter's tag policy.
func (c *Client) TagPolicy(ctx context.Context) (TagPolicy, error) {
	m, err := c.getMap(ctx, "/cluster/options")
	if err != nil {
		return TagPolicy{}, err
	}
	p := TagPolicy{UserAllow: "free", Registered: map[string]bool{}, Allowed: map[string]bool{}}
	for _, t := range list(m["allowed-tags"]) {
		p.Allowed[t] = true
	}
	for _, t := range list(m["registered-tags"]) {
		p.Registered[t] = true
	}
	// Without Sys.Audit on / only console and tag-style come back.
	held, err := c.Permissions(ctx, []string{"/"})
	if err != nil {
		return p, err
	}
	p.Known = held["/"]["Sys.Audit"]
	if uta, ok := m["user-tag-access"].(map[string]any); ok {
		if a := str(uta["user-allow"]); a != "" {
			p.UserAllow = a
		}
	}
	return p, nil
}

func list(v any) []string {
	switch t := v.(type) {
	case []any:
		out := make([]string, 0, len(t))
		for _, e := range t {
			out = append(out, str(e))
		}
		return out
	case string:
		return strings.FieldsFunc(t, func(r rune) bool { return r == ';' || r == ',' })
	}
	return nil
}
