// Package config loads, checks and describes bootstrap.yaml: strict decoding
// with file:line, the old script's environment overrides, semantic
// validation with field paths, a JSON Schema and a commented example.
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"reflect"

	"go.yaml.in/yaml/v3"

	"github.com/homelab/bootstrap/internal/sealed"
)

// DefaultFile is the config file used when --config is not given.
const DefaultFile = "bootstrap.yaml"

// Environment variables read by Load. The names are the old script's.
const (
	EnvClusterName   = "TALOS_CLUSTER_NAME"
	EnvTalosDir      = "TALOS_CONFIG_DIR"
	EnvKubeconfig    = "TALOS_KUBECONFIG"
	EnvLocalSnapshot = "USE_LOCAL_GIT_SNAPSHOT"
	EnvGitRepo       = "GIT_REPO"
	EnvGitBranch     = "GIT_BRANCH"
	EnvTokenSecret   = "PROXMOX_TOKEN_SECRET"
	// EnvS3AccessKey and EnvS3SecretKey are backup.s3's credentials, the
	// names every S3 client reads.
	EnvS3AccessKey = "AWS_ACCESS_KEY_ID"
	EnvS3SecretKey = "AWS_SECRET_ACCESS_KEY"
)

// Config's unexported bookkeeping lives in source: where the file is, where
// each field sits in it, which values came from the environment.
type source struct {
	file      string
	base      string
	positions map[string]pos
	fromEnv   map[string]string
	warnings  []*FieldError
	// talosDirOverride is TALOS_CONFIG_DIR: the cluster's Talos directory itself.
	talosDirOverride string
	tokenSecretEnv   string
	// env is the environment the config was read with: validate looks
	// up age identities where the sops CLI does.
	env LookupEnv
	// merged is the document after every base was applied (extends.go),
	// files the chain it came from, the loaded file first.
	merged *yaml.Node
	files  []string
}

// LookupEnv reads one environment variable; os.LookupEnv in production.
type LookupEnv func(string) (string, bool)

// Load reads, decodes, overrides from env and validates the config at path.
// Problems come back as *Errors (a user error: exit 2); warnings are kept
// on the config (Warnings). Load never changes anything on disk.
func Load(path string, env LookupEnv) (*Config, error) {
	if env == nil {
		env = os.LookupEnv
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Userf("config file %s not found: write an example with `bootstrap config init --output %s`, or pass --config", path, path)
	}
	if err != nil {
		return nil, &UserError{Err: fmt.Errorf("reading config: %w", err)}
	}
	cfg, err := Parse(path, data, env)
	if err != nil {
		return cfg, err
	}
	return cfg, cfg.validate()
}

// Parse decodes data (named path in messages) onto the defaults and applies
// environment overrides, without semantic validation.
func Parse(path string, data []byte, env LookupEnv) (*Config, error) {
	if env == nil {
		env = os.LookupEnv
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, &UserError{Err: err}
	}
	cfg := Default()
	cfg.src = &source{file: path, base: filepath.Dir(abs), positions: map[string]pos{}, fromEnv: map[string]string{}, env: env}
	errs := &Errors{File: path}

	l, lerrs := layer(path, data, []string{abs})
	if len(lerrs) > 0 {
		errs.Items = append(errs.Items, lerrs...)
		errs.sortItems()
		return cfg, errs
	}
	root := l.root
	if len(root.Content) == 0 {
		errs.Items = append(errs.Items, &FieldError{File: path, Msg: "the file is empty: start from `bootstrap config init`"})
		return cfg, errs
	}
	cfg.src.merged, cfg.src.files = root, l.files
	d := &decoder{file: path, positions: cfg.src.positions, origin: l.origin}
	d.decode(root, reflect.ValueOf(cfg).Elem(), "")
	errs.Items = append(errs.Items, d.errs...)
	cfg.applyEnv(env, errs)
	if len(errs.Items) > 0 {
		cfg.maskMessages(errs)
		errs.sortItems()
		return cfg, errs
	}
	return cfg, nil
}

var yamlLine = regexp.MustCompile(`yaml: line (\d+):`)

func (c *Config) applyEnv(env LookupEnv, errs *Errors) {
	set := func(name string, dst *string, field string) {
		if v, ok := env(name); ok && v != "" {
			*dst = v
			c.src.fromEnv[field] = name
		}
	}
	set(EnvClusterName, &c.Cluster.Name, "cluster.name")
	set(EnvGitRepo, &c.Flux.Repo, "flux.repo")
	set(EnvGitBranch, &c.Flux.Branch, "flux.branch")
	set(EnvKubeconfig, &c.State.Kubeconfig, "state.kubeconfig")
	if v, ok := env(EnvTalosDir); ok && v != "" {
		c.src.talosDirOverride = v
		c.src.fromEnv["state.talosDir"] = EnvTalosDir
	}
	if v, ok := env(EnvLocalSnapshot); ok && v != "" {
		switch strings.ToLower(v) {
		case "1", "true", "yes", "on":
			c.Flux.LocalSnapshot.Enabled = true
		case "0", "false", "no", "off":
			c.Flux.LocalSnapshot.Enabled = false
		default:
			errs.Items = append(errs.Items, &FieldError{File: c.src.file, Path: "flux.localSnapshot.enabled",
				Msg: fmt.Sprintf("environment %s=%q is not a boolean: use 1 or 0", EnvLocalSnapshot, v)})
		}
		c.src.fromEnv["flux.localSnapshot.enabled"] = EnvLocalSnapshot
	}
	if v, ok := env(EnvTokenSecret); ok {
		c.src.tokenSecretEnv = v
	}
}

