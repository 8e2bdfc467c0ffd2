package factory

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/homelab/bootstrap/internal/fsutil"
)

// Catalog is the list of official extensions a factory offers for one Talos
// version, as fetched at precheck and kept in the state directory so that
// `config validate` can check extension names without a call.
type Catalog struct {
	Factory    string          `json:"factory"`
	Version    string          `json:"talosVersion"`
	Fetched    time.Time       `json:"fetched"`
	Extensions []ExtensionInfo `json:"extensions"`
}

// CatalogPath is where the catalog of a Talos version lives in dir.
func CatalogPath(dir, version string) string {
	return filepath.Join(dir, "factory-extensions-"+version+".json")
}

// LoadCatalog reads the cached catalog of factoryURL's extensions for
// version; ok is false when there is none for that factory and version.
func LoadCatalog(dir, factoryURL, version string) (c Catalog, ok bool, err error) {
	data, err := os.ReadFile(CatalogPath(dir, version))
	if errors.Is(err, fs.ErrNotExist) {
		return Catalog{}, false, nil
	}
	if err != nil {
		return Catalog{}, false, err
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return Catalog{}, false, fmt.Errorf("%s: %w", CatalogPath(dir, version), err)
	}
	if strings.TrimSuffix(c.Factory, "/") != strings.TrimSuffix(factoryURL, "/") || c.Version != version {
		return Catalog{}, false, nil
	}
	return c, true, nil
}

// Save writes the catalog atomically into dir.
func (c Catalog) Save(dir string) error {
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return fsutil.WriteAtomic(CatalogPath(dir, c.Version), append(data, '\n'), 0o644)
}

// Lookup finds an extension by the name a schematic uses. The factory also
// accepts a few old names it maps to new ones (ExtensionNameAlias in
// internal/profile/profile.go at image-factory v1.5.0); renamedTo is the
// current name when name is one of them.
func (c Catalog) Lookup(name string) (info ExtensionInfo, renamedTo string, ok bool) {
	find := func(n string) (ExtensionInfo, bool) {
		i := slices.IndexFunc(c.Extensions, func(e ExtensionInfo) bool { return e.Name == n })
		if i < 0 {
			return ExtensionInfo{}, false
		}
		return c.Extensions[i], true
	}
	if e, ok := find(name); ok {
		return e, "", true
	}
	if alias, ok := aliases[name]; ok {
		if e, ok := find(alias); ok {
			return e, alias, true
		}
	}
	return ExtensionInfo{}, "", false
}

// Similar lists catalog names sharing the last path element's first three
// letters with name, for "did you mean" hints.
func (c Catalog) Similar(name string) []string {
	base := name[strings.LastIndex(name, "/")+1:]
	if len(base) > 3 {
		base = base[:3]
	}
	var out []string
	for _, e := range c.Extensions {
		if strings.Contains(e.Name[strings.LastIndex(e.Name, "/")+1:], base) {
			out = append(out, e.Name)
		}
	}
	if len(out) > 5 {
		out = out[:5]
	}
	return out
}

// aliases are the old extension names the factory still resolves
// (ExtensionNameAlias, internal/profile/profile.go at image-factory v1.5.0).
var aliases = map[string]string{
	"siderolabs/v4l-uvc":                        "siderolabs/v4l-uvc-drivers",
	"siderolabs/usb-modem":                      "siderolabs/usb-modem-drivers",
	"siderolabs/gasket":                         "siderolabs/gasket-driver",
	"siderolabs/talos-vmtoolsd":                 "siderolabs/vmtoolsd-guest-agent",
	"siderolabs/xe-guest-utilities":             "siderolabs/xen-guest-agent",
	"siderolabs/nvidia-container-toolkit":       "siderolabs/nvidia-container-toolkit-lts",
	"siderolabs/nvidia-open-gpu-kernel-modules": "siderolabs/nvidia-open-gpu-kernel-modules-lts",
	"siderolabs/nonfree-kmod-nvidia":            "siderolabs/nonfree-kmod-nvidia-lts",
	"siderolabs/nvidia-fabricmanager":           "siderolabs/nvidia-fabric-manager-lts",
	"siderolabs/i915-ucode":                     "siderolabs/i915",
	"siderolabs/amdgpu-firmware":                "siderolabs/amdgpu",
}

// ManifestName is the name a node reports an official extension under
// (its manifest's metadata.name): the last element of the name the factory
// builds it under. An old name the factory still accepts is built as its
// new one, so a schematic listing siderolabs/i915-ucode gets a node
// reporting i915. In siderolabs/extensions v1.13.3 every manifest's name
// (*/manifest.yaml.tmpl) is its package's name, which is the image the
// Makefile's TARGETS publish as ghcr.io/siderolabs/<name>: the rule holds
// for all 83 extensions there.
func ManifestName(name string) string {
	if current, ok := aliases[name]; ok {
		name = current
	}
	return name[strings.LastIndex(name, "/")+1:]
}

// GuestAgent is the extension that runs the QEMU guest agent in Talos; a
// VM gets agent: 1 only when its image carries it.
const GuestAgent = "siderolabs/qemu-guest-agent"

// SchematicExtension is the name of the virtual extension the factory adds
// to every image it builds, whose version is the schematic ID
// (constants.SchematicIDExtensionName and GetSchematicExtension in
// internal/artifacts/schematic.go at image-factory v1.5.0): how a running
// node tells which schematic it was installed from.
const SchematicExtension = "schematic"
