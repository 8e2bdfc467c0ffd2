package stages

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"filippo.io/age"
	"github.com/Masterminds/semver/v3"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/factory"
	"github.com/homelab/bootstrap/internal/sealed"
	"github.com/homelab/bootstrap/proxmox"
	"github.com/homelab/bootstrap/sops"
	"github.com/homelab/bootstrap/talos"
)

// TalosStage renders the cluster's Talos configs from its one secrets
// bundle, takes every node to its config (maintenance install or drift
// apply), bootstraps etcd once on the first control plane, waits for etcd
// membership and etcd/kubelet health, and keeps a kubeconfig that reaches
// the API server. With --merge-configs it merges the talosconfig and
// kubeconfig into the user's ~/.talos/config and ~/.kube/config.
type TalosStage struct{}

// Name implements Stage.
func (TalosStage) Name() string { return Talos }

// Run implements Stage. A cluster that crosses into Talos v1.14 is run
// twice: the first pass keeps the v1alpha1 form its older nodes take and
// upgrades them, the second applies v1.14's typed documents to nodes that
// all run v1.14 by then (talos.ConfigVersionFor).
func (TalosStage) Run(ctx context.Context, env *Env) error {
	crossed, err := runTalos(ctx, env)
	if err != nil || !crossed || env.DryRun {
		return err
	}
	env.UI.OK("talos: every node runs Talos %s: its configs move to that version's form (typed documents), applied without a reboot", env.Config.Cluster.TalosVersion)
	if crossed, err = runTalos(ctx, env); err == nil && crossed {
		err = fmt.Errorf("talos: after the upgrade a node still runs a Talos older than v1.14, which cannot take %s's configs; run the stage again once it runs %s",
			env.Config.Cluster.TalosVersion, env.Config.Cluster.TalosVersion)
	}
	return err
}