// File returns the path the config was loaded from.
func (c *Config) File() string { return c.src.file }

// Warnings returns the non-fatal problems validation found.
func (c *Config) Warnings() []*FieldError { return c.src.warnings }

// FromEnv reports which environment variable set the field at path, if any.
func (c *Config) FromEnv(path string) (string, bool) {
	v, ok := c.src.fromEnv[path]
	return v, ok
}

// Resolve turns a path from the config into an absolute one: "~/" is the
// home directory, relative paths are relative to the config file.
func (c *Config) Resolve(p string) string {
	if p == "" {
		return ""
	}
	if p == "~" || strings.HasPrefix(p, "~/") {
		if home, err := os.UserHomeDir(); err == nil {
			p = filepath.Join(home, strings.TrimPrefix(p[1:], "/"))
		}
	}
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	return filepath.Join(c.src.base, p)
}

// Paths are the resolved locations of everything the runner reads and writes.
type Paths struct {
	// Base is the directory of the config file.
	Base string
	// TalosDir is the cluster's generated Talos directory, .talos/<cluster>.
	TalosDir    string
	Secrets     string
	Talosconfig string
	Kubeconfig  string
	// StateDir is ai/state/<cluster>: state.json, the lock, runs, archives.
	StateDir string
}

// Paths resolves the config's locations.
func (c *Config) Paths() Paths {
	talosDir := c.Resolve(filepath.Join(c.State.TalosDir, c.Cluster.Name))
	if c.src.talosDirOverride != "" {
		talosDir = c.Resolve(c.src.talosDirOverride)
	}
	kube := filepath.Join(talosDir, "kubeconfig")
	if c.State.Kubeconfig != "" {
		kube = c.Resolve(c.State.Kubeconfig)
	}
	return Paths{
		Base:        c.src.base,
		TalosDir:    talosDir,
		Secrets:     filepath.Join(talosDir, "secrets.yaml"),
		Talosconfig: filepath.Join(talosDir, "talosconfig"),
		Kubeconfig:  kube,
		StateDir:    c.Resolve(filepath.Join(c.State.Dir, c.Cluster.Name)),
	}
}

// ProxmoxTokenSecret returns the API token secret from PROXMOX_TOKEN_SECRET
// or proxmox.tokenSecretFile. It is read only when a stage needs Proxmox.
func (c *Config) ProxmoxTokenSecret() (string, error) {
	if c.src.tokenSecretEnv != "" {
		return c.src.tokenSecretEnv, nil
	}
	if c.Proxmox.TokenSecretFile == "" {
		return "", Userf("no Proxmox API token secret: set %s or proxmox.tokenSecretFile", EnvTokenSecret)
	}
	b, err := os.ReadFile(c.Resolve(c.Proxmox.TokenSecretFile))
	if err != nil {
		return "", Userf("proxmox.tokenSecretFile: %v", err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", Userf("proxmox.tokenSecretFile %s is empty", c.Proxmox.TokenSecretFile)
	}
	return s, nil
}

// ControlPlanes returns the control-plane nodes in config order.
func (c *Config) ControlPlanes() []Node { return c.nodesWithRole(RoleControlPlane) }

// Workers returns the worker nodes in config order.
func (c *Config) Workers() []Node { return c.nodesWithRole(RoleWorker) }

func (c *Config) nodesWithRole(role string) []Node {
	var out []Node
	for _, n := range c.Nodes {
		if n.Role == role {
			out = append(out, n)
		}
	}
	return out
}

// Node roles.
const (
	RoleControlPlane = "controlplane"
	RoleWorker       = "worker"
)

func sortedCopy(in []string) []string {
	out := append([]string(nil), in...)
	sort.Strings(out)
	return out
}

// Protected lists the paths a git snapshot of a work tree must never
// serve, whatever its exclude patterns: the state and Talos directories of
// every cluster (state.dir, state.talosDir), this cluster's directories and
// kubeconfig when they are overridden, the backup copies, and every file
// holding a credential the config names (CredentialFiles). A snapshot
// leaves out a path inside its tree, everything under it and its
// "<path>.bak-*" backups.
func (c *Config) Protected() []string {
	p := c.Paths()
	out := []string{
		c.Resolve(c.State.Dir), c.Resolve(c.State.TalosDir), p.TalosDir, p.StateDir, p.Kubeconfig,
		// The kubeconfig as kept beside an encrypted secrets bundle.
		p.Kubeconfig + sealed.Suffix,
		c.Resolve(c.Backup.CopyDir),
	}
	for _, f := range c.CredentialFiles() {
		out = append(out, f.Path)
	}
	seen := map[string]bool{}
	kept := out[:0]
	for _, s := range out {
		if s != "" && !seen[s] {
			seen[s] = true
			kept = append(kept, s)
		}
	}
	return kept
}
