package talos

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/cel"
	"github.com/siderolabs/talos/pkg/machinery/cel/celenv"
	"github.com/siderolabs/talos/pkg/machinery/config"
	configdoc "github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/k8s"
	"github.com/siderolabs/talos/pkg/machinery/config/types/meta"
	"github.com/siderolabs/talos/pkg/machinery/config/types/network"
	runtimecfg "github.com/siderolabs/talos/pkg/machinery/config/types/runtime"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/nethelpers"
	"github.com/siderolabs/talos/pkg/machinery/textdiff"

	"github.com/homelab/bootstrap/internal/sealed"
)

// File names inside the cluster directory.
const (
	ControlPlaneFile = "controlplane.yaml"
	WorkerFile       = "worker.yaml"
	TalosconfigFile  = "talosconfig"
	NodesDir         = "nodes"
)

// RenderedNode is one node's final machine config.
type RenderedNode struct {
	Name string
	Role Role
	// IP is the node's address without prefix.
	IP          string
	InstallDisk string
	// Config is the complete machine config to apply.
	Config []byte
	// Patch is the node patch generated from the inputs (for display).
	Patch []byte
	// SHA256 of Config, recorded in state as the applied config's hash.
	SHA256 string
}

// Rendered is the full output of generation, in memory.
type Rendered struct {
	Endpoint     string
	ControlPlane []byte
	Worker       []byte
	Talosconfig  []byte
	// Nodes in configuration order.
	Nodes []RenderedNode
}

// Node returns the rendered node called name.
func (r *Rendered) Node(name string) (RenderedNode, bool) {
	for _, n := range r.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return RenderedNode{}, false
}

// FileChange is one output file that generation would write or wrote.
type FileChange struct {
	Path string
	// Diff against the file on disk ("" for a new file or a secret).
	Diff string
	New  bool
}

// Result describes a generation run.
type Result struct {
	*Rendered
	Dir             string
	SecretsPath     string
	TalosconfigPath string
	// SecretsCreated is true when this run minted the bundle. In a plan it
	// means the bundle would be created (the rendered configs then use a
	// throw-away bundle).
	SecretsCreated bool
	// Changes lists files rewritten (Generate) or that would be (Plan).
	// Unchanged files are absent.
	Changes []FileChange
	// Bundle is the secrets bundle the configs were rendered with.
	Bundle *secrets.Bundle
	// Files keeps the files (GenerateOptions.Files): Changes name them as
	// kept, sealed or not.
	Files *sealed.Files
}