// runTalos is one pass of the stage; crossed reports that it rendered an
// older form than cluster.talosVersion's for nodes that ran an older Talos.
func runTalos(ctx context.Context, env *Env) (crossed bool, err error) {
	// A downgrade the state already shows is refused before anything is
	// written or called.
	if err := refuseDowngrade(ctx, env, nil, nil); err != nil {
		return false, err
	}
	if _, err := pinKubernetes(ctx, env, nil, nil, configTargets(env)); err != nil {
		return false, err
	}
	// A control plane etcd cannot add now (one of three members down) is
	// refused before anything too: it would wait 30 minutes to join, then
	// fail. This asks the cluster, so it comes after the checks above,
	// which refuse from the state alone.
	if err := refuseEtcdJoin(ctx, env, booting); err != nil {
		return false, err
	}
	// Secure Boot or encryption asked of an installed node that has
	// neither: refused before its config is written (secureboot.go).
	if err := refuseSecurityDrift(ctx, env); err != nil {
		return false, err
	}
	gen, err := talosGenerateOptions(env)
	if err != nil {
		return false, err
	}
	minted, ok, err := takePrepared[mintedBundle](ctx, env, prepBundle, time.Minute)
	if err != nil {
		return false, err
	}
	if ok && minted.talosVersion == gen.TalosVersion {
		gen.NewBundle = minted.bundle
	}
	res, err := renderTalos(env, gen)
	if err != nil {
		if gen.ConfigVersion != "" {
			err = crossingError(gen, err)
		}
		return false, err
	}
	if out := &env.State.Outputs.Talos; out.FirstTalosVersion == "" && !env.DryRun {
		out.FirstTalosVersion = firstTalosVersion(env)
	}
	if env.Secrets != nil {
		for _, v := range talos.SecretValues(res.Bundle) {
			env.Secrets.Add(v)
		}
	}
	out := &env.State.Outputs.Talos
	out.SecretsPath, out.TalosconfigPath, out.KubeconfigPath = res.SecretsPath, res.TalosconfigPath, keptFiles(env).Path(env.Paths.Kubeconfig)

	ops, err := talosOps(env, res.Talosconfig)
	if err != nil {
		return false, err
	}
	targets := talosTargets(res)
	// And one only the nodes show (the state is older than the cluster)
	// before anything is applied to them.
	// One probe of every node, at once, serves the checks before the
	// converge (which probes again as it goes).
	probes, _ := ops.ProbeAll(ctx, targets)
	if err := refuseDowngrade(ctx, env, probes, targets); err != nil {
		return false, err
	}
	if wiped, err := wipeReplacedEtcd(ctx, env, ops, probes, targets); err != nil {
		return false, err
	} else if wiped {
		probes, _ = ops.ProbeAll(ctx, targets) // they reboot
	}
	// The form the state foresaw is checked against what the nodes run.
	if form, err := talos.ConfigVersionFor(gen.TalosVersion, probedVersions(probes)); err != nil {
		return false, err
	} else if form != gen.ConfigVersion {
		gen.ConfigVersion = form
		if res, err = renderTalos(env, gen); err != nil {
			return false, crossingError(gen, err)
		}
		targets = talosTargets(res)
	}
	if gen.ConfigVersion != "" {
		env.UI.OK("talos: a node still runs Talos %s, which does not know %s's typed documents: the configs keep the %s form until every node runs %s, then move to it",
			gen.ConfigVersion, gen.TalosVersion, gen.ConfigVersion, gen.TalosVersion)
	}
	ku, err := pinKubernetes(ctx, env, ops, probes, targets)
	if err != nil {
		return false, err
	}
	// A node in maintenance mode pulls the installer from the factory,
	// which builds it only for a schematic it holds. A factory that cannot
	// be reached only warns here: installed nodes need nothing from it.
	if env.Config.Images().InstallerDerived {
		if err := ensureSchematic(ctx, env); err != nil {
			if !factory.Unreachable(err) {
				return false, err
			}
			env.UI.Warn("%v: a node that still has to install Talos cannot pull its installer", err)
		}
	}
	bootNode := out.BootstrapNode
	if env.Options.Recover != nil && env.Options.RecoverNode != "" {
		bootNode = env.Options.RecoverNode
	}
	conv, err := ops.Converge(ctx, talos.ConvergeOptions{
		Nodes:          targets,
		BootstrapNode:  bootNode,
		KubeconfigPath: env.Paths.Kubeconfig,
		Files:          keptFiles(env),
		Mutate:         env.Wet,
		DryRun:         env.DryRun,
		Parallelism:    env.Config.Cluster.Parallelism,
		CNIDisabled:    !env.Config.CNI.TalosDeploysCNI(),
		Recover:        env.Options.Recover,
		Now:            env.now,
		BootstrappedAt: out.BootstrappedAt,
		NewEtcd:        env.Options.NewEtcd,
		OnNodeConverged: func(t talos.Target, r talos.EnsureResult) {
			recordTalosNode(env, res, t, r)
		},
		OnBootstrapped: func(node string, thisRun bool) {
			if env.DryRun {
				return
			}
			if out.BootstrapNode == "" || thisRun {
				out.BootstrapNode, out.BootstrappedAt = node, env.now().UTC()
			}
			if r := out.Restore; r != nil && thisRun && env.Options.Recover != nil {
				r.Bootstrapped = true
			}
			if err := env.SaveState(); err != nil {
				env.Log.Warn().Err(err).Msg("saving state after bootstrap")
			}
		},
	})
	if env.DryRun {
		if conv != nil {
			printTalosPlan(env, res, conv)
		}
		if err != nil {
			return false, err
		}
		if err := upgradeInOrder(ctx, env, ops, ku, targets, conv); err != nil {
			return false, err
		}
		ejectISOs(ctx, env, targets)
		if gen.ConfigVersion != "" {
			env.UI.Would(fmt.Sprintf("then apply the %s form (typed documents) to every node, without a reboot", gen.TalosVersion))
		}
		return gen.ConfigVersion != "", mergeUserConfigs(env, res.Talosconfig)
	}
	if err != nil {
		return false, err
	}
	if err := upgradeInOrder(ctx, env, ops, ku, targets, conv); err != nil {
		return false, err
	}
	ejectISOs(ctx, env, targets)
	api := conv.APIServerVersion
	if ku.apiServerVersion != "" {
		api = ku.apiServerVersion
	}
	env.UI.OK("talos: %d node(s) run their config; etcd on %s has %d member(s); Kubernetes API %s answers with %s",
		len(targets), conv.BootstrapNode, len(gen.ControlPlanes()), api, keptFiles(env).Path(env.Paths.Kubeconfig))
	return gen.ConfigVersion != "", mergeUserConfigs(env, res.Talosconfig)
}

// ejectISOs empties the cdrom drive of every VM whose node now runs an
// installed Talos: the ISO served only the install, and a VM whose cdrom
// holds one on local storage cannot be migrated, by the user or by HA
// (proxmox.Client.EjectISO). Only VMs whose drive still holds an ISO are
// asked about: the eject needs VM.Config.CDROM, which runner roles made
// before it lack, so such a VM is named in one warning and nothing is
// tried (a converged run stays without a mutating call). A failure only
// warns: the cluster runs either way.
func ejectISOs(ctx context.Context, env *Env, targets []talos.Target) {
	type vm struct {
		id         int
		name, host string
	}
	var c *proxmox.Client
	var withISO []vm
	var paths []string
	for _, t := range targets {
		n := env.Node(t.Name)
		if n.VMID == 0 || n.Host == "" {
			continue
		}
		if c == nil {
			var err error
			if c, err = ProxmoxClient(ctx, env); err != nil {
				env.UI.Warn("the Talos ISO stays in the VMs' cdrom drives: %v", err)
				return
			}
		}
		cfg, err := c.On(n.Host).VMConfig(ctx, n.VMID)
		switch {
		case err != nil && env.DryRun:
			// No VM yet to eject from.
		case err != nil:
			env.UI.Warn("VM %d %s may keep the Talos ISO in its cdrom drive: %v", n.VMID, t.Name, err)
		case cfg.CDROM != "" && cfg.CDROM != "none":
			withISO = append(withISO, vm{n.VMID, t.Name, n.Host})
			paths = append(paths, "/vms/"+strconv.Itoa(n.VMID))
		}
	}
	if len(withISO) == 0 {
		return
	}
	held, err := c.Permissions(ctx, paths)
	if err != nil {
		env.UI.Warn("the Talos ISO stays in the VMs' cdrom drives: %v", err)
		return
	}
	var lacking []string
	for _, v := range withISO {
		if !held["/vms/"+strconv.Itoa(v.id)]["VM.Config.CDROM"] {
			lacking = append(lacking, fmt.Sprintf("%d %s", v.id, v.name))
			continue
		}
		err := env.Wet(fmt.Sprintf("eject the Talos ISO from VM %d %s (Talos runs from its disk)", v.id, v.name), func() error {
			_, err := c.On(v.host).EjectISO(ctx, v.id)
			return err
		})
		if err != nil {
			env.UI.Warn("VM %d %s keeps the Talos ISO in its cdrom drive, which keeps Proxmox from migrating it off local storage: %v", v.id, v.name, err)
		}
	}
	if len(lacking) > 0 {
		env.UI.Warn("VMs %s keep the Talos ISO in their cdrom drive: ejecting it needs VM.Config.CDROM, which the token lacks (README's runner role has it); a VM holding an ISO on local storage cannot be migrated", strings.Join(lacking, ", "))
	}
}

