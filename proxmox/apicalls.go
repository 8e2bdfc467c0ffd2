package proxmox

// APICall is one Proxmox VE API method this package calls, with the
// response fields it decodes. The schema tests hold the table to what the
// package really sends (every call pvesim receives in the tests must be
// here) and to Proxmox's published API schema of every supported release:
// the method exists, each decoded field appears in its returns schema
// where that is typed, and the privileges the precheck asks for cover the
// method's declared permission check.
type APICall struct {
	// Method and Path as the schema names them ("GET",
	// "/nodes/{node}/qemu/{vmid}/status/current").
	Method, Path string
	// Fields the package reads from the answer's data: "version", an
	// object's "memory.total", a list item's "[].vmid"; a trailing "?"
	// marks one read only when present (it need exist in one release).
	Fields []string
	// Unlisted are fields the package reads that the returns schema does
	// not list although the code returns them, with the source saying so.
	Unlisted map[string]string
	// Since is the first PVE release the package makes the call on ("":
	// every supported release, 8.2 and later).
	Since string
	// Optional says how the package does without the call when the token
	// may not make it (a refusal only degrades a precheck row); such a
	// call's privileges need not be among those the precheck requires.
	Optional string
}

// APICalls is every method this package calls, through Telmate or itself.
var APICalls = []APICall{
	{Method: "POST", Path: "/access/ticket", Fields: []string{"ticket", "CSRFPreventionToken"}},
	{Method: "GET", Path: "/access/permissions"},
	{Method: "GET", Path: "/version", Fields: []string{"version", "release"}},
	{Method: "GET", Path: "/nodes", Fields: []string{"[].node", "[].status"}},
	{Method: "GET", Path: "/cluster/status", Fields: []string{"[].type", "[].name", "[].quorate", "[].online"},
		Optional: "the quorum row warns that it cannot tell (checkQuorum)"},
	{Method: "GET", Path: "/cluster/resources", Fields: []string{"[].type", "[].vmid", "[].name", "[].node",
		"[].status", "[].tags", "[].lock", "[].template", "[].maxmem", "[].maxcpu"},
		Unlisted: map[string]string{
			"[].tags":     "8.2's schema lists them from 8.3 on; pve-manager 8.2.4 faa83925 PVE/API2/Cluster.pm resources returns lock and tags (get_guest_config_properties)",
			"[].lock":     "as tags",
			"[].template": "pve-manager 8.2.4 PVE/API2Tools.pm extract_vm_stats sets template",
		}},
	{Method: "GET", Path: "/cluster/nextid"},
	{Method: "GET", Path: "/cluster/options", Fields: []string{"allowed-tags", "registered-tags", "user-tag-access"}},
	{Method: "GET", Path: "/cluster/sdn/vnets/{vnet}", Fields: []string{"zone"}},
	{Method: "POST", Path: "/cluster/ha/resources"},
	{Method: "DELETE", Path: "/cluster/ha/resources/{sid}"},
	{Method: "GET", Path: "/cluster/ha/rules", Since: "9.0", Fields: []string{"[].rule", "[].type", "[].affinity", "[].resources", "[].disable?"},
		Unlisted: map[string]string{
			"[].type":      "pve-ha-manager 5.2.0 src/PVE/API2/HA/Rules.pm index returns each rule's config ($get_api_ha_rule); the schema lists only rule",
			"[].affinity":  "as type",
			"[].resources": "as type (encode_value: a sorted comma list)",
			"[].disable":   "as type, set only on a disabled rule",
		}},
	{Method: "POST", Path: "/cluster/ha/rules", Since: "9.0"},
	{Method: "PUT", Path: "/cluster/ha/rules/{rule}", Since: "9.0"},
	{Method: "DELETE", Path: "/cluster/ha/rules/{rule}", Since: "9.0"},
	{Method: "GET", Path: "/nodes/{node}/status", Fields: []string{"uptime", "memory.total", "memory.used",
		"memory.available?", "cpuinfo.cpus", "cpuinfo.model"}},
	{Method: "GET", Path: "/nodes/{node}/rrddata", Fields: []string{"[].arcsize"}},
	{Method: "GET", Path: "/nodes/{node}/apt/versions", Fields: []string{"[].Package", "[].OldVersion", "[].Version"}},
	{Method: "GET", Path: "/nodes/{node}/network", Fields: []string{"[].iface", "[].type", "[].active", "[].cidr",
		"[].bridge_vlan_aware", "[].bridge_vids", "[].bridge_ports", "[].ovs_ports", "[].vlanaware", "[].mtu"},
		Unlisted: map[string]string{"[].vlanaware": "a VNet's entry: pve-network 1.3.0 src/PVE/Network/SDN.pm get_local_vnets"}},
	{Method: "GET", Path: "/cluster/mapping/pci", Fields: []string{"[].id", "[].map", "[].mdev?", "[].live-migration-capable?"},
		Unlisted: map[string]string{
			"[].mdev":                   "pve-manager 9.2.11 and 8.4.21 PVE/API2/Cluster/Mapping/PCI.pm index returns each mapping's whole config entry (dclone); the schema lists only id, map, description, checks",
			"[].live-migration-capable": "as mdev; the key exists from pve-guest-common 5.1.7 (PVE 8.4)",
		},
		Optional: "only when a VM passes a PCI device (checkPCI); a mapping the token cannot see makes the PCI row warn"},
	{Method: "GET", Path: "/nodes/{node}/hardware/pci", Fields: []string{"[].id", "[].vendor", "[].device", "[].iommugroup", "[].subsystem_vendor", "[].subsystem_device", "[].mdev"},
		Optional: "only when a VM passes a PCI device; without Sys.Audit on / the PCI row warns that it could not check the devices"},
	{Method: "GET", Path: "/nodes/{node}/storage", Fields: []string{"[].storage", "[].type", "[].content", "[].active",
		"[].enabled", "[].shared", "[].total", "[].used", "[].avail"}},
	{Method: "GET", Path: "/storage/{storage}", Fields: []string{"sparse?"},
		Optional: "a zfspool whose 'sparse' cannot be read is judged thick, and a shortfall warns (diskRoom)"},
	{Method: "GET", Path: "/nodes/{node}/storage/{storage}/content", Fields: []string{"[].volid", "[].size"}},
	{Method: "POST", Path: "/nodes/{node}/storage/{storage}/download-url"},
	{Method: "GET", Path: "/nodes/{node}/tasks/{upid}/status", Fields: []string{"status", "exitstatus"}},
	{Method: "POST", Path: "/nodes/{node}/qemu"},
	{Method: "DELETE", Path: "/nodes/{node}/qemu/{vmid}"},
	{Method: "PUT", Path: "/nodes/{node}/qemu/{vmid}/config"},
	{Method: "PUT", Path: "/nodes/{node}/qemu/{vmid}/resize"},
	{Method: "GET", Path: "/nodes/{node}/qemu/{vmid}/pending", Fields: []string{"[].key", "[].value", "[].pending", "[].delete"}},
	{Method: "GET", Path: "/nodes/{node}/qemu/{vmid}/status/current", Fields: []string{"name", "status", "lock", "tags", "ha"}},
	{Method: "POST", Path: "/nodes/{node}/qemu/{vmid}/status/start"},
	{Method: "POST", Path: "/nodes/{node}/qemu/{vmid}/status/stop"},
	{Method: "POST", Path: "/nodes/{node}/qemu/{vmid}/agent/ping"},
}