// RenderedFiles lists what Generate keeps in dir that exists in either
// form (plaintext or sealed), by plaintext path: the template configs, each
// node's config and the talosconfig. Each holds the bundle's keys or a
// credential signed by them.
func RenderedFiles(dir string) ([]string, error) {
	nodes, err := filepath.Glob(filepath.Join(dir, NodesDir, "*.yaml*"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range append([]string{filepath.Join(dir, ControlPlaneFile), filepath.Join(dir, WorkerFile), filepath.Join(dir, TalosconfigFile)}, nodes...) {
		p = strings.TrimSuffix(p, sealed.Suffix)
		if !strings.HasSuffix(p, ".yaml") && filepath.Base(p) != TalosconfigFile || slices.Contains(out, p) {
			continue
		}
		if _, _, err := sealed.Stored(p); err == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// Change returns the change to the file named by its plaintext path,
// kept sealed or not.
func (r *Result) Change(path string) (FileChange, bool) {
	kept := r.Files.Path(path)
	for _, c := range r.Changes {
		if c.Path == kept {
			return c, true
		}
	}
	return FileChange{}, false
}

// NodeConfigPath is where a node's rendered config lives.
func NodeConfigPath(dir, name string) string {
	return filepath.Join(dir, NodesDir, name+".yaml")
}

// Generate loads (or creates, once) the secrets bundle in opts.Dir, renders
// every config and writes those whose bytes changed. Unchanged inputs leave
// every file, and its mtime, untouched.
func Generate(opts GenerateOptions) (*Result, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	secretsPath := filepath.Join(opts.Dir, SecretsFile)
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", opts.Dir, err)
	}
	bundle, created, err := loadOrStoreSecrets(secretsPath, opts.Sealer, func() (*secrets.Bundle, error) {
		if opts.NewBundle != nil {
			return opts.NewBundle, nil
		}
		return NewSecrets(opts.TalosVersion, opts.Now(), opts.ECDSAServiceAccountKey)
	})
	if err != nil {
		return nil, err
	}
	if created {
		opts.Log.Info().Str("path", secretsPath).Msg("created the cluster secrets bundle (kept forever; back it up)")
	} else if kind := serviceAccountKeyKind(bundle); kind != "" && (kind == "ecdsa") != opts.ECDSAServiceAccountKey {
		// The bundle is never regenerated: say that the setting did not
		// take, rather than let the user believe it did.
		want := "rsa"
		if opts.ECDSAServiceAccountKey {
			want = "ecdsa"
		}
		opts.Log.Warn().Str("path", secretsPath).Msgf("cluster.serviceAccountKey is %s, but the cluster's secrets bundle holds an %s service account key: "+
			"a bundle is never regenerated (every node and token depends on it), so the setting applies to a new cluster only", want, strings.ToUpper(kind))
	}
	res, err := render(opts, bundle, secretsPath)
	if err != nil {
		return nil, err
	}
	res.SecretsCreated = created
	for _, f := range res.files() {
		written, err := opts.Files.WriteIfChanged(f.path, f.data)
		if err != nil {
			return nil, fmt.Errorf("writing %s: %w", opts.Files.Path(f.path), err)
		}
		if written {
			res.Changes = append(res.Changes, FileChange{Path: opts.Files.Path(f.path)})
			opts.Log.Debug().Str("path", opts.Files.Path(f.path)).Msg("wrote")
		}
	}
	return res, nil
}

// Plan renders like Generate but writes nothing. When no bundle exists yet
// it renders with a throw-away one and says so (SecretsCreated); the diffs
// against files on disk are then meaningless for certificates and tokens.
func Plan(opts GenerateOptions) (*Result, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	secretsPath := filepath.Join(opts.Dir, SecretsFile)
	bundle, err := LoadSecrets(secretsPath, opts.Sealer)
	created := false
	if errors.Is(err, fs.ErrNotExist) {
		bundle, err, created = opts.NewBundle, nil, true
		if bundle == nil {
			bundle, err = NewSecrets(opts.TalosVersion, opts.Now(), opts.ECDSAServiceAccountKey)
		}
	}
	if err != nil {
		return nil, err
	}
	res, err := render(opts, bundle, secretsPath)
	if err != nil {
		return nil, err
	}
	res.SecretsCreated = created
	if created {
		res.Changes = append(res.Changes, FileChange{Path: secretsPath, New: true})
	}
	for _, f := range res.files() {
		kept := opts.Files.Path(f.path)
		old, same, err := opts.Files.Compare(f.path, f.data)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			res.Changes = append(res.Changes, FileChange{Path: kept, New: true})
		case err != nil:
			return nil, fmt.Errorf("reading %s: %w", kept, err)
		case !same:
			// Same bytes in the other form (sealing switched on or off)
			// show no diff: only the form changes.
			diff := ""
			if filepath.Base(f.path) != TalosconfigFile {
				diff, err = textdiff.Diff(string(old), string(f.data))
				if err != nil {
					return nil, fmt.Errorf("diffing %s: %w", kept, err)
				}
			}
			res.Changes = append(res.Changes, FileChange{Path: kept, Diff: diff})
		}
	}
	return res, nil
}

type outFile struct {
	path string
	data []byte
}

func (r *Result) files() []outFile {
	out := []outFile{
		{filepath.Join(r.Dir, ControlPlaneFile), r.ControlPlane},
		{filepath.Join(r.Dir, WorkerFile), r.Worker},
	}
	for _, n := range r.Nodes {
		out = append(out, outFile{NodeConfigPath(r.Dir, n.Name), n.Config})
	}
	return append(out, outFile{filepath.Join(r.Dir, TalosconfigFile), r.Talosconfig})
}

func render(opts GenerateOptions, bundle *secrets.Bundle, secretsPath string) (*Result, error) {
	talosconfigPath := filepath.Join(opts.Dir, TalosconfigFile)
	existing, err := opts.Files.Read(talosconfigPath)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("reading %s: %w", talosconfigPath, err)
	}
	rendered, err := Render(opts, bundle, existing)
	if err != nil {
		return nil, err
	}
	return &Result{
		Rendered:        rendered,
		Dir:             opts.Dir,
		SecretsPath:     secretsPath,
		TalosconfigPath: opts.Files.Path(talosconfigPath),
		Bundle:          bundle,
		Files:           opts.Files,
	}, nil
}

// Render produces every config in memory from opts and the bundle. The
// talosconfig reuses the client certificate of existingTalosconfig when it
// is still good (see RenderTalosconfig), so re-rendering is byte-stable.
// Every rendered config is validated for metal; all failures are reported
// together, each with the node (or template) it belongs to.
func Render(opts GenerateOptions, bundle *secrets.Bundle, existingTalosconfig []byte) (*Rendered, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	formVersion := opts.TalosVersion
	if opts.ConfigVersion != "" {
		formVersion = opts.ConfigVersion
	}
	contract, err := config.ParseContractFromVersion(formVersion)
	if err != nil {
		return nil, fmt.Errorf("parsing Talos version %q: %w", formVersion, err)
	}
	cps := opts.ControlPlanes()
	var cpIPs []string
	for _, n := range cps {
		a, _ := NodeAddr(n.IP)
		cpIPs = append(cpIPs, a.String())
	}
	endpoint := opts.Endpoint
	if endpoint == "" {
		host := cpIPs[0]
		if opts.VIP != "" {
			host = opts.VIP
		}
		endpoint = "https://" + hostPort(host, "6443")
	}
	defaultDisk, err := InstallDiskForBus(opts.DefaultDiskBus)
	if err != nil {
		return nil, err
	}
	allowCP := len(opts.Workers()) == 0
	if opts.AllowSchedulingOnControlPlanes != nil {
		allowCP = *opts.AllowSchedulingOnControlPlanes
	}
	inputOpts := []generate.Option{
		generate.WithVersionContract(contract),
		generate.WithSecretsBundle(bundle),
		generate.WithInstallDisk(defaultDisk),
		generate.WithEndpointList(cpIPs),
		generate.WithAllowSchedulingOnControlPlanes(allowCP),
	}
	if opts.InstallImage != "" {
		inputOpts = append(inputOpts, generate.WithInstallImage(opts.InstallImage))
	}
	sans := slices.Clone(opts.CertSANs)
	if opts.VIP != "" && !strings.Contains(endpoint, opts.VIP) && !slices.Contains(sans, opts.VIP) {
		sans = append(sans, opts.VIP)
	}
	if len(sans) > 0 {
		inputOpts = append(inputOpts, generate.WithAdditionalSubjectAltNames(sans))
	}
	input, err := generate.NewInput(opts.ClusterName, endpoint, opts.KubernetesVersion, inputOpts...)
	if err != nil {
		return nil, fmt.Errorf("preparing config input: %w", err)
	}

	builtin, err := builtinPatches(contract, opts)
	if err != nil {
		return nil, err
	}
	global, err := loadPatchFiles(opts.Patches.Global)
	if err != nil {
		return nil, err
	}
	rolePatches := map[Role][]namedPatch{}
	if rolePatches[RoleControlPlane], err = loadPatchFiles(opts.Patches.ControlPlane); err != nil {
		return nil, err
	}
	if rolePatches[RoleWorker], err = loadPatchFiles(opts.Patches.Worker); err != nil {
		return nil, err
	}
	if err := refuseNewerKinds(contract, formVersion, slices.Concat(global, rolePatches[RoleControlPlane], rolePatches[RoleWorker])); err != nil {
		return nil, err
	}

	var verrs ValidationErrors
	roleConfigs := map[Role]config.Provider{}
	roleBytes := map[Role][]byte{}
	for _, r := range []Role{RoleControlPlane, RoleWorker} {
		t := machine.TypeControlPlane
		file := ControlPlaneFile
		if r == RoleWorker {
			t, file = machine.TypeWorker, WorkerFile
		}
		base, err := input.Config(t)
		if err != nil {
			return nil, fmt.Errorf("generating %s config: %w", r, err)
		}
		if base, err = typedCNI(contract, base, opts.CNI); err != nil {
			return nil, fmt.Errorf("generating %s config: %w", r, err)
		}
		if opts.WorkloadIsolationOff {
			if base, err = withoutDocument[*runtimecfg.SecurityProfileConfigV1Alpha1](base); err != nil {
				return nil, fmt.Errorf("generating %s config: %w", r, err)
			}
		}
		cfg, err := applyPatches(base, slices.Concat(builtin, global, rolePatches[r]))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		verrs = append(verrs, validateMetal(file, cfg)...)
		if roleBytes[r], err = encode(cfg); err != nil {
			return nil, fmt.Errorf("encoding %s: %w", file, err)
		}
		roleConfigs[r] = cfg
	}

	out := &Rendered{Endpoint: endpoint, ControlPlane: roleBytes[RoleControlPlane], Worker: roleBytes[RoleWorker]}
	for _, n := range opts.Nodes {
		nodeFiles, err := loadPatchFiles(n.Patches)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := refuseNewerKinds(contract, formVersion, nodeFiles); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		generated, patchBytes, disk, err := nodePatch(contract, opts, n)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		cfg, err := applyPatches(roleConfigs[n.Role], append(nodeFiles, generated))
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		verrs = append(verrs, validateMetal("node "+n.Name, cfg)...)
		data, err := encode(cfg)
		if err != nil {
			return nil, fmt.Errorf("encoding node %s config: %w", n.Name, err)
		}
		addr, _ := NodeAddr(n.IP)
		sum := sha256.Sum256(data)
		out.Nodes = append(out.Nodes, RenderedNode{
			Name: n.Name, Role: n.Role, IP: addr.String(), InstallDisk: disk,
			Config: data, Patch: patchBytes, SHA256: hex.EncodeToString(sum[:]),
		})
	}
	if len(verrs) > 0 {
		return nil, verrs
	}

	var nodes []string
	if len(cpIPs) > 0 {
		nodes = cpIPs[:1]
	}
	out.Talosconfig, err = RenderTalosconfig(bundle, opts.ClusterName, cpIPs, nodes, existingTalosconfig, opts.Now())
	if err != nil {
		return nil, err
	}
	return out, nil
}

func hostPort(host, port string) string {
	if a, err := netip.ParseAddr(host); err == nil && a.Is6() {
		return "[" + host + "]:" + port
	}
	return host + ":" + port
}

func encode(cfg config.Provider) ([]byte, error) {
	return cfg.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
}

// namedPatch is a loaded patch and where it came from, for error messages.
type namedPatch struct {
	source string
	patch  configpatcher.Patch
}

func loadPatchFiles(paths []string) ([]namedPatch, error) {
	out := make([]namedPatch, 0, len(paths))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("reading patch file %s: %w", p, err)
		}
		patch, err := configpatcher.LoadPatch(data)
		if err != nil {
			return nil, fmt.Errorf("loading patch file %s: %w", p, err)
		}
		out = append(out, namedPatch{source: "patch file " + p, patch: patch})
	}
	return out, nil
}

