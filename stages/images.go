package stages

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/factory"
)

// The nodes' images come from one schematic (cluster.schematic): the
// provision stage downloads its ISO, the talos stage installs and upgrades
// with its installer. Both make sure the Image Factory knows the schematic
// first, since the factory builds neither for an ID it does not hold.

// FactoryClient returns the run's Image Factory client, built on first use.
func FactoryClient(env *Env) (*factory.Client, error) {
	return client(env, "the Image Factory", func() (*factory.Client, error) {
		c := env.Config.Cluster
		return factory.NewClient(factory.ClientOptions{URL: c.Factory, CAFile: env.Config.Resolve(c.FactoryCAFile), Timeout: c.Timeouts.Call.D()})
	})
}

// usesFactory says whether any image comes from the schematic.
func usesFactory(im config.Images) bool { return im.ISODerived || im.InstallerDerived }

// describeSchematic is "ce4c980550dd (siderolabs/qemu-guest-agent)".
func describeSchematic(im config.Images) string {
	return factory.ShortID(im.SchematicID) + " (" + im.Schematic.Summary() + ")"
}

// sameImageAs returns a test of whether a schematic a node runs carries
// what cluster.schematic declares under another ID (factory.SameImage:
// the factory hashes extensions in the order written, so one created in
// its UI or by hand can differ only in order). It asks the factory once
// per ID; a schematic the factory does not hold is not the same.
func sameImageAs(env *Env) func(ctx context.Context, id string) (bool, error) {
	want := env.Config.Images()
	seen := map[string]bool{}
	return func(ctx context.Context, id string) (bool, error) {
		if id == want.SchematicID {
			return true, nil
		}
		if id == "" {
			return false, nil
		}
		if same, ok := seen[id]; ok {
			return same, nil
		}
		c, err := FactoryClient(env)
		if err != nil {
			return false, err
		}
		got, err := c.Get(ctx, id)
		var se *factory.StatusError
		switch {
		case errors.As(err, &se) && se.Code == http.StatusNotFound:
			seen[id] = false
			return false, nil
		case err != nil:
			return false, fmt.Errorf("asking %s what schematic %s carries: %w", c.URL(), factory.ShortID(id), err)
		}
		seen[id] = got.SameImage(want.Schematic)
		return seen[id], nil
	}
}

// ensureSchematic registers the schematic with the factory unless it
// knows it already (one GET when it does). Called where the factory must
// build something: before a derived ISO is downloaded, before a derived
// installer is pulled (install, upgrade). Callers of a run go one at a
// time: the provision stage downloads to every member at once, and the
// first to register the schematic answers the others.
func ensureSchematic(ctx context.Context, env *Env) error {
	r := env.shared()
	r.schematicMu.Lock()
	defer r.schematicMu.Unlock()
	im := env.Config.Images()
	c, err := FactoryClient(env)
	if err != nil {
		return err
	}
	if k, ok, err := takePrepared[knownSchematic](ctx, env, prepSchematic, time.Minute); err != nil {
		return err
	} else if ok && k.id == im.SchematicID && k.known {
		env.Log.Debug().Str("schematic", im.SchematicID).Msg("the image factory knows the schematic (asked in the background or earlier in the run)")
		rememberSchematic(ctx, env, im.SchematicID)
		return nil
	}
	known, err := c.Known(ctx, im.SchematicID)
	if err != nil {
		return fmt.Errorf("asking %s for schematic %s: %w", c.URL(), factory.ShortID(im.SchematicID), err)
	}
	if known {
		env.Log.Debug().Str("schematic", im.SchematicID).Msg("the image factory knows the schematic")
		rememberSchematic(ctx, env, im.SchematicID)
		return nil
	}
	err = env.Wet(fmt.Sprintf("register schematic %s with %s", describeSchematic(im), c.URL()), func() error {
		_, err := c.Register(ctx, im.Schematic)
		return err
	})
	if err == nil && !env.DryRun {
		rememberSchematic(ctx, env, im.SchematicID)
	}
	return err
}

// rememberSchematic keeps, for the next ensureSchematic of the run (the
// talos stage's, after provision's), that the factory knows id: a
// factory does not forget a schematic (its ID is the hash of its
// content), so the run does not ask again.
func rememberSchematic(ctx context.Context, env *Env, id string) {
	env.prepare(ctx, prepSchematic, "the image factory's answer for schematic "+factory.ShortID(id), func(context.Context) (any, error) {
		return knownSchematic{id: id, known: true}, nil
	})
}

// prepSchematic keys the background question whether the factory knows
// the schematic.
const prepSchematic = "talos-schematic"

// knownSchematic is the factory's answer for a schematic ID.
type knownSchematic struct {
	id    string
	known bool
}

