package pvesim

import (
	"fmt"
	"strconv"
	"strings"
)

// defaultQemuServer is the qemu-server release current when a pve-manager
// release was (its "bump version" commit on or before the pve-docs schema
// dump of that release): 8.2 → 8.2.4 (00d68b8d), 8.3 → 8.2.8 (7547eb37),
// 8.4 → 8.3.12 (a411016f), 9.0 → 9.0.20 (4ce85819), 9.1 → 9.1.9 (6bdc5547),
// 9.2 → 9.2.6 (e6352be6, the newest read). Older releases get
// "<major>.<minor>.0", unverified.
func defaultQemuServer(managerVersion string) string {
	maj, min := splitVersion(managerVersion)
	switch fmt.Sprintf("%d.%d", maj, min) {
	case "8.2":
		return "8.2.4"
	case "8.3":
		return "8.2.8"
	case "8.4":
		return "8.3.12"
	case "9.0":
		return "9.0.20"
	case "9.1":
		return "9.1.9"
	case "9.2":
		return "9.2.6"
	}
	return fmt.Sprintf("%d.%d.0", maj, min)
}

// pveCommon is the pve-common (libpve-common-perl) release current when
// the simulated pve-manager release was, as defaultQemuServer: 8.2 →
// 8.2.2 (7f3dc63), 8.3 → 8.2.9 (5d5b3ab), 8.4 → 8.3.1 (85d46b4), 9.0 →
// 9.0.9 (f8179d2), 9.1 → 9.1.11 (92ce4e4), 9.2 → 9.2.1 (f665029); older
// releases "<major>.<minor>.0", unverified.
func pveCommon(managerVersion string) string {
	maj, min := splitVersion(managerVersion)
	switch fmt.Sprintf("%d.%d", maj, min) {
	case "8.2":
		return "8.2.2"
	case "8.3":
		return "8.2.9"
	case "8.4":
		return "8.3.1"
	case "9.0":
		return "9.0.9"
	case "9.1":
		return "9.1.11"
	case "9.2":
		return "9.2.1"
	}
	return fmt.Sprintf("%d.%d.0", maj, min)
}

// defaultPVEStorage is the pve-storage (libpve-storage-perl) release
// current when the simulated pve-manager release was, as
// defaultQemuServer: 8.2 → 8.2.3 (13a8187), 8.3 → 8.2.9 (39fd552), 8.4 →
// 8.3.6 (0c6234f), 9.0 → 9.0.13 (609752f), 9.1 → 9.1.2 (e26583a), 9.2 →
// 9.1.7 (0c56bad, the newest read). pve-manager 8.2.9 and 8.2.10, cut
// beside 8.3.0, already declare libpve-storage-perl >= 8.2.8
// (pve-manager commit 4055b9d3, debian/control), so they get 8.2.8: the
// 'import' content type and OVA downloads (pve-storage d955a46, 40df25d).
// Older releases get "<major>.<minor>.0", unverified.
func defaultPVEStorage(managerVersion string) string {
	maj, min := splitVersion(managerVersion)
	switch fmt.Sprintf("%d.%d", maj, min) {
	case "8.2":
		if versionAtLeast(managerVersion, 8, 2, 9) {
			return "8.2.8"
		}
		return "8.2.3"
	case "8.3":
		// pve-manager 8.3.6 and 8.3.7, cut beside 8.4.0, declare
		// libpve-storage-perl >= 8.3.6 (4a148ae4, debian/control).
		if versionAtLeast(managerVersion, 8, 3, 6) {
			return "8.3.6"
		}
		return "8.2.9"
	case "8.4":
		return "8.3.6"
	case "9.0":
		return "9.0.13"
	case "9.1":
		return "9.1.2"
	case "9.2":
		return "9.1.7"
	}
	return fmt.Sprintf("%d.%d.0", maj, min)
}

func splitVersion(v string) (major, minor int) {
	parts := strings.SplitN(v, ".", 3)
	major, _ = strconv.Atoi(parts[0])
	if len(parts) > 1 {
		minor, _ = strconv.Atoi(parts[1])
	}
	return major, minor
}

// versionAtLeast compares a dotted version with major.minor.patch.
func versionAtLeast(v string, major, minor, patch int) bool {
	parts := strings.SplitN(v, ".", 3)
	var n [3]int
	for i := range parts {
		n[i], _ = strconv.Atoi(strings.TrimFunc(parts[i], func(r rune) bool { return r < '0' || r > '9' }))
	}
	if n[0] != major {
		return n[0] > major
	}
	if n[1] != minor {
		return n[1] > minor
	}
	return n[2] >= patch
}

// aptVersions answers GET /nodes/{node}/apt/versions (pve-manager 9.2.11
// PVE/API2/APT.pm versions: Sys.Audit on /nodes/{node}): proxmox-ve and
// pve-manager first, then the listed packages by name. Each entry is
// $assemble_pkginfo's: Version is the apt *candidate*, OldVersion the
// installed one (when installed); pve-manager carries ManagerVersion,
// proxmox-ve the RunningKernel. Only the packages pvesim models are
// listed (proxmox-ve, pve-manager, qemu-server, libpve-common-perl,
// libpve-storage-perl).
func (s *Server) aptVersions(r *request) (any, *apiError) {
	if aerr := r.who.check("/nodes/"+s.node.Name, "Sys.Audit"); aerr != nil {
		return nil, aerr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	maj, min := s.versionLocked()
	entry := func(pkg, title, installed, candidate string) map[string]any {
		return map[string]any{
			"Package": pkg, "Title": title, "Description": title, "Origin": "Proxmox",
			"Section": "admin", "Arch": "amd64", "Priority": "optional",
			"Version": candidate, "OldVersion": installed, "CurrentState": "Installed",
		}
	}
	ve := entry("proxmox-ve", "Proxmox Virtual Environment", fmt.Sprintf("%d.%d.0", maj, min), fmt.Sprintf("%d.%d.0", maj, min))
	ve["Arch"] = "all"
	ve["RunningKernel"] = "6.8.12-1-pve"
	mgr := entry("pve-manager", "Proxmox Virtual Environment Management Tools", s.version, s.version)
	mgr["ManagerVersion"] = s.version + "/" + s.repoid
	qs := entry("qemu-server", "Qemu Server Tools", s.opts.QemuServer, s.opts.QemuServerCandidate)
	common := pveCommon(s.version)
	lib := entry("libpve-common-perl", "Proxmox VE base library", common, common)
	lib["Arch"] = "all"
	stor := entry("libpve-storage-perl", "Proxmox VE storage management library", s.opts.PVEStorage, s.opts.PVEStorage)
	stor["Arch"] = "all"
	// The listed packages by name after the first two (APT.pm versions).
	return []any{ve, mgr, lib, stor, qs}, nil
}