// talosTargets are the rendered nodes the stage takes to their configs.
func talosTargets(res *talos.Result) []talos.Target {
	targets := make([]talos.Target, 0, len(res.Nodes))
	for _, n := range res.Nodes {
		targets = append(targets, talos.Target{Name: n.Name, IP: n.IP, Role: n.Role, Config: n.Config, InstallDisk: n.InstallDisk})
	}
	return targets
}

// probedVersions are the Talos versions configured nodes report; a node in
// maintenance runs its ISO, not a config of the cluster.
func probedVersions(probes map[string]talos.Probe) []string {
	var out []string
	for _, p := range probes {
		if p.Mode == talos.ModeConfigured {
			out = append(out, p.Version)
		}
	}
	return out
}

// crossingError says why the older form could not be rendered: the
// patches are written for the new one only.
func crossingError(gen talos.GenerateOptions, err error) error {
	return fmt.Errorf("a node still runs Talos %s, which takes only the v1alpha1 form, so the configs are rendered in that form until every node runs %s: %w\n"+
		"make the patches valid for both forms, or upgrade Talos with patches for %s first and move them to the typed documents after",
		gen.ConfigVersion, gen.TalosVersion, err, gen.ConfigVersion)
}

// prepBundle keys the secrets bundle minted in the background.
const prepBundle = "talos-bundle"

// mintedBundle is a secrets bundle minted for a Talos version.
type mintedBundle struct {
	talosVersion string
	bundle       *secrets.Bundle
}

// Prepare implements Preparer: the Image Factory is asked whether it knows
// the schematic (a read, one round trip to the factory), and a cluster
// without a secrets bundle gets one
// minted while the VMs are created and boot. Minting costs an RSA-4096 key
// (0.5–2 s on the reference box), and nothing in it depends on the VMs.
// Nothing is written here: the bundle is stored by the stage, once, as
// before (a bundle that appeared meanwhile wins).
func (TalosStage) Prepare(ctx context.Context, env *Env) {
	prepareSchematic(ctx, env)
	if _, err := os.Stat(env.Paths.Secrets); !errors.Is(err, fs.ErrNotExist) {
		return
	}
	version, now, ecdsa := env.Config.Cluster.TalosVersion, env.now(), env.Config.Cluster.ECDSAServiceAccountKey()
	env.prepareCPU(ctx, prepBundle, "the cluster's new secrets bundle", func(context.Context) (any, error) {
		b, err := talos.NewSecrets(version, now, ecdsa)
		return mintedBundle{talosVersion: version, bundle: b}, err
	})
}

// bundleSealer keeps the secrets bundle SOPS-encrypted to
// secrets.age.recipients, or as a .sops.yaml creation rule for its path
// says (plaintext, 0600, without recipients), and opens an encrypted
// bundle with secrets.age.keyFile's identity.
func bundleSealer(env *Env) *sops.FileSealer {
	a := env.Config.Secrets.Age
	return &sops.FileSealer{Recipients: a.Recipients, KeyFile: env.Config.Resolve(a.KeyFile), Path: env.Paths.Secrets, Now: env.now}
}

// KeptFiles keeps the files derived from the secrets bundle that hold its
// keys or credentials signed by them (rendered configs, talosconfig,
// kubeconfig): age-encrypted to secrets.age.recipients when set, so
// nothing beside an encrypted bundle gives its keys away, and opened with
// the bundle's identity (secrets.age.keyFile, $SOPS_AGE_KEY_FILE, …).
func KeptFiles(cfg *config.Config) *sealed.Files {
	a := cfg.Secrets.Age
	sealer := &sops.FileSealer{KeyFile: cfg.Resolve(a.KeyFile)}
	f := &sealed.Files{Source: "the secrets.age identity", Identities: func() ([]age.Identity, error) {
		ids, err := sealer.Identities()
		return ids.Age(), err
	}}
	// config validate refuses what does not parse, and a mix of
	// post-quantum and classic recipients.
	if recs, err := sealed.ParseRecipients(a.Recipients); err == nil {
		f.Recipients = recs
	}
	return f
}

