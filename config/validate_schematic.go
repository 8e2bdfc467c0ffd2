package config

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/homelab/bootstrap/factory"
)

// extensionName is how the factory names an official extension: the
// image's repository (ExtensionInfo.Name), e.g. siderolabs/i915.
var extensionName = regexp.MustCompile(`^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)+$`)

// schematic checks cluster.schematic, cluster.factory and the ISO/installer
// pair. Extension names are checked against the factory's list for the
// Talos version when the precheck has cached one in the state directory
// (no call is made here).
func (v *validator) schematic() {
	c := v.c.Cluster
	if u, err := url.Parse(c.Factory); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		v.errf("cluster.factory", "%q is not an Image Factory base URL: use https://factory.talos.dev or your own factory's https://host[:port]", c.Factory)
	}
	if c.FactoryCAFile != "" {
		v.caFile("cluster.factoryCAFile", c.FactoryCAFile)
	}
	seen := map[string]int{}
	valid := true
	for i, e := range c.Schematic.Extensions {
		path := fmt.Sprintf("cluster.schematic.extensions[%d]", i)
		if j, dup := seen[e]; dup {
			v.errf(path, "%q is listed twice (also extensions[%d])", e, j)
			continue
		}
		seen[e] = i
		if !extensionName.MatchString(e) {
			valid = false
			v.errf(path, "%q is not an official extension name: use the factory's form <owner>/<name>, e.g. siderolabs/i915", e)
		}
	}
	for i, a := range c.Schematic.ExtraKernelArgs {
		if strings.TrimSpace(a) == "" || strings.ContainsAny(a, " \t\n") {
			v.errf(fmt.Sprintf("cluster.schematic.extraKernelArgs[%d]", i), "%q must be one kernel argument without spaces, e.g. i915.enable_guc=3", a)
		}
	}
	if valid {
		v.extensionsKnown()
	}
	v.imagesAgree()
}

// extensionsKnown checks the extensions against the cached catalog of the
// factory for this Talos version.
func (v *validator) extensionsKnown() {
	c := v.c.Cluster
	if c.Name == "" || len(c.Schematic.Extensions) == 0 {
		return
	}
	cat, ok, err := factory.LoadCatalog(v.c.Paths().StateDir, c.Factory, c.TalosVersion)
	if err != nil {
		v.warnf("cluster.schematic.extensions", "the cached extension list cannot be read (%v): the names are checked at precheck", err)
		return
	}
	if !ok {
		return
	}
	for i, e := range c.Schematic.Extensions {
		path := fmt.Sprintf("cluster.schematic.extensions[%d]", i)
		_, renamed, found := cat.Lookup(e)
		switch {
		case !found:
			hint := ""
			if sim := cat.Similar(e); len(sim) > 0 {
				hint = "; similar: " + strings.Join(sim, ", ")
			}
			v.errf(path, "%q is not an official extension of Talos %s at %s (list of %d fetched %s)%s: fix the name, or refresh the list with `bootstrap run --stage precheck`",
				e, c.TalosVersion, c.Factory, len(cat.Extensions), cat.Fetched.UTC().Format("2006-01-02 15:04 UTC"), hint)
		case renamed != "":
			v.warnf(path, "%q was renamed to %q; the factory still maps the old name, but use the new one", e, renamed)
		}
	}
}

// imagesAgree warns when the ISO, the installer and cluster.schematic do
// not describe one image: what the ISO carries is gone after the install,
// and the VMs' agent option follows cluster.schematic.
func (v *validator) imagesAgree() {
	im := v.c.Images()
	if im.ISODerived && im.InstallerDerived {
		return
	}
	isoID, isoOK := im.SchematicID, true
	if !im.ISODerived {
		isoID, _, isoOK = factory.ParseISOURL(im.ISOURL)
	}
	instID, instOK := im.SchematicID, true
	if !im.InstallerDerived {
		ref, ok := factory.ParseInstaller(im.InstallImage)
		instID, instOK = ref.ID, ok
	}
	explicit := "proxmox.iso.url"
	if im.ISODerived {
		explicit = "cluster.installImage"
	}
	switch {
	case isoOK && instOK && isoID != instID:
		v.warnf(explicit, "the ISO %s and the installer %s are built from different schematics (%s, %s): what the ISO carries is not what gets installed",
			im.ISOURL, im.InstallImage, factory.ShortID(isoID), factory.ShortID(instID))
	case isoOK && !instOK && isoID != factory.New(nil, nil).MustID():
		v.warnf("cluster.installImage", "%s is not an Image Factory installer but the ISO %s carries schematic %s: its extensions are gone after the install and the VMs get agent: 0; leave installImage empty to install cluster.schematic (%s)",
			im.InstallImage, im.ISOURL, factory.ShortID(isoID), im.Schematic.Summary())
	}
	if instOK && !im.InstallerDerived && instID != im.SchematicID {
		v.warnf("cluster.installImage", "%s is built from schematic %s, not from cluster.schematic (%s, %s): the VMs' agent option follows cluster.schematic; declare the installer's extensions there",
			im.InstallImage, factory.ShortID(instID), factory.ShortID(im.SchematicID), im.Schematic.Summary())
	}
}
