package stages

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/fluxcd/cli-utils/pkg/object"
	"golang.org/x/sync/errgroup"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/flux"
	"github.com/homelab/bootstrap/gitsnap"
	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/sops"
	"github.com/homelab/bootstrap/state"
	"github.com/homelab/bootstrap/talos"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// FluxStage installs Flux into flux-system and points a GitRepository and a
// Kustomization at ${GIT_REPO}@${GIT_BRANCH} path ./infra, or at a local
// git snapshot this host serves, then waits until both are Ready.
type FluxStage struct{}

// Name implements Stage.
func (FluxStage) Name() string { return Flux }

// Needs implements Needs: with the pod network Talos brings up itself
// (flannel), Flux needs the cluster and nothing of the infra stage, which
// it runs beside. The NFS provisioner's default StorageClass may come
// after a claim Flux's sources create: the PersistentVolume controller
// gives a claim without a class the default once there is one, on its
// next resync (kube-controller-manager pv_controller.go
// assignDefaultStorageClass, k8s.io/kubernetes v1.30.14 and v1.36.1;
// infra TestAClaimMadeBeforeTheDefaultClassGetsIt). With a CNI the infra stage
// installs (cilium) or the user's own (none), Flux's controllers start
// only once the nodes are Ready: it waits for the infra stage.
func (FluxStage) Needs(cfg *config.Config) []string {
	if cfg.CNI.Name != "flannel" {
		return nil
	}
	return []string{Precheck, Provision, Talos}
}