// SealKeptFiles keeps every file KeptFiles covers that exists (rendered
// configs, talosconfig, kubeconfig) in the form the config asks for now:
// age-encrypted with secrets.age.recipients, replacing the plaintext. It
// returns the files it wrote. `bootstrap secrets encrypt` runs it; a talos
// stage run does the same for what it renders.
func SealKeptFiles(cfg *config.Config) ([]string, error) {
	files := KeptFiles(cfg)
	paths := cfg.Paths()
	all, err := talos.RenderedFiles(paths.TalosDir)
	if err != nil {
		return nil, err
	}
	var wrote []string
	for _, p := range append(all, paths.Kubeconfig) {
		data, err := files.Read(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return wrote, err
		}
		changed, err := files.WriteIfChanged(p, data)
		if err != nil {
			return wrote, err
		}
		if changed {
			wrote = append(wrote, files.Path(p))
		}
	}
	return wrote, nil
}

// keptFiles is KeptFiles for the run's config, made once per config so
// that the identity file is read once a run, not at every read.
func keptFiles(env *Env) *sealed.Files {
	f, _ := client(env, fmt.Sprintf("kept files of config %p", env.Config), func() (*sealed.Files, error) { return KeptFiles(env.Config), nil })
	return f
}

// talosGenerateOptions maps the config onto the talos package's options.
// Addresses, MACs and disk buses come from what provision recorded for
// each VM, with the config as fallback.
func talosGenerateOptions(env *Env) (talos.GenerateOptions, error) {
	cfg := env.Config
	c := cfg.Cluster
	opts := talos.GenerateOptions{
		Dir:                    env.Paths.TalosDir,
		ClusterName:            c.Name,
		Endpoint:               c.Endpoint,
		TalosVersion:           c.TalosVersion,
		KubernetesVersion:      c.KubernetesVersion,
		InstallImage:           cfg.Images().InstallImage,
		ECDSAServiceAccountKey: c.ECDSAServiceAccountKey(),
		VIP:                    c.VIP,
		CertSANs:               c.SANs,
		CNI:                    cfg.CNI.Name,
		Network:                talos.Network{Gateway: c.Network.Gateway, Nameservers: c.Network.Nameservers},
		Patches: talos.Patches{
			Global:       resolveAll(cfg, c.Patches.All),
			ControlPlane: resolveAll(cfg, c.Patches.ControlPlane),
			Worker:       resolveAll(cfg, c.Patches.Worker),
		},
		Now:    env.now,
		Sealer: bundleSealer(env),
		Files:  keptFiles(env),
		Log:    env.Log,
	}
	if c.AllowSchedulingOnControlPlanes {
		opts.AllowSchedulingOnControlPlanes = new(true)
	}
	if c.Network.CIDR != "" {
		p, err := netip.ParsePrefix(c.Network.CIDR)
		if err != nil {
			return opts, config.Userf("cluster.network.cidr %q: %v", c.Network.CIDR, err)
		}
		opts.Network.PrefixLen = p.Bits()
	}
	// The form the nodes take, as far as the state knows what they run
	// (the stage checks it against what they report).
	var running []string
	for _, n := range cfg.Nodes {
		running = append(running, env.State.Outputs.Nodes[n.Name].TalosVersion)
	}
	form, err := talos.ConfigVersionFor(opts.TalosVersion, running)
	if err != nil {
		return opts, config.Userf("cluster.talosVersion %q: %v", c.TalosVersion, err)
	}
	opts.ConfigVersion = form
	opts.WorkloadIsolationOff = olderThan114(firstTalosVersion(env)) && !olderThan114(c.TalosVersion)
	for _, n := range cfg.Nodes {
		rec := env.State.Outputs.Nodes[n.Name]
		node := talos.Node{
			Name:        n.Name,
			Role:        talos.Role(n.Role),
			IP:          firstNonEmpty(rec.IP, n.IP),
			MAC:         firstNonEmpty(rec.MAC, n.MAC),
			DiskBus:     rec.DiskBus,
			Patches:     resolveAll(cfg, c.Patches.Nodes[n.Name]),
			UserVolumes: userVolumes(cfg, n),
			// A Secure Boot node installs the Secure Boot installer, and
			// encrypts its volumes where the config asks (secureboot.go).
			InstallImage: secureBootInstaller(cfg, n),
			EncryptTPM:   cfg.EncryptionOf(n) == config.EncryptionTPM,
		}
		opts.Nodes = append(opts.Nodes, node)
	}
	return opts, nil
}

