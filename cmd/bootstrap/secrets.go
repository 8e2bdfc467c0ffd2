package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/sops"
	"github.com/homelab/bootstrap/stages"
	"github.com/homelab/bootstrap/talos"
)

// SecretsCmd groups the commands on the cluster's secrets bundle.
type SecretsCmd struct {
	Encrypt SecretsEncryptCmd `cmd:"" help:"Store .talos/<cluster>/secrets.yaml SOPS-encrypted to secrets.age.recipients (the plaintext is kept as a .bak first; no secret is regenerated), and the rendered configs, talosconfig and kubeconfig age-encrypted (.age)."`
}

// SecretsEncryptCmd is `bootstrap secrets encrypt`.
type SecretsEncryptCmd struct{}

// Run migrates the bundle under the cluster lock.
func (s *SecretsEncryptCmd) Run(ctx context.Context, a *App) error {
	cfg, err := a.loadConfig()
	if err != nil {
		return err
	}
	age := cfg.Secrets.Age
	if len(age.Recipients) == 0 {
		return config.Userf("secrets.age.recipients is empty: add the age public key(s) (age1…) to encrypt the bundle to")
	}
	sess, err := a.lockAndLog(cfg, secretsOf(cfg))
	if err != nil {
		return err
	}
	defer sess.Close()
	path := cfg.Paths().Secrets
	sealer := &sops.FileSealer{Recipients: age.Recipients, KeyFile: cfg.Resolve(age.KeyFile), Path: path, Now: a.now}
	backup, done, err := talos.EncryptSecrets(path, sealer, a.now())
	if err != nil {
		return err
	}
	if !done {
		fmt.Fprintf(a.Stdout, "%s is already SOPS-encrypted\n", path)
	} else {
		ids, _ := sealer.Identities()
		fmt.Fprintf(a.Stdout, "%s is now SOPS-encrypted to %s (read back with %s).\n", path, strings.Join(age.Recipients, ", "), ids.Source)
		fmt.Fprintf(a.Stdout, "The plaintext was kept as %s (0600): delete it (shred -u) once the encrypted bundle is committed or backed up.\n", backup)
	}
	// The rendered configs, talosconfig and kubeconfig hold the same keys
	// (or credentials they sign): they are derived, so they are replaced
	// without a plaintext copy; the bundle renders them again.
	sealed, err := stages.SealKeptFiles(cfg)
	for _, p := range sealed {
		fmt.Fprintf(a.Stdout, "%s: age-encrypted, the plaintext removed\n", p)
	}
	if err != nil {
		return err
	}
	if !done && len(sealed) == 0 {
		fmt.Fprintln(a.Stdout, "Nothing to do: the configs, talosconfig and kubeconfig are age-encrypted too.")
	}
	return nil
}