// Run implements Stage.
func (FluxStage) Run(ctx context.Context, env *Env) error {
	f := env.Config.Flux
	rc, err := kubeRESTConfig(env)
	if errors.Is(err, fs.ErrNotExist) && env.DryRun {
		env.UI.Warn("%v: the talos stage creates it", err)
		return env.Wet(fmt.Sprintf("install Flux %s into %s and sync %s", f.Version, FluxNamespace, f.Path), nil)
	}
	if err != nil {
		return err
	}
	c, err := flux.NewClient(rc, env.Log)
	if err != nil {
		return err
	}
	// A Flux the Flux Operator manages is never overwritten with release
	// manifests: the operator would put its own back, and the two would
	// fight over every controller on every run.
	if insts, err := c.OperatorInstances(ctx); err != nil {
		return err
	} else if len(insts) > 0 {
		return config.Userf("flux: Flux on this cluster is managed by the Flux Operator (FluxInstance %s); bootstrap installs Flux from its release manifests and would fight the operator over every controller, so the flux stage changes nothing here: keep Flux with the operator (its FluxInstance's sync can point at the repository and path of flux.repo and flux.path, %s) and run the other stages, or delete the FluxInstance to hand Flux to bootstrap",
			strings.Join(insts, ", "), f.Path)
	}

	// 1. Flux itself, 2. where the cluster pulls from and 3. the sync
	// objects pointing Flux there. A plan lists them in this order; a run
	// does 1 and 2 at once (the snapshot is built and served while the
	// install's objects are planned and applied), plans 3 beside the
	// install's plan and applies it as soon as the CRDs of GitRepository
	// and Kustomization are established and the namespace exists, beside the
	// rest of the install (the controllers' Deployments): the sync objects
	// need only their kinds and the namespace, and the controllers take
	// them up when they start. The install's own wait (controllers rolled
	// out) runs alongside Flux's first sync, below.
	var installed object.ObjMetadataSet
	definitions := make(chan struct{})
	var defined sync.Once
	// redefined: the install created or changed the CRD of a sync kind,
	// so what was planned against the CRD before is planned again.
	var redefined bool
	install := func(ctx context.Context) (err error) {
		inst := fluxInstallOptions(env, clusterDomain(env))
		objs, err := fluxInstallObjects(ctx, env, inst)
		if err != nil {
			return err
		}
		// The sync kinds' CRDs and the namespace are planned first: when
		// they are in place (a re-run, or CRDs installed before), the sync
		// objects go while the rest of the install is planned.
		changes, notify, err := c.PlanDefinedFirst(ctx, objs,
			flux.DefinedKinds{Kinds: []schema.GroupKind{flux.GitRepositoryGVK.GroupKind(), flux.KustomizationGVK.GroupKind()},
				Then: func(changed bool) {
					defined.Do(func() {
						redefined = changed
						close(definitions)
					})
				}})
		if err != nil {
			return err
		}
		installed, err = applyPlanned(ctx, env, c, objs, changes, fmt.Sprintf("install Flux %s (%s) from %s", f.Version, strings.Join(f.Components, ", "), inst.Source()), notify)
		return err
	}
	var url, revision string
	source := func(ctx context.Context) (err error) {
		url, revision, err = fluxSource(ctx, env)
		return err
	}
	syncObjects := func(ctx context.Context) error {
		objs, what, err := syncObjectsFor(ctx, env, url)
		if err != nil {
			return err
		}
		_, err = applyObjects(ctx, env, c, objs, what, flux.DefinedKinds{})
		return err
	}
	if env.DryRun {
		if err = install(ctx); err == nil {
			if err = source(ctx); err == nil {
				err = syncObjects(ctx)
			}
		}
	} else {
		g, gctx := errgroup.WithContext(ctx)
		g.Go(func() error { return install(gctx) })
		g.Go(func() error {
			if err := source(gctx); err != nil {
				return err
			}
			// The sync objects are planned beside the install's plan
			// (their lists are reads) and applied once their kinds
			// serve; planned again when the install redefined a kind.
			objs, what, err := syncObjectsFor(ctx, env, url)
			if err != nil {
				return err
			}
			changes, err := c.Plan(gctx, objs)
			if err != nil {
				return err
			}
			// An install that fails ends gctx: its error is the one
			// g.Wait returns.
			select {
			case <-definitions:
			case <-gctx.Done():
				return gctx.Err()
			}
			if redefined {
				if changes, err = c.Plan(gctx, objs); err != nil {
					return err
				}
			}
			_, err = applyPlanned(gctx, env, c, objs, changes, what, flux.DefinedKinds{})
			return err
		})
		err = g.Wait()
	}
	if err != nil || env.DryRun {
		return err
	}
	// The install's wait runs beside the sync's; its failure (a controller
	// that never rolls out) says more than the sync's timeout would, so it
	// ends the sync's wait and is the error reported.
	installWait := make(chan error, 1)
	syncCtx, cancelSync := context.WithCancel(ctx)
	defer cancelSync()
	installCtx, cancelInstall := context.WithCancel(ctx)
	defer cancelInstall()
	go func() {
		err := c.WaitApplied(installCtx, installed, f.Timeout.D())
		if err != nil && installCtx.Err() == nil {
			cancelSync()
		}
		installWait <- err
	}()
	if err := fluxSynced(syncCtx, env, c, revision); err != nil {
		if syncCtx.Err() == nil || ctx.Err() != nil {
			// The sync failed on its own: the install's wait is moot.
			cancelInstall()
			<-installWait
			return err
		}
		return fmt.Errorf("installing Flux: %w", <-installWait)
	}
	if err := <-installWait; err != nil {
		return fmt.Errorf("installing Flux: %w", err)
	}
	_, ks, err := c.Status(ctx, FluxNamespace, FluxNamespace)
	if err != nil {
		return err
	}
	env.UI.OK("Flux synced %s at %s", f.Path, ks.Revision)
	// What the repository declares is applied only once every
	// Kustomization and HelmRelease it created is Ready, not when the sync
	// pair is: a HelmRelease nobody reconciles (no helm-controller) or
	// whose chart fails would otherwise pass silently.
	all, err := c.WaitAllReady(ctx, f.Timeout.D())
	if err != nil {
		return err
	}
	_, status := flux.AllReady(all)
	env.withState(func(st *state.State) { st.Outputs.Flux = stateFlux(f, url, ks.Revision) })
	env.UI.OK("%s", status)
	return nil
}

// fluxSynced asks Flux to reconcile what is not synced yet at once, or
// to reconcile again after a restore, and waits until the sync pair is
// Ready at revision; a suspended object or a Ready=False after the request
// ends the wait with the controller's message (flux.Client.SyncNow).
func fluxSynced(ctx context.Context, env *Env, c *flux.Client, revision string) error {
	f := env.Config.Flux
	// After an etcd restore the Flux objects carry the Ready status they
	// had when the snapshot was taken: only a reconciliation the new
	// controllers handled says Flux syncs again.
	if env.Options.Recover != nil {
		return env.Wet("ask Flux to reconcile the restored GitRepository, then its Kustomization", func() error {
			return c.ReconcileWithSource(ctx, FluxNamespace, FluxNamespace, revision, env.now, f.Timeout.D())
		})
	}
	// What is not synced yet is asked to reconcile now: a new snapshot
	// would otherwise wait for the next interval, and a failure from
	// before (a Secret fixed since) for the retry interval. The wait
	// then ends at a Ready=False only once it follows the request.
	pending, err := c.Unsynced(ctx, FluxNamespace, FluxNamespace, revision)
	if err != nil {
		return err
	}
	var requests map[schema.GroupVersionKind]string
	if len(pending) > 0 {
		what := fmt.Sprintf("ask Flux to reconcile the Kustomization at %s again", revision)
		if pending[0] == flux.GitRepositoryGVK {
			what = fmt.Sprintf("ask Flux to fetch %s now", revision)
			if len(pending) > 1 {
				what += " and reconcile the Kustomization"
			}
		}
		if err := env.Wet(what, func() error {
			requests, err = c.RequestSync(ctx, FluxNamespace, FluxNamespace, pending, env.now)
			return err
		}); err != nil {
			return err
		}
	}
	return c.WaitReadyAfter(ctx, FluxNamespace, FluxNamespace, revision, requests, f.Timeout.D())
}

