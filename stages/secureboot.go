package stages

import (
	"context"
	"slices"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/postcheck"
	"github.com/homelab/bootstrap/proxmox"
	"github.com/homelab/bootstrap/talos"
)

// secureBootInstaller is node n's own installer when it differs from the
// cluster's: the Secure Boot installer of a Secure Boot node, "" else.
func secureBootInstaller(cfg *config.Config, n config.Node) string {
	if !cfg.VMShapeOf(n).SecureBootOn() {
		return ""
	}
	return cfg.InstallImageOf(n)
}

// secureBootInstallersFor are the Secure Boot nodes' installers of Talos
// version (an upgrade), by node name: the upgrade of a Secure Boot node
// must keep the signed UKI its firmware's keys accept.
func secureBootInstallersFor(cfg *config.Config, version string) map[string]string {
	out := map[string]string{}
	for _, n := range cfg.SecureBootNodes() {
		out[n.Name] = cfg.InstallImageOfFor(n, version)
	}
	return out
}

// SecureBootISOSource is the schematic's Secure Boot ISO on the ISO
// storage, which Secure Boot nodes boot.
func SecureBootISOSource(cfg *config.Config) proxmox.ISOSource {
	im := cfg.Images()
	return proxmox.ISOSource{Storage: cfg.Proxmox.ISOStorage, Filename: im.SecureBootISOFile, URL: im.SecureBootISOURL}
}

// ensureSecureBootISO makes the Secure Boot ISO present on every member
// that runs a Secure Boot node, whatever proxmox.boot chose for the
// others: only the ISO enrolls the keys (config/secureboot.go).
func ensureSecureBootISO(ctx context.Context, env *Env, c *proxmox.Client, specs []proxmox.VMSpec) error {
	var hosts []string
	for _, s := range specs {
		if s.Hardware.SecureBoot && !slices.Contains(hosts, s.Node) {
			hosts = append(hosts, s.Node)
		}
	}
	if len(hosts) == 0 {
		return nil
	}
	src := SecureBootISOSource(env.Config)
	return ensureFiles(ctx, env, c, hosts, bootFile{what: "Secure Boot ISO", src: src, derived: true,
		find: func(ctx context.Context, c *proxmox.Client) (bool, error) {
			_, ok, err := c.FindISO(ctx, src.Storage, src.Filename)
			return ok, err
		},
		fetch: (*proxmox.Client).FetchISO,
	})
}

// securityWants is what the config asks of each node's boot and volumes,
// for the postcheck's talos-security row.
func securityWants(cfg *config.Config) map[string]postcheck.SecurityWant {
	out := map[string]postcheck.SecurityWant{}
	for _, n := range cfg.Nodes {
		out[n.Name] = postcheck.SecurityWant{SecureBoot: cfg.VMShapeOf(n).SecureBootOn(), Encrypted: cfg.EncryptionOf(n) == config.EncryptionTPM}
	}
	return out
}

// Security asks every node for its Secure Boot state and the encryption
// of its STATE and EPHEMERAL (postcheck.SecurityProbe).
func (p talosProbe) Security(ctx context.Context) (map[string]talos.Security, error) {
	return eachNode(p.env, func(ip string) (talos.Security, error) { return p.ops.Security(ctx, ip) })
}
