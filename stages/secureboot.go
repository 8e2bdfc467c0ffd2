package stages

import (
	"context"
	"fmt"
	"slices"
	"strings"

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

// refuseSecurityDrift stops the talos stage, before anything is written
// or applied, when an installed node the config asks to boot with Secure
// Boot, or to encrypt, does not: neither can change under an installed
// Talos (the Talos docs, secureboot.mdx: no move from a GRUB install to
// UKI/Secure Boot, "a fresh installation is required"; a formatted volume
// is never encrypted later, HandleEncryptionWithHandler fails "block dev
// type mismatch", internal/app/machined/pkg/controllers/block/internal/
// volumes/encrypt.go at v1.13.3), and applying the config would leave the
// node with an installer or volume config it cannot take. It reads, with
// the talosconfig kept from an earlier run (none: nothing is installed),
// only the nodes that ask and answer configured; one that turned either
// off is not caught here (the postcheck shows what each node runs).
func refuseSecurityDrift(ctx context.Context, env *Env) error {
	wants := securityWants(env.Config)
	var asked []config.Node
	for _, n := range env.Config.Nodes {
		if w := wants[n.Name]; w.SecureBoot || w.Encrypted {
			asked = append(asked, n)
		}
	}
	if len(asked) == 0 {
		return nil
	}
	ops, err := savedTalosOps(env)
	if err != nil {
		return nil // no cluster yet, or its talosconfig unreadable: the converge says so
	}
	var bad, names []string
	for _, n := range asked {
		if p, err := ops.Probe(ctx, n.IP); err != nil || p.Mode != talos.ModeConfigured {
			continue
		}
		s, err := ops.Security(ctx, n.IP)
		if err != nil {
			return fmt.Errorf("reading %s's Secure Boot and volume encryption: %w", n.Name, err)
		}
		before := len(bad)
		w := wants[n.Name]
		if w.SecureBoot && !s.SecureBoot {
			bad = append(bad, fmt.Sprintf("%s runs without Secure Boot, which the config asks for", n.Name))
		}
		if w.Encrypted {
			for _, v := range []string{"STATE", "EPHEMERAL"} {
				if s.Volumes[v] == "none" {
					bad = append(bad, fmt.Sprintf("%s's %s is not encrypted, which the config asks for", n.Name, v))
				}
			}
		}
		if len(bad) > before {
			names = append(names, n.Name)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return config.Userf("%s: neither can be switched under an installed Talos; reinstall with bootstrap node replace %s (one at a time), or set the node's vm.secureBoot and encryption back to what it runs; nothing was changed",
		strings.Join(bad, "; "), strings.Join(names, ", then "))
}