// syncObjectsFor returns the sync objects for the GitRepository's url,
// with the credentials (the private remote's, or the snapshot server's
// own), and what applying them is called. They are not waited for as
// kstatus sees them: the stage's wait knows the revision they must reach.
func syncObjectsFor(ctx context.Context, env *Env, url string) ([]*unstructured.Unstructured, string, error) {
	f := env.Config.Flux
	opts := flux.SyncOptions{Name: FluxNamespace, Namespace: FluxNamespace, URL: url, Branch: f.Branch, Path: f.Path, Interval: f.Interval.D()}
	var objs []*unstructured.Unstructured
	var secret *unstructured.Unstructured
	var err error
	if f.LocalSnapshot.Enabled {
		secret, err = snapshotAuthSecret(env)
	} else {
		secret, err = fluxAuthSecret(env)
	}
	if err != nil {
		return nil, "", err
	}
	if secret != nil {
		opts.SecretName = secret.GetName()
		objs = append(objs, secret)
	}
	if f.Decryption.Enabled {
		dec, err := fluxDecryptionSecret(ctx, env)
		if err != nil {
			return nil, "", err
		}
		opts.DecryptionSecret = dec.GetName()
		objs = append(objs, dec)
	}
	more, err := flux.SyncObjects(opts)
	if err != nil {
		return nil, "", err
	}
	return append(objs, more...), fmt.Sprintf("sync %s@%s path %s with GitRepository and Kustomization %s/%s", url, f.Branch, f.Path, FluxNamespace, FluxNamespace), nil
}

// applyObjects applies objects through Wet when a server-side dry run says
// any of them would change; unchanged objects are not touched at all. It
// returns what was applied, for the caller's wait (flux.Client.WaitApplied);
// nil when nothing was. notify.Then, when set, is called once the CRDs of
// its kinds are established (flux.Client.ApplyChangesStaged), at once when
// none of objs changes.
func applyObjects(ctx context.Context, env *Env, c *flux.Client, objs []*unstructured.Unstructured, what string, notify flux.DefinedKinds) (object.ObjMetadataSet, error) {
	changes, err := c.Plan(ctx, objs)
	if err != nil {
		return nil, err
	}
	return applyPlanned(ctx, env, c, objs, changes, what, notify)
}

// applyPlanned is applyObjects with objs planned already (changes).
func applyPlanned(ctx context.Context, env *Env, c *flux.Client, objs []*unstructured.Unstructured, changes []flux.Change, what string, notify flux.DefinedKinds) (object.ObjMetadataSet, error) {
	if len(changes) == 0 {
		env.UI.OK("%s: no changes (%d objects up to date)", what, len(objs))
		if notify.Then != nil {
			notify.Then(false)
		}
		return nil, nil
	}
	summary := map[string]int{}
	for _, ch := range changes {
		summary[ch.Action]++
		env.Log.Debug().Str("object", ch.Object).Str("action", ch.Action).Msg("planned")
	}
	var parts []string
	for _, a := range []string{"created", "configured"} {
		if summary[a] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", summary[a], a))
		}
	}
	var applied object.ObjMetadataSet
	err := env.Wet(fmt.Sprintf("%s (%s)", what, strings.Join(parts, ", ")), func() error {
		var err error
		applied, err = c.ApplyChangesStaged(ctx, changes, env.Config.Flux.Timeout.D(), notify)
		return err
	})
	return applied, err
}

// prepFluxInstall keys Flux's install objects rendered in the background.
const prepFluxInstall = "flux-install"

// renderedFlux is Flux's install rendered for one set of options, kept as
// YAML until the stage needs the objects: parsed, they would stay on the
// heap through the Talos and infra stages (about 8 MiB more at the Helm
// install's peak).
type renderedFlux struct {
	opts      flux.InstallOptions
	manifests string
}