// firstTalosVersion is the Talos version the cluster's configs were first
// rendered for: recorded in the state, or for a state older than that
// record, the oldest a node ran when the stage last saw it; a cluster with
// neither is new and gets cluster.talosVersion.
func firstTalosVersion(env *Env) string {
	if v := env.State.Outputs.Talos.FirstTalosVersion; v != "" {
		return v
	}
	var oldest *semver.Version
	oldestTag := ""
	for _, n := range env.State.Outputs.Nodes {
		v, err := semver.NewVersion(n.TalosVersion)
		if err == nil && (oldest == nil || v.LessThan(oldest)) {
			oldest, oldestTag = v, n.TalosVersion
		}
	}
	if oldestTag != "" {
		return oldestTag
	}
	return env.Config.Cluster.TalosVersion
}

// olderThan114 reports whether a Talos version predates v1.14's typed
// documents and workload isolation.
func olderThan114(version string) bool {
	from, ok := talos.From114(version)
	return ok && !from
}

func resolveAll(cfg *config.Config, paths []string) []string {
	out := make([]string, 0, len(paths))
	for _, p := range paths {
		out = append(out, cfg.Resolve(p))
	}
	return out
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// renderTalos plans the generation and, in a real run, writes what changed
// through Wet. Unchanged inputs write nothing and record no change.
func renderTalos(env *Env, opts talos.GenerateOptions) (*talos.Result, error) {
	plan, err := talos.Plan(opts)
	if err != nil {
		return nil, err
	}
	if len(plan.Changes) == 0 {
		env.UI.OK("talos: configs in %s are up to date", opts.Dir)
		warnPlaintextBundle(env)
		return plan, nil
	}
	var files []string
	for _, c := range plan.Changes {
		rel, err := filepath.Rel(opts.Dir, c.Path)
		if err != nil {
			rel = c.Path
		}
		files = append(files, rel)
	}
	what := fmt.Sprintf("write Talos configs in %s: %s", opts.Dir, strings.Join(files, ", "))
	if plan.SecretsCreated {
		what = fmt.Sprintf("create the secrets bundle %s (kept forever) and %s", plan.SecretsPath, what)
	}
	res := plan
	if plan.SecretsCreated {
		// The bundle the plan rendered with becomes the cluster's: minting
		// another costs a second RSA-4096 key.
		opts.NewBundle = plan.Bundle
	}
	err = env.Wet(what, func() error {
		var err error
		res, err = talos.Generate(opts)
		return err
	})
	if err == nil {
		warnPlaintextBundle(env)
	}
	return res, err
}

// warnPlaintextBundle says when secrets.age.recipients is set but the
// bundle on disk is still plaintext: the talos stage never rewrites an
// existing bundle on its own (a migration is one explicit command, with a
// backup).
func warnPlaintextBundle(env *Env) {
	if len(env.Config.Secrets.Age.Recipients) == 0 {
		return
	}
	if b, err := os.ReadFile(env.Paths.Secrets); err == nil && !sops.IsEncrypted(b) {
		env.UI.Warn("the secrets bundle %s is plaintext although secrets.age.recipients is set: run `bootstrap secrets encrypt` to encrypt it (it keeps a backup)", env.Paths.Secrets)
	}
}

// refuseDowngrade plans the rollout from the versions the state recorded
// (ops nil: no call at all), or from the versions the configured nodes
// report (read-only Version calls), and returns the plan's refusal of a
// downgrade, if any, before the converge applies the older install image
// anywhere.
func refuseDowngrade(ctx context.Context, env *Env, probes map[string]talos.Probe, targets []talos.Target) error {
	if env.Options.AllowDowngrade {
		return nil
	}
	want := env.Config.Cluster.TalosVersion
	if probes == nil {
		targets = configTargets(env)
	}
	var known []talos.Target
	live := map[string]string{}
	for _, t := range targets {
		v := env.State.Outputs.Nodes[t.Name].TalosVersion
		if probes != nil {
			p, ok := probes[t.Name]
			if !ok || p.Mode != talos.ModeConfigured {
				continue
			}
			v = p.Version
		}
		if v != "" {
			known = append(known, t)
			live[t.Name] = v
		}
	}
	_, err := talos.PlanUpgrades(known, live, want, false)
	var planErr *talos.PlanError
	if errors.As(err, &planErr) && planErr.Downgrade {
		return config.Userf("%s", planErr.Reason)
	}
	return nil
}

// configTargets are the config's nodes, without configs: what a check
// that makes no call plans over.
func configTargets(env *Env) []talos.Target {
	var targets []talos.Target
	for _, n := range env.Config.Nodes {
		role := talos.RoleWorker
		if n.Role == config.RoleControlPlane {
			role = talos.RoleControlPlane
		}
		targets = append(targets, talos.Target{Name: n.Name, IP: n.IP, Role: role})
	}
	return targets
}

// upgradeTalos moves every node to cluster.talosVersion: the plan comes
// from the versions the nodes report, control planes first, one node at a
// time (talos.RollOut). A downgrade is refused unless --allow-downgrade.
// An apply never changes the running Talos: the install image is applied
// at once without reinstalling (CanApplyImmediate), so a bumped
// cluster.talosVersion only takes effect through the Upgrade RPC.
func upgradeTalos(ctx context.Context, env *Env, ops *talos.Ops, targets []talos.Target, conv *talos.ConvergeResult) error {
	want := env.Config.Cluster.TalosVersion
	// Only nodes that run an installed system are upgraded; one still in
	// maintenance (or, in a dry run, about to install) gets the configured
	// installer's version when it installs.
	// With a derived installer the schematic counts too: a node that runs
	// another one (its extensions changed) is upgraded in place.
	im := env.Config.Images()
	wantSchematic := ""
	if im.InstallerDerived {
		wantSchematic = im.SchematicID
	}
	live := map[string]talos.Running{}
	var installed []talos.Target
	sameImage := sameImageAs(env)
	for _, t := range targets {
		// Version is set once the node answered configured during the
		// converge: found so, installed now, or found down (rebooting)
		// and back.
		r, ok := conv.Nodes[t.Name]
		if ok && r.Version != "" {
			run := talos.Running{Version: r.Version, Schematic: wantSchematic}
			if wantSchematic != "" && (!env.DryRun || r.Found == talos.ModeConfigured) {
				sch, err := ops.Schematic(ctx, t.IP)
				if err != nil {
					return err
				}
				run.Schematic = sch
				// Another ID with the same extensions (another order) is
				// kept: the node runs what is declared.
				if sch != wantSchematic {
					same, err := sameImage(ctx, sch)
					if err != nil {
						return err
					}
					if same {
						env.Log.Info().Str("node", t.Name).Str("schematic", sch).Msgf("%s runs schematic %s, which carries what cluster.schematic declares (%s) under another ID: kept, not rolled", t.Name, factory.ShortID(sch), im.Schematic.Summary())
						run.Schematic = wantSchematic
					}
				}
			}
			live[t.Name] = run
			installed = append(installed, t)
		}
	}
	steps, err := talos.PlanUpgradesTo(installed, live, talos.Running{Version: want, Schematic: wantSchematic}, env.Options.AllowDowngrade)
	var planErr *talos.PlanError
	if errors.As(err, &planErr) {
		return config.Userf("%s", planErr.Reason)
	}
	if err != nil || len(steps) == 0 {
		return err
	}
	image := env.Config.InstallImageFor(want)
	if env.DryRun {
		for _, what := range append([]string{"take an etcd snapshot before upgrading Talos"}, stepNames(steps)...) {
			if err := env.Wet(what, nil); err != nil {
				return err
			}
		}
		return nil
	}
	if im.InstallerDerived {
		if err := factoryBuilds(ctx, env, want); err != nil {
			return err
		}
		if err := ensureSchematic(ctx, env); err != nil {
			return err
		}
	}
	if err := snapshotBeforeUpgrade(ctx, env, ops, "Talos"); err != nil {
		return err
	}
	health := upgradeHealth(env, targets)
	return ops.RollOut(ctx, talos.RollOutOptions{Steps: steps, Image: image, Images: secureBootInstallersFor(env.Config, want), Health: health, Mutate: env.Wet,
		WorkerParallelism: env.Config.Cluster.UpgradeParallelism,
		OnUpgraded: func(s talos.UpgradeStep) {
			n := env.Node(s.Name)
			n.TalosVersion = s.To
			env.SetNode(n)
			if err := env.SaveState(); err != nil {
				env.Log.Warn().Err(err).Str("node", s.Name).Msg("saving state after the upgrade")
			}
		}})
}

// upgradeInOrder moves Talos and Kubernetes to the configured versions in
// the order every node can pass through (talos.PlanUpgradeOrder, from the
// Talos each node runs and the Kubernetes its config names): Talos first
// unless the target Talos cannot run the current Kubernetes. A change with
// no supported order is refused (exit 2) before either moves.
func upgradeInOrder(ctx context.Context, env *Env, ops *talos.Ops, ku *kubeUpgrade, targets []talos.Target, conv *talos.ConvergeResult) error {
	talosNow, kubeNow := map[string]string{}, map[string]string{}
	for _, t := range targets {
		// A node this run installed runs the config's Talos already; one
		// found down (rebooting) that came back configured is judged by
		// the version it answered with, as one found configured.
		r, ok := conv.Nodes[t.Name]
		if !ok || r.Version == "" || r.Action == talos.ActionInstalled {
			continue
		}
		talosNow[t.Name] = r.Version
		if k := lowestVersion(ku.configured[t.Name]); k != "" {
			kubeNow[t.Name] = k
		}
	}
	order, err := talos.PlanUpgradeOrder(talosNow, kubeNow, env.Config.Cluster.TalosVersion, env.Config.Cluster.KubernetesVersion)
	var planErr *talos.PlanError
	if errors.As(err, &planErr) {
		return config.Userf("%s", planErr.Reason)
	}
	if err != nil {
		return err
	}
	ku.order = order
	if order == talos.KubernetesFirst {
		why := fmt.Sprintf("upgrade %s: Talos %s cannot run the Kubernetes the nodes run now", order, env.Config.Cluster.TalosVersion)
		if env.DryRun {
			if err := env.Wet(why, nil); err != nil {
				return err
			}
		} else {
			env.UI.OK("%s", why)
		}
		if err := upgradeKubernetes(ctx, env, ops, ku, targets); err != nil {
			return err
		}
		return upgradeTalos(ctx, env, ops, targets, conv)
	}
	if err := upgradeTalos(ctx, env, ops, targets, conv); err != nil {
		return err
	}
	return upgradeKubernetes(ctx, env, ops, ku, targets)
}

// lowestVersion is the lowest of a node's component versions.
func lowestVersion(components map[string]string) string {
	var low *semver.Version
	out := ""
	for _, v := range components {
		sv, err := semver.NewVersion(strings.TrimPrefix(v, "v"))
		if err != nil {
			continue
		}
		if low == nil || sv.LessThan(low) {
			low, out = sv, v
		}
	}
	return out
}

// snapshotBeforeUpgrade keeps the way back should the upgrade of what
// (Talos, Kubernetes) go wrong: a verified etcd snapshot, taken before any
// node is touched. A snapshot that was taken but not copied only warns.
func snapshotBeforeUpgrade(ctx context.Context, env *Env, ops *talos.Ops, what string) error {
	return env.Wet("take an etcd snapshot before upgrading "+what, func() error {
		info, err := TakeBackup(ctx, env, ops)
		var copyErr *CopyError
		switch {
		case errors.As(err, &copyErr):
			env.UI.Warn("%v", copyErr)
		case err != nil:
			return fmt.Errorf("not upgrading %s without an etcd snapshot: %w", what, err)
		}
		env.UI.OK("etcd snapshot %s", info)
		return nil
	})
}

// upgradeHealth is the health an upgrade waits for before it starts and
// after each node: every node's services, etcd, kubelets, Nodes Ready.
func upgradeHealth(env *Env, targets []talos.Target) talos.HealthInput {
	health := talos.HealthInput{CNIDisabled: !env.Config.CNI.TalosDeploysCNI(), TolerateUnexpected: true}
	for _, t := range targets {
		health.Nodes = append(health.Nodes, talos.HealthTarget{Name: t.Name, IP: t.IP, Role: t.Role})
	}
	if cs, _, err := kubeClient(env); err == nil {
		health.Kube = cs
	}
	return health
}

func stepNames(steps []talos.UpgradeStep) []string {
	out := make([]string, len(steps))
	for i, s := range steps {
		out[i] = s.String()
	}
	return out
}

// recordTalosNode keeps what the node now runs in state, saved at once so
// a crash later in the stage keeps it.
// wipeReplacedEtcd wipes the etcd data of every control plane when a
// forced restore replaces a running etcd (bootstrap restore --force).
func wipeReplacedEtcd(ctx context.Context, env *Env, ops *talos.Ops, probes map[string]talos.Probe, targets []talos.Target) (wiped bool, err error) {
	rec := env.Options.Recover
	if rec == nil || !rec.Replaces {
		return false, nil
	}
	var cps []talos.Target
	var names []string
	for _, t := range targets {
		if t.Role != talos.RoleControlPlane {
			continue
		}
		// A control plane that runs no installed system (re-created, in
		// maintenance mode) keeps no etcd data, and its reset would be
		// refused: it installs and joins after the recovery.
		if p, ok := probes[t.Name]; ok && p.Mode == talos.ModeMaintenance {
			env.Log.Info().Str("node", t.Name).Msgf("%s runs in maintenance mode: no etcd data to wipe", t.Name)
			continue
		}
		cps, names = append(cps, t), append(names, t.Name)
	}
	if len(cps) == 0 {
		return false, nil
	}
	err = env.Wet(fmt.Sprintf("wipe etcd's data on %s (reset EPHEMERAL, and ETCD on Talos v1.14, not graceful, reboot; configs stay) before restoring %s", strings.Join(names, ", "), rec.Name), func() error {
		wiped = true
		return ops.ResetEtcdData(ctx, cps)
	})
	return wiped, err
}

func recordTalosNode(env *Env, res *talos.Result, t talos.Target, r talos.EnsureResult) {
	if env.DryRun {
		return
	}
	rn, _ := res.Node(t.Name)
	n := env.Node(t.Name)
	n.Role, n.IP, n.InstallDisk, n.ConfigSHA256 = string(t.Role), t.IP, rn.InstallDisk, rn.SHA256
	if r.Version != "" {
		n.TalosVersion = r.Version
	}
	if r.Action == talos.ActionInstalled || r.Action == talos.ActionUpdated || n.AppliedAt.IsZero() {
		n.AppliedAt = env.now().UTC()
	}
	env.SetNode(n)
	if err := env.SaveState(); err != nil {
		env.Log.Warn().Err(err).Str("node", t.Name).Msg("saving state after configuring the node")
	}
}

// printTalosPlan shows, per node, the diff a real run would apply: the
// node's own dry-run diff when it runs a config, else the rendered file's
// diff against what was rendered last.
func printTalosPlan(env *Env, res *talos.Result, conv *talos.ConvergeResult) {
	w := env.Out
	if env.Secrets != nil {
		w = env.Secrets.Writer(env.Out)
	}
	changed := false
	for _, n := range res.Nodes {
		r := conv.Nodes[n.Name]
		fc, fileChanged := res.Change(talos.NodeConfigPath(res.Dir, n.Name))
		switch {
		case r.Found == talos.ModeConfigured && r.Diff != "":
			fmt.Fprintf(w, "talos: node %s (%s) runs a config that differs (node's own diff):\n%s\n", n.Name, n.IP, indent(r.Diff))
		case r.Found == talos.ModeConfigured:
			if fileChanged {
				fmt.Fprintf(w, "talos: node %s (%s) already runs the rendered config (only the local file changes)\n", n.Name, n.IP)
			}
			continue
		case fileChanged && fc.Diff != "":
			fmt.Fprintf(w, "talos: node %s (%s) is %s; its rendered config changes:\n%s\n", n.Name, n.IP, r.Found, indent(fc.Diff))
		default:
			fmt.Fprintf(w, "talos: node %s (%s) is %s; it would get its config (install disk %s)\n", n.Name, n.IP, r.Found, n.InstallDisk)
		}
		changed = true
	}
	if !changed && !conv.Planned && len(res.Changes) == 0 {
		fmt.Fprintln(w, "talos: no changes")
	}
}

func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = "    " + l
	}
	return strings.Join(lines, "\n")
}