// applyPatches applies patches one at a time so a failure names its source.
func applyPatches(cfg config.Provider, patches []namedPatch) (config.Provider, error) {
	for _, p := range patches {
		out, err := configpatcher.Apply(configpatcher.WithConfig(cfg), []configpatcher.Patch{p.patch})
		if err != nil {
			return nil, fmt.Errorf("applying %s: %w", p.source, err)
		}
		if cfg, err = out.Config(); err != nil {
			return nil, fmt.Errorf("applying %s: %w", p.source, err)
		}
	}
	return cfg, nil
}

// builtinPatches are the v1alpha1 patches that set the CNI before Talos
// v1.14. From v1.14 on the same settings live in typed documents (see
// typedCNI) and the v1alpha1 fields must stay unset: a config holding
// cluster.network or cluster.proxy beside KubeNetworkConfig or
// KubeProxyConfig is refused (V1Alpha1ConflictValidate in machinery
// config/types/k8s network.go and proxy.go at v1.14.1).
func builtinPatches(contract *config.VersionContract, opts GenerateOptions) ([]namedPatch, error) {
	var out []namedPatch
	if contract.MultidocKubernetesConfigSupported() {
		return nil, nil
	}
	add := func(source, text string) error {
		p, err := configpatcher.LoadPatch([]byte(text))
		if err != nil {
			return fmt.Errorf("loading %s: %w", source, err)
		}
		out = append(out, namedPatch{source: source, patch: p})
		return nil
	}
	switch opts.CNI {
	case CNICilium:
		// Cilium is installed by the infra stage and replaces kube-proxy.
		if err := add("built-in patch (cni: cilium)", "cluster:\n  network:\n    cni:\n      name: none\n  proxy:\n    disabled: true\n"); err != nil {
			return nil, err
		}
	case CNINone:
		if err := add("built-in patch (cni: none)", "cluster:\n  network:\n    cni:\n      name: none\n"); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// typedCNI writes the CNI choice into the typed documents of a Talos v1.14+
// config (machinery's generator writes KubeFlannelCNIConfig and
// KubeProxyConfig there; config/generate/kubernetes.go at v1.14.1): without
// a KubeFlannelCNIConfig no CNI is deployed (v1alpha1_k8s_bridge.go
// K8sFlannelCNIConfig: the legacy path answers nil too when the CNI is not
// flannel), and Cilium replaces kube-proxy, so KubeProxyConfig says
// enabled: false. Older contracts are returned as they are: builtinPatches
// sets the v1alpha1 fields there.
func typedCNI(contract *config.VersionContract, base config.Provider, cni string) (config.Provider, error) {
	if !contract.MultidocKubernetesConfigSupported() || cni == CNIFlannel || cni == "" {
		return base, nil
	}
	docs := make([]configdoc.Document, 0, len(base.Documents()))
	for _, d := range base.Documents() {
		switch doc := d.(type) {
		case *k8s.KubeFlannelCNIConfigV1Alpha1:
			continue
		case *k8s.KubeProxyConfigV1Alpha1:
			if cni == CNICilium {
				doc = doc.DeepCopy()
				off := false
				doc.ProxyEnabled = &off
				d = doc
			}
		}
		docs = append(docs, d)
	}
	return container.New(docs...)
}

// kindsFrom114 are the config document kinds machinery v1.14 registers and
// v1.13.3 does not (registry.Register calls under config/types at both
// tags): a node older than v1.14 refuses a config holding one.
var kindsFrom114 = []string{
	"BGPInstanceConfig", "CRIBaseRuntimeSpecConfig", "CRICustomizationConfig", "ContainerConfig",
	"DiscoveryIdentityConfig", "DiscoveryServiceConfig", "EtcFileConfig", "FilesystemScrubConfig",
	"FilesystemTrimConfig", "HTTPProbeConfig", "ImageCacheConfig", "KernelModuleConfig",
	"KubeAPIServerCAConfig", "KubeAPIServerConfig", "KubeAdmissionControlConfig", "KubeAggregatorCAConfig",
	"KubeAuditPolicyConfig", "KubeAuthenticationConfig", "KubeAuthorizerConfig", "KubeClusterConfig",
	"KubeControllerManagerConfig", "KubeCoreDNSConfig", "KubeCredentialProviderConfig", "KubeEtcdEncryptionConfig",
	"KubeExternalManifestConfig", "KubeFlannelCNIConfig", "KubeInlineManifestConfig", "KubeNetworkConfig",
	"KubeNodeConfig", "KubePrismConfig", "KubeProxyConfig", "KubeSchedulerConfig",
	"KubeServiceAccountConfig", "KubeStaticPodConfig", "KubeTalosAPIAccessConfig", "KubeletConfig",
	"LVMLogicalVolumeConfig", "LVMVolumeGroupConfig", "RAIDArrayConfig", "SecurityProfileConfig",
	"SysctlConfig", "SysfsConfig", "UdevRulesConfig", "UnattendedInstallConfig", "VethConfig",
}

// NewerKinds lists the documents of patch whose kind the contract's Talos
// does not know yet (only a strategic merge patch carries documents).
func NewerKinds(contract *config.VersionContract, patch configpatcher.Patch) []string {
	if contract.Greater(config.TalosVersion1_13) {
		return nil
	}
	smp, ok := patch.(configpatcher.StrategicMergePatch)
	if !ok {
		return nil
	}
	var out []string
	for _, d := range smp.Documents() {
		if slices.Contains(kindsFrom114, d.Kind()) && !slices.Contains(out, d.Kind()) {
			out = append(out, d.Kind())
		}
	}
	return out
}

// refuseNewerKinds names the first patch that writes a document the form
// being rendered does not have (config validate refuses it for the
// configured version already; this catches the older form a cluster keeps
// while it crosses into v1.14, where machinery's own validation would only
// name the rendered file).
func refuseNewerKinds(contract *config.VersionContract, formVersion string, patches []namedPatch) error {
	for _, p := range patches {
		if kinds := NewerKinds(contract, p.patch); len(kinds) > 0 {
			return fmt.Errorf("%s writes %s, which the Talos %s config form does not have (the document kinds came with Talos v1.14)",
				p.source, strings.Join(kinds, ", "), formVersion)
		}
	}
	return nil
}

// withoutDocument is base without its documents of type D.
func withoutDocument[D configdoc.Document](base config.Provider) (config.Provider, error) {
	docs := make([]configdoc.Document, 0, len(base.Documents()))
	for _, d := range base.Documents() {
		if _, ok := d.(D); !ok {
			docs = append(docs, d)
		}
	}
	return container.New(docs...)
}

// ConfigVersionFor is the Talos version whose config form a cluster heading
// for target gets while its configured nodes run running (one version per
// node): target's own (""), unless target writes the typed documents of
// v1.14 and a node still runs an older Talos, which refuses every one of
// them ("not registered": config/internal/registry/registry.go at v1.13.3).
// Then it is the oldest version a node runs, whose v1alpha1 form every
// node takes: v1.14 still reads it (the conflict check only refuses a
// v1alpha1 field beside its document). The stage renders that form until
// the last node is upgraded, then the target's.
func ConfigVersionFor(target string, running []string) (string, error) {
	want, err := config.ParseContractFromVersion(target)
	if err != nil {
		return "", fmt.Errorf("parsing Talos version %q: %w", target, err)
	}
	if !want.MultidocKubernetesConfigSupported() {
		return "", nil
	}
	oldest, oldestContract := "", want
	for _, v := range running {
		c, err := config.ParseContractFromVersion(v)
		if err != nil {
			continue // what no node reports says nothing of its form
		}
		if !c.MultidocKubernetesConfigSupported() && (oldest == "" || !c.Greater(oldestContract)) {
			oldest, oldestContract = v, c
		}
	}
	return oldest, nil
}

// nodePatch builds the documents that make a role config this node's:
// install disk and image, hostname, static address, resolvers and, on
// control planes, the shared VIP. It uses the multi-document network
// configs of Talos 1.12+, not the deprecated machine.network, and from
// v1.14 the UnattendedInstallConfig document, not machine.install (the two
// are refused together: UnattendedInstallConfigV1Alpha1.V1Alpha1ConflictValidate,
// machinery config/types/runtime/unattended_install.go at v1.14.1).
func nodePatch(contract *config.VersionContract, opts GenerateOptions, n Node) (namedPatch, []byte, string, error) {
	disk := n.InstallDisk
	if disk == "" {
		bus := n.DiskBus
		if bus == "" {
			bus = opts.DefaultDiskBus
		}
		var err error
		if disk, err = InstallDiskForBus(bus); err != nil {
			return namedPatch{}, nil, "", err
		}
	}
	prefix, err := nodePrefix(n.IP, opts.Network.PrefixLen)
	if err != nil {
		return namedPatch{}, nil, "", err
	}

	var docs []configdoc.Document
	if contract.UnattendedInstallConfig() {
		install, err := unattendedInstall(disk, opts.installImageOf(n))
		if err != nil {
			return namedPatch{}, nil, "", err
		}
		docs = append(docs, install)
	} else {
		docs = append(docs, &v1alpha1.Config{
			MachineConfig: &v1alpha1.MachineConfig{
				MachineInstall: &v1alpha1.InstallConfig{InstallDisk: disk, InstallImage: opts.installImageOf(n)}, //nolint:staticcheck // the form before v1.14
			},
		})
	}

	hostname := network.NewHostnameConfigV1Alpha1()
	off := nethelpers.AutoHostnameKindOff
	hostname.ConfigAuto = &off
	hostname.ConfigHostname = n.Name
	docs = append(docs, hostname)

	linkName := opts.Network.Interface
	if n.MAC != "" {
		// Interface names differ between kernels and NIC models; the MAC
		// Proxmox assigned does not.
		expr, err := cel.ParseBooleanExpression(
			fmt.Sprintf("mac(link.permanent_addr) == %q", strings.ToLower(n.MAC)), celenv.LinkLocator())
		if err != nil {
			return namedPatch{}, nil, "", fmt.Errorf("link selector for MAC %s: %w", n.MAC, err)
		}
		alias := network.NewLinkAliasConfigV1Alpha1(LinkAliasName)
		alias.Selector.Match = expr
		docs = append(docs, alias)
		linkName = LinkAliasName
	}
	link := network.NewLinkConfigV1Alpha1(linkName)
	link.LinkAddresses = []network.AddressConfig{{AddressAddress: prefix}}
	if opts.Network.Gateway != "" {
		gw := netip.MustParseAddr(opts.Network.Gateway)
		link.LinkRoutes = []network.RouteConfig{{RouteGateway: meta.Addr{Addr: gw}}}
	}
	docs = append(docs, link)

	if n.Role == RoleControlPlane && opts.VIP != "" {
		vip := network.NewLayer2VIPConfigV1Alpha1(opts.VIP)
		vip.LinkName = linkName
		docs = append(docs, vip)
	}
	if len(opts.Network.Nameservers) > 0 {
		resolver := network.NewResolverConfigV1Alpha1()
		for _, ns := range opts.Network.Nameservers {
			resolver.ResolverNameservers = append(resolver.ResolverNameservers,
				network.NameserverConfig{Address: meta.Addr{Addr: netip.MustParseAddr(ns)}})
		}
		docs = append(docs, resolver)
	}
	volumes, err := userVolumeDocs(n.UserVolumes)
	if err != nil {
		return namedPatch{}, nil, "", err
	}
	docs = append(docs, volumes...)
	if n.EncryptTPM {
		docs = append(docs, tpmEncryptedVolumes()...)
	}

	c, err := container.New(docs...)
	if err != nil {
		return namedPatch{}, nil, "", fmt.Errorf("building node patch: %w", err)
	}
	text, err := encode(c)
	if err != nil {
		return namedPatch{}, nil, "", fmt.Errorf("encoding node patch: %w", err)
	}
	return namedPatch{source: "generated node patch", patch: configpatcher.NewStrategicMergePatch(c)}, text, disk, nil
}

// unattendedInstall is the install disk and image of a v1.14+ node, in the
// form machinery's generator writes them (config/generate/init.go
// unattendedInstallConfig at v1.14.1): the disk selected by its device path,
// wipe off.
func unattendedInstall(disk, image string) (*runtimecfg.UnattendedInstallConfigV1Alpha1, error) {
	expr, err := cel.ParseBooleanExpression(fmt.Sprintf("disk.dev_path == %q", disk), celenv.DiskLocator())
	if err != nil {
		return nil, fmt.Errorf("install disk selector for %s: %w", disk, err)
	}
	u := runtimecfg.NewUnattendedInstallConfigV1Alpha1()
	u.Installer.Image = image
	wipe := false
	u.ProvisioningSpec.Wipe = &wipe
	u.ProvisioningSpec.DiskSelector.Match = expr
	return u, nil
}

// configImage is the image a config names for a Kubernetes component
// (Kubelet, KubeAPIServer, KubeControllerManager, KubeScheduler), "" when
// it names none. The container's accessors answer from the typed documents
// of Talos v1.14 (KubeletConfig, KubeAPIServerConfig…) or from the v1alpha1
// fields before (config/container/container.go at machinery v1.14.1).
func configImage(cfg config.Provider, component string) string {
	var c interface{ Image() string }
	switch component {
	case Kubelet:
		if k := cfg.K8sKubeletConfig(); k != nil {
			c = k
		}
	case KubeAPIServer:
		if a := cfg.K8sAPIServerConfig(); a != nil {
			c = a
		}
	case KubeControllerManager:
		if m := cfg.K8sControllerManagerConfig(); m != nil {
			c = m
		}
	case KubeScheduler:
		if s := cfg.K8sSchedulerConfig(); s != nil {
			c = s
		}
	}
	if c == nil {
		return ""
	}
	return c.Image()
}

// DefaultDNSDomain is the cluster's DNS domain unless a patch changes it
// (machinery constants at v1.14.1).
const DefaultDNSDomain = constants.DefaultDNSDomain

// DNSDomain reads the cluster's DNS domain (cluster.network.dnsDomain,
// cluster.local unless a patch changes it) from the rendered config of
// node in dir, kept by files.
func DNSDomain(files *sealed.Files, dir, node string) (string, error) {
	cfg, err := renderedConfig(files, dir, node)
	if err != nil {
		return "", err
	}
	// K8sNetworkConfig answers from KubeNetworkConfig (v1.14+) or from
	// cluster.network (container.go at machinery v1.14.1).
	if n := cfg.K8sNetworkConfig(); n != nil {
		return n.DNSDomain(), nil
	}
	return DefaultDNSDomain, nil
}

// renderedConfig loads the rendered config of node from dir.
func renderedConfig(files *sealed.Files, dir, node string) (config.Provider, error) {
	data, err := files.Read(NodeConfigPath(dir, node))
	if err != nil {
		return nil, fmt.Errorf("reading the rendered config of %s: %w", node, err)
	}
	cfg, err := configloader.NewFromBytes(data)
	if err != nil {
		return nil, fmt.Errorf("reading the rendered config of %s: %w", node, err)
	}
	return cfg, nil
}

// KubePrismPort reads the rendered configs of the named nodes from dir
// (kept by files) and
// returns the KubePrism port they all serve the API on, or 0 when any of
// them has KubePrism off or a different port (a user patch can change
// either): callers then fall back to the cluster endpoint.
func KubePrismPort(files *sealed.Files, dir string, nodes []string) (int, error) {
	port := 0
	for i, name := range nodes {
		cfg, err := renderedConfig(files, dir, name)
		if err != nil {
			return 0, err
		}
		// KubePrismConfig (v1.14+) or machine.features.kubePrism; nil when
		// off (v1alpha1_k8s_bridge.go K8sKubePrismConfig at v1.14.1).
		kp := cfg.K8sKubePrismConfig()
		if kp == nil {
			return 0, nil
		}
		if i > 0 && kp.Port() != port {
			return 0, nil
		}
		port = kp.Port()
	}
	return port, nil
}