// Prepare implements Preparer: Flux's manifests are fetched and rendered
// while the VMs boot and Talos installs (a download and a kustomize build,
// neither needs the cluster). The cluster's DNS domain comes from the
// rendered Talos configs; before they exist it is Talos' default, and the
// stage renders again in line if the configs then say otherwise.
func (FluxStage) Prepare(ctx context.Context, env *Env) {
	domain := talos.DefaultDNSDomain
	if cps := env.Config.ControlPlanes(); len(cps) > 0 {
		if d, err := talos.DNSDomain(keptFiles(env), env.Paths.TalosDir, cps[0].Name); err == nil {
			domain = d
		}
	}
	opts := fluxInstallOptions(env, domain)
	env.prepareCPU(ctx, prepFluxInstall, fmt.Sprintf("Flux %s's manifests from %s", opts.Version, opts.Source()), func(ctx context.Context) (any, error) {
		m, err := flux.RenderInstall(ctx, opts)
		return renderedFlux{opts: opts, manifests: m}, err
	})
}

// fluxInstallOptions says which Flux the config asks for, rendered for the
// cluster's DNS domain ("" is Talos' default).
func fluxInstallOptions(env *Env, domain string) flux.InstallOptions {
	f := env.Config.Flux
	if domain == "" {
		domain = talos.DefaultDNSDomain
	}
	return flux.InstallOptions{Version: f.Version, Manifests: manifestsSource(env.Config), Components: f.Components, Namespace: FluxNamespace,
		ClusterDomain: domain, CacheDir: fluxRenderCache()}
}

// fluxRenderCache is where Flux's rendered installs are kept between runs
// (<user cache dir>/bootstrap/flux-install), "" when the user has none.
func fluxRenderCache() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "bootstrap", "flux-install")
}

// fluxInstallObjects returns Flux's install objects: those prepared in the
// background when they were rendered from the same options, else rendered
// now.
func fluxInstallObjects(ctx context.Context, env *Env, opts flux.InstallOptions) ([]*unstructured.Unstructured, error) {
	r, ok, err := takePrepared[renderedFlux](ctx, env, prepFluxInstall, 2*time.Minute)
	if err != nil {
		return nil, err
	}
	if ok && reflect.DeepEqual(r.opts, opts) {
		return flux.ParseInstall(r.manifests)
	}
	return flux.InstallObjects(ctx, opts)
}

// manifestsSource resolves a local manifests path against the config dir.
func manifestsSource(cfg *config.Config) string {
	m := cfg.Flux.Manifests
	if m == "" || strings.HasPrefix(m, "http://") || strings.HasPrefix(m, "https://") {
		return m
	}
	return cfg.Resolve(m)
}

// fluxSource returns the URL the GitRepository points at and, for a local
// snapshot, the revision Flux must reach. It starts or refreshes the
// snapshot server when needed.
func fluxSource(ctx context.Context, env *Env) (url, revision string, err error) {
	f := env.Config.Flux
	ls := f.LocalSnapshot
	if !ls.Enabled {
		head, err := remoteHead(ctx, env)
		if err != nil && env.DryRun {
			// A plan reads what it can; the run itself needs the head.
			env.Log.Warn().Err(err).Msg("the plan goes on without the remote head")
			return f.Repo, "", nil
		}
		if err != nil {
			return "", "", err
		}
		return f.Repo, f.Branch + "@sha1:" + head, nil
	}
	snap, err := gitsnap.Build(ctx, snapshotOptions(env.Config))
	if err != nil {
		return "", "", fmt.Errorf("snapshotting %s: %w", ls.Source, err)
	}
	env.Log.Info().Str("hash", snap.Hash.String()).Int("files", snap.Files).Str("excluded", snap.Excluded.String()).Str("scope", snap.Scope()).Msg("local git snapshot built")
	reportWithheld(env, snap)
	if err := snap.Refusal(); err != nil {
		return "", "", config.Userf("%s: %v", ls.Source, err)
	}
	env.withState(func(st *state.State) { st.Outputs.GitSnapshot.Withheld = withheldNames(snap) })
	authFile := filepath.Join(env.Paths.StateDir, gitsnap.AuthFileName)
	tlsCert := ""
	if ls.TLSCertFile != "" {
		tlsCert = env.Config.Resolve(ls.TLSCertFile)
	}
	st, _ := gitsnap.Check(ctx, env.Paths.StateDir)
	// Reused only when it also guards the tree as configured: a server an
	// older version started without the credential (or TLS) is replaced.
	if st.State != nil && st.Serves(snap.Hash.String()) && st.State.AuthFile == authFile && st.State.TLSCert == tlsCert {
		env.UI.OK("git snapshot server (pid %d) already serves %s at %s", st.State.PID, short(snap.Hash.String()), ls.URL)
		// Serves checked the hash; a server whose starting run was killed
		// is recorded without one.
		rec := *st.State
		rec.Hash = snap.Hash.String()
		recordSnapshot(env, &rec)
		return ls.URL, snap.Revision(), nil
	}
	opts := gitsnap.StartOptions{
		Flags: gitsnap.ServeFlags{Repo: env.Config.Resolve(ls.Source), Listen: ls.Listen, URL: ls.URL, Branch: f.Branch,
			Interval: ls.Refresh.D(), Exclude: ls.Exclude, Protect: env.Config.Protected(), AuthFile: authFile,
			Path: f.Path, Plaintext: ls.ServePlaintext, Tree: ls.Serve == "tree"},
		StateDir: env.Paths.StateDir, Log: env.Log,
	}
	if tlsCert != "" {
		opts.Flags.TLSCert, opts.Flags.TLSKey = tlsCert, env.Config.Resolve(ls.TLSKeyFile)
	}
	var served string
	err = env.Wet(fmt.Sprintf("serve git snapshot %s of %s at %s", short(snap.Hash.String()), ls.Source, ls.URL), func() error {
		if _, _, err := gitsnap.EnsureAuth(env.Paths.StateDir); err != nil {
			return err
		}
		state, action, err := gitsnap.Ensure(ctx, opts, snap.Hash.String())
		if err != nil {
			return err
		}
		env.Log.Info().Str("action", string(action)).Int("pid", state.PID).Msg("git snapshot server " + string(action))
		served = state.Hash
		recordSnapshot(env, state)
		return env.SaveState()
	})
	if err != nil {
		return "", "", err
	}
	// Wait for what the server serves: the tree may have changed since Build.
	if served != "" {
		return ls.URL, f.Branch + "@sha1:" + served, nil
	}
	return ls.URL, snap.Revision(), nil
}