// mergeUserConfigs merges the cluster's talosconfig and kubeconfig into
// the user's when asked (--merge-configs or cluster.mergeConfigs): backed
// up first, same-named contexts replaced, others kept.
func mergeUserConfigs(env *Env, talosconfig []byte) error {
	if !env.Options.MergeConfigs {
		return nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return fmt.Errorf("finding the home directory for --merge-configs: %w", err)
	}
	type merge struct {
		path   string
		data   []byte
		needed func(string, []byte) (bool, error)
		do     func(string, []byte, time.Time) (talos.MergeResult, error)
	}
	merges := []merge{{filepath.Join(home, ".talos", "config"), talosconfig, talos.TalosconfigMergeNeeded, talos.MergeTalosconfig}}
	kubePath := filepath.Join(home, ".kube", "config")
	kc, err := kubeconfig(env)
	switch {
	case err == nil:
		merges = append(merges, merge{kubePath, kc, talos.KubeconfigMergeNeeded, talos.MergeKubeconfig})
	case env.DryRun:
		merges = append(merges, merge{path: kubePath})
	default:
		return fmt.Errorf("reading the kubeconfig to merge it: %w", err)
	}
	for _, m := range merges {
		if m.data == nil {
			if err := env.Wet(fmt.Sprintf("merge the kubeconfig into %s once it exists", m.path), noop); err != nil {
				return err
			}
			continue
		}
		needed, err := m.needed(m.path, m.data)
		if err != nil {
			return err
		}
		if !needed {
			env.UI.OK("%s already holds this cluster's context", m.path)
			continue
		}
		what := fmt.Sprintf("merge this cluster's context into %s", m.path)
		if _, err := os.Stat(m.path); err == nil {
			what += " (backed up first)"
		}
		if err := env.Wet(what, func() error {
			r, err := m.do(m.path, m.data, env.now())
			if err == nil && r.Backup != "" {
				env.UI.OK("backed up %s to %s", m.path, r.Backup)
			}
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

func noop() error { return nil }

// Prechecks implements Prechecker: an existing secrets bundle opens (an
// encrypted one with secrets.age's identity), so a lost or wrong age key
// fails here, before any node is touched, and not in the middle of the
// talos stage.
func (TalosStage) Prechecks(_ context.Context, env *Env) []check.Check {
	return []check.Check{{Name: "secrets bundle", Run: func(ctx context.Context) (check.Status, string) {
		path := env.Paths.Secrets
		stored, err := os.ReadFile(path)
		switch {
		case errors.Is(err, fs.ErrNotExist) && len(env.Config.Secrets.Age.Recipients) > 0:
			return check.Passf("none yet: the talos stage creates %s once, SOPS-encrypted", path)
		case errors.Is(err, fs.ErrNotExist):
			return check.Passf("none yet: the talos stage creates %s once", path)
		case err != nil:
			return check.Failf("%v", err)
		}
		sealer := bundleSealer(env)
		if _, err := talos.LoadSecrets(path, sealer); err != nil {
			return check.Failf("%v", err)
		}
		if !sops.IsEncrypted(stored) {
			if sealer.Encrypting() {
				return check.Warnf("%s is plaintext although secrets.age.recipients is set: run `bootstrap secrets encrypt`", path)
			}
			return check.Passf("%s (plaintext, mode 0600; secrets.age.recipients encrypts it at rest)", path)
		}
		ids, _ := sealer.Identities()
		return check.Passf("%s is SOPS-encrypted and opens with %s", path, ids.Source)
	}}}
}