// prepareSchematic asks the factory in the background whether it knows
// the config's schematic, so a converged run does not wait for the round
// trip; an unknown schematic is asked again and registered in line.
func prepareSchematic(ctx context.Context, env *Env) {
	im := env.Config.Images()
	if !im.InstallerDerived {
		return
	}
	env.prepare(ctx, prepSchematic, "the Image Factory's answer for schematic "+factory.ShortID(im.SchematicID), func(ctx context.Context) (any, error) {
		c, err := FactoryClient(env)
		if err != nil {
			return nil, err
		}
		known, err := c.Known(ctx, im.SchematicID)
		return knownSchematic{id: im.SchematicID, known: known}, err
	})
}

// factoryBuilds refuses, before anything changes, a Talos version the
// factory does not build: every node would fail to pull its installer.
func factoryBuilds(ctx context.Context, env *Env, version string) error {
	c, err := FactoryClient(env)
	if err != nil {
		return err
	}
	versions, err := c.Versions(ctx)
	if err != nil {
		return fmt.Errorf("asking %s which Talos versions it builds: %w", c.URL(), err)
	}
	if !slices.Contains(versions, version) {
		return config.Userf("the Image Factory %s does not build Talos %s: check cluster.talosVersion (the installer %s would not pull)", c.URL(), version, env.Config.InstallImageFor(version))
	}
	return nil
}

// factoryCheck is the precheck row of the Image Factory: it builds the
// Talos version, every extension of the schematic is one it offers for
// that version, and whether the schematic is registered yet. The extension
// list is cached in the state directory (the one write a precheck makes:
// a local cache) so that `config validate` can check names offline. A
// factory that cannot be reached is a warning: the cached list, if any,
// still vouches for the names.
func factoryCheck(env *Env) check.Check {
	return check.Check{Name: "image factory", Run: func(ctx context.Context) (check.Status, string) {
		cfg := env.Config
		im := cfg.Images()
		if !usesFactory(im) {
			return check.Passf("not used: proxmox.iso.url and cluster.installImage are explicit")
		}
		c, err := FactoryClient(env)
		if err != nil {
			return check.Failf("%v", err)
		}
		version := cfg.Cluster.TalosVersion
		versions, err := c.Versions(ctx)
		if factory.Unreachable(err) {
			cached := "no cached extension list, names unchecked"
			if cat, ok, _ := factory.LoadCatalog(env.Paths.StateDir, c.URL(), version); ok {
				cached = "extension names checked against the list cached " + cat.Fetched.UTC().Format(time.DateTime) + " UTC"
				if bad := unknownExtensions(cat, im); bad != "" {
					return check.Failf("%s unreachable; by the cached list: %s", c.URL(), bad)
				}
			}
			return check.Warnf("%s unreachable (%v): %s; provisioning and upgrades need it", c.URL(), err, cached)
		}
		if err != nil {
			return check.Failf("%v", err)
		}
		if !slices.Contains(versions, version) {
			newest := "none listed"
			if len(versions) > 0 {
				newest = "newest " + versions[len(versions)-1]
			}
			return check.Failf("%s does not build Talos %s (%s): check cluster.talosVersion", c.URL(), version, newest)
		}
		list, err := c.Extensions(ctx, version)
		if err != nil {
			return check.Failf("listing the extensions of %s: %v", version, err)
		}
		cat := factory.Catalog{Factory: c.URL(), Version: version, Fetched: env.now(), Extensions: list}
		if err := cat.Save(env.Paths.StateDir); err != nil {
			env.Log.Warn().Err(err).Msg("caching the extension list")
		}
		if bad := unknownExtensions(cat, im); bad != "" {
			return check.Failf("%s", bad)
		}
		known, err := c.Known(ctx, im.SchematicID)
		if err != nil {
			return check.Failf("%v", err)
		}
		reg := "registered"
		if !known {
			reg = "not registered yet (the provision stage registers it)"
		}
		return check.Passf("%s builds %s; schematic %s %s; %d extensions listed", c.URL(), version, describeSchematic(im), reg, len(list))
	}}
}

// unknownExtensions names the schematic's extensions the catalog lacks.
func unknownExtensions(cat factory.Catalog, im config.Images) string {
	var bad []string
	for _, e := range im.Schematic.Extensions() {
		if _, _, ok := cat.Lookup(e); !ok {
			hint := ""
			if sim := cat.Similar(e); len(sim) > 0 {
				hint = " (similar: " + strings.Join(sim, ", ") + ")"
			}
			bad = append(bad, e+hint)
		}
	}
	if len(bad) == 0 {
		return ""
	}
	return fmt.Sprintf("not official extensions of Talos %s at %s: %s (cluster.schematic.extensions)", cat.Version, cat.Factory, strings.Join(bad, ", "))
}