// snapshotOptions is how the flux stage, its precheck and the detached
// server it starts snapshot the local work tree.
func snapshotOptions(cfg *config.Config) gitsnap.BuildOptions {
	ls := cfg.Flux.LocalSnapshot
	return gitsnap.BuildOptions{Dir: cfg.Resolve(ls.Source), Branch: cfg.Flux.Branch, Excludes: ls.Exclude, Protect: cfg.Protected(),
		FluxPath: cfg.Flux.Path, ServePlaintext: ls.ServePlaintext, ServeWholeTree: ls.Serve == "tree"}
}

// reportWithheld names every file the snapshot leaves out, with its rule
// (never its content): the cluster gets the tree without them.
func reportWithheld(env *Env, snap *gitsnap.Snapshot) {
	for _, w := range snap.Withheld {
		env.UI.Warn("git snapshot withholds %s", w)
	}
}

// withheldNames renders the withheld files for the state file.
func withheldNames(snap *gitsnap.Snapshot) []string {
	out := make([]string, len(snap.Withheld))
	for i, w := range snap.Withheld {
		out[i] = w.String()
	}
	return out
}

func recordSnapshot(env *Env, s *gitsnap.State) {
	env.withState(func(st *state.State) {
		g := &st.Outputs.GitSnapshot
		g.PID, g.Listen, g.URL, g.Hash, g.Started = s.PID, s.Listen, s.URL, s.Hash, s.StartedAt
	})
}

// fluxCredentials reads the credentials of a private remote from the files
// or environment the config names; ok is false for an anonymous repository.
func fluxCredentials(env *Env) (cr flux.Credentials, ok bool, err error) {
	a := env.Config.Flux.Auth
	switch {
	case a.SSHKeyFile != "":
		if cr.SSHKey, err = os.ReadFile(env.Config.Resolve(a.SSHKeyFile)); err != nil {
			return cr, false, config.Userf("flux.auth.sshKeyFile: %v", err)
		}
		if a.KnownHostsFile != "" {
			if cr.KnownHosts, err = os.ReadFile(env.Config.Resolve(a.KnownHostsFile)); err != nil {
				return cr, false, config.Userf("flux.auth.knownHostsFile: %v", err)
			}
		}
	case a.TokenFile != "":
		b, err := os.ReadFile(env.Config.Resolve(a.TokenFile))
		if err != nil {
			return cr, false, config.Userf("flux.auth.tokenFile: %v", err)
		}
		cr.Token, cr.Username = strings.TrimSpace(string(b)), a.Username
	case a.TokenEnv != "":
		v, set := os.LookupEnv(a.TokenEnv)
		if !set || v == "" {
			return cr, false, config.Userf("flux.auth.tokenEnv: environment variable %s is not set", a.TokenEnv)
		}
		cr.Token, cr.Username = v, a.Username
	default:
		return cr, false, nil
	}
	env.Secrets.Add(cr.Token)
	return cr, true, nil
}

// fluxAuthSecret builds the Secret source-controller reads the credentials
// from; nil for an anonymous repository.
func fluxAuthSecret(env *Env) (*unstructured.Unstructured, error) {
	cr, ok, err := fluxCredentials(env)
	if err != nil || !ok {
		return nil, err
	}
	return flux.AuthSecret(FluxNamespace, FluxNamespace, cr)
}

// fluxIdentities returns the age identities Flux gets in sops-age, and
// marks them secret for every output: of every identity secrets.age.keyFile
// holds (or, without it, every identity where the sops CLI looks), only
// those that open the repository's SOPS files under flux.path, or, with no
// such file yet, secrets.age.recipients. The sops CLI reads every source
// so the machine it runs on can open anything; the cluster needs the
// repository's key, and other clusters' or projects' keys found in
// keys.txt or a key command's output do not belong in its etcd. The first
// SOPS file found comes back too, for the precheck to prove the selection
// opens it.
func fluxIdentities(ctx context.Context, env *Env) (ids sops.Identities, file string, data []byte, err error) {
	file, data, recipients, err := repositorySOPS(ctx, env)
	if err != nil {
		return ids, "", nil, err
	}
	what := "the SOPS files under " + env.Config.Flux.Path
	if file != "" {
		what = fmt.Sprintf("%s (of the SOPS files under %s)", file, env.Config.Flux.Path)
	}
	if len(recipients) == 0 {
		recipients, what = env.Config.Secrets.Age.Recipients, "secrets.age.recipients"
	}
	// The recipients are known first: $SOPS_AGE_KEY_CMD is asked for each
	// ($SOPS_AGE_RECIPIENT), as sops v3.13.2 asks it.
	keyFile := env.Config.Resolve(env.Config.Secrets.Age.KeyFile)
	all, err := sops.LoadIdentities(keyFile, nil, recipients...)
	if err != nil {
		return ids, "", nil, config.Userf("flux.decryption: %v", err)
	}
	env.Secrets.Add(strings.TrimSpace(string(all.Data)))
	for _, line := range strings.Split(string(all.Data), "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			env.Secrets.Add(l)
		}
	}
	switch {
	case len(recipients) > 0:
		ids, ok := all.Only(recipients)
		if !ok {
			return ids, file, data, config.Userf("flux.decryption: none of the %d age identities of %s opens %s (sealed to %s): point secrets.age.keyFile at the cluster's key", len(all.Recipients), all.Source, what, strings.Join(recipients, ", "))
		}
		ids.Source = fmt.Sprintf("%s (the identities opening %s)", all.Source, what)
		return ids, file, data, nil
	case keyFile != "" || len(all.Recipients) == 1:
		return all, file, data, nil
	default:
		return ids, file, data, config.Userf("flux.decryption: %s holds %d age identities and nothing tells which the cluster needs (no SOPS file under %s yet, no secrets.age.recipients): set secrets.age.keyFile to the cluster's key file, or secrets.age.recipients", all.Source, len(all.Recipients), env.Config.Flux.Path)
	}
}

// repositorySOPS reads the SOPS files of the tree Flux will pull and
// returns the first YAML one and the age recipients of all of them. For a
// local snapshot these are the files the cluster's build reads from
// flux.path (gitsnap.BuildReads: every Kustomization it applies, wherever
// its path lies, decrypts with the same sops-age Secret: kustomize-
// controller v1.9.5 internal/decryptor/decryptor.go ImportKeys), dotenv
// and INI generator inputs included (decryptKustomizationSources decrypts
// those too); for a remote, the YAML and JSON files under flux.path of a
// shallow clone.
func repositorySOPS(ctx context.Context, env *Env) (file string, data []byte, recipients []string, err error) {
	f := env.Config.Flux
	seen := map[string]bool{}
	add := func(rs []string) {
		for _, r := range rs {
			if !seen[r] {
				seen[r] = true
				recipients = append(recipients, r)
			}
		}
	}
	visit := func(rel string, b []byte) bool {
		if !sops.IsEncrypted(b) {
			return false
		}
		if file == "" {
			file, data = rel, b
		}
		add(sops.FileRecipients(b))
		return false
	}
	if f.LocalSnapshot.Enabled {
		root, files, rerr := gitsnap.BuildReads(ctx, env.Config.Resolve(f.LocalSnapshot.Source), f.Path)
		if rerr != nil {
			return "", nil, nil, fmt.Errorf("reading what the cluster's build reads from %s: %w", f.Path, rerr)
		}
		for _, rel := range files {
			b, rerr := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
			if rerr != nil {
				return "", nil, nil, rerr
			}
			if flatRecipients := sopsFlatRecipients(b); len(flatRecipients) > 0 {
				add(flatRecipients)
				continue
			}
			visit(rel, b)
		}
	} else {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		cr, _, cerr := fluxCredentials(env)
		if cerr != nil {
			return "", nil, nil, cerr
		}
		err = flux.WalkRemote(ctx, f.Repo, f.Branch, cr, env.Config.Resolve(f.Auth.KnownHostsFile), f.Path, visit)
	}
	if err != nil {
		return "", nil, nil, fmt.Errorf("reading %s for its SOPS files: %w", f.Path, err)
	}
	return file, data, recipients, nil
}

// sopsFlatRecipient is an age recipient of a dotenv or INI file as sops
// writes it (stores/dotenv and stores/ini flatten the metadata:
// sops_age__list_0__map_recipient=age1… in dotenv, age__list_0__map_recipient
// = age1… under [sops] in INI).
var sopsFlatRecipient = regexp.MustCompile(`(?m)^\s*(?:sops_)?age__list_\d+__map_recipient\s*=\s*(age1[0-9a-z]+)\s*$`)

// sopsFlatRecipients returns the age recipients of a SOPS-encrypted
// dotenv or INI file (one with an encrypted MAC), or nothing.
func sopsFlatRecipients(b []byte) []string {
	if !bytes.Contains(b, []byte("sops_mac=ENC[")) && !(bytes.Contains(b, []byte("[sops]")) && bytes.Contains(b, []byte("mac"))) {
		return nil
	}
	var out []string
	for _, m := range sopsFlatRecipient.FindAllSubmatch(b, -1) {
		out = append(out, string(m[1]))
	}
	return out
}

// fluxDecryptionSecret builds the sops-age Secret kustomize-controller
// decrypts with (the identities under a key ending in .agekey).
func fluxDecryptionSecret(ctx context.Context, env *Env) (*unstructured.Unstructured, error) {
	ids, _, _, err := fluxIdentities(ctx, env)
	if err != nil {
		return nil, err
	}
	return flux.DecryptionSecret(flux.DecryptionSecretName, FluxNamespace, ids.Data)
}

// sopsCheck proves, before anything is installed, that the identities Flux
// will get decrypt the repository's SOPS files: it decrypts the first one
// under flux.path of the tree Flux will pull with exactly what sops-age
// will hold. A wrong key fails here, naming the file.
func sopsCheck(env *Env) check.Check {
	return check.Check{Name: "sops decryption", Run: func(ctx context.Context) (check.Status, string) {
		f := env.Config.Flux
		ids, file, data, err := fluxIdentities(ctx, env)
		switch {
		case err != nil:
			return check.Failf("%v", err)
		case file == "":
			return check.Warnf("no SOPS-encrypted file under %s yet: nothing to prove %s against", f.Path, ids.Source)
		}
		// As kustomize-controller v1.9.5 will: sops v3.13.2's rules.
		if _, err := sops.DecryptAsFlux(data, ids); err != nil {
			return check.Failf("%s: %v", file, err)
		}
		return check.Passf("%s decrypts with %s (what Flux gets as %s/%s: %d identit%s)", file, ids.Source, flux.DecryptionSecretName, flux.DecryptionAgeKey, len(ids.Recipients), map[bool]string{true: "y", false: "ies"}[len(ids.Recipients) == 1])
	}}
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

func stateFlux(f config.Flux, url, revision string) (out state.Flux) {
	out.Version, out.URL, out.Branch, out.Path, out.Revision = f.Version, redact.URL(url), f.Branch, f.Path, revision
	return out
}

// Prechecks implements Prechecker. They prove the git source Flux will pull from: a local snapshot
// builds and its address can be served, or the remote lists the branch.
func (FluxStage) Prechecks(ctx context.Context, env *Env) []check.Check {
	checks := sourceChecks(env)
	if env.Config.Flux.Decryption.Enabled {
		checks = append(checks, sopsCheck(env))
	}
	return checks
}

// sourceChecks prove the git source Flux will pull from.
func sourceChecks(env *Env) []check.Check {
	f := env.Config.Flux
	if f.LocalSnapshot.Enabled {
		ls := f.LocalSnapshot
		return []check.Check{
			{Name: "git snapshot", Run: func(ctx context.Context) (check.Status, string) {
				snap, err := gitsnap.Build(ctx, snapshotOptions(env.Config))
				if err != nil {
					return check.Failf("snapshot of %s: %v", ls.Source, err)
				}
				if err := snap.Refusal(); err != nil {
					return check.Failf("%s: %v", ls.Source, err)
				}
				if len(snap.Withheld) > 0 {
					return check.Passf("%s: %d files (%s), commit %s; withheld (never served): %s", ls.Source, snap.Files, snap.Scope(), short(snap.Hash.String()), snap.WithheldList())
				}
				return check.Passf("%s: %d files (%s), commit %s, nothing withheld", ls.Source, snap.Files, snap.Scope(), short(snap.Hash.String()))
			}},
			{Name: "git snapshot address", Run: func(ctx context.Context) (check.Status, string) {
				if st, err := gitsnap.Check(ctx, env.Paths.StateDir); err == nil && st.State != nil && st.Alive && st.ProbeError == nil {
					return check.Passf("already served by bootstrap's snapshot server (pid %d) at %s", st.State.PID, st.State.URL)
				}
				l, err := net.Listen("tcp", ls.Listen)
				if err != nil {
					return check.Failf("cannot listen on %s: %v (another process holds it, or the address is not on this host)", ls.Listen, err)
				}
				l.Close()
				return check.Passf("%s free; the cluster will clone %s", ls.Listen, ls.URL)
			}},
		}
	}
	return []check.Check{{Name: "git remote", Run: func(ctx context.Context) (check.Status, string) {
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		cr, _, err := fluxCredentials(env)
		if err != nil {
			return check.Failf("%v", err)
		}
		head, err := flux.RemoteBranchHead(ctx, f.Repo, f.Branch, cr, env.Config.Resolve(f.Auth.KnownHostsFile))
		if err != nil {
			return check.Failf("%v", err)
		}
		return check.Passf("%s branch %s at %s", redact.URL(f.Repo), f.Branch, short(head))
	}}}
}

// clusterDomain is the DNS domain the talos stage rendered for the
// cluster, which Flux's controllers address each other with; the default
// when no rendered config is at hand (a flux stage run on another machine).
func clusterDomain(env *Env) string {
	for _, n := range env.Config.ControlPlanes() {
		d, err := talos.DNSDomain(keptFiles(env), env.Paths.TalosDir, n.Name)
		if err != nil {
			env.Log.Warn().Err(err).Msg("Flux is rendered for the default cluster domain cluster.local")
			return ""
		}
		return d
	}
	return ""
}

// remoteHead lists the remote branch as a clone starts (git ls-remote)
// and returns the commit Flux must reach: as `flux bootstrap` does, the
// stage waits for that revision, not for whatever Flux fetched last (a
// GitRepository Ready at the previous commit would otherwise pass for a
// sync of the new one until its next interval).
func remoteHead(ctx context.Context, env *Env) (string, error) {
	f := env.Config.Flux
	cr, _, err := fluxCredentials(env)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	head, err := flux.RemoteBranchHead(ctx, f.Repo, f.Branch, cr, env.Config.Resolve(f.Auth.KnownHostsFile))
	if err != nil {
		return "", fmt.Errorf("the head of %s branch %s, which Flux must reach: %w", redact.URL(f.Repo), f.Branch, err)
	}
	env.Log.Info().Str("repo", redact.URL(f.Repo)).Str("branch", f.Branch).Str("head", head).Msg("remote branch head")
	return head, nil
}

// snapshotAuthSecret builds the Secret Flux presents to the snapshot
// server: the cluster's credential (created once, 0600, in the state
// directory, which no snapshot contains). A dry run creates nothing: it
// plans with a placeholder when there is no credential yet.
func snapshotAuthSecret(env *Env) (*unstructured.Unstructured, error) {
	var auth gitsnap.BasicAuth
	var err error
	path := filepath.Join(env.Paths.StateDir, gitsnap.AuthFileName)
	if env.DryRun {
		if auth, err = gitsnap.ReadAuth(path); errors.Is(err, fs.ErrNotExist) {
			auth, err = gitsnap.BasicAuth{Username: "flux", Password: "to-be-generated"}, nil
		}
	} else {
		auth, _, err = gitsnap.EnsureAuth(env.Paths.StateDir)
	}
	if err != nil {
		return nil, fmt.Errorf("the snapshot server's credential: %w", err)
	}
	env.Secrets.Add(auth.Password)
	cr := flux.Credentials{Username: auth.Username, Token: auth.Password}
	if f := env.Config.Flux.LocalSnapshot.TLSCertFile; f != "" {
		// Flux trusts the server's own certificate (a self-signed one is
		// its own CA).
		if cr.CA, err = os.ReadFile(env.Config.Resolve(f)); err != nil {
			return nil, config.Userf("flux.localSnapshot.tlsCertFile: %v", err)
		}
	}
	return flux.AuthSecret(FluxNamespace, FluxNamespace, cr)
}
