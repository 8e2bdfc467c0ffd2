package talos

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"go.yaml.in/yaml/v3"

	"github.com/homelab/bootstrap/internal/fsutil"
)

// SecretsFile is the secrets bundle's name inside the cluster directory.
const SecretsFile = "secrets.yaml"

// LoadSecrets reads and validates the bundle at path. It reports
// fs.ErrNotExist (wrapped) when there is none yet.
func LoadSecrets(path string) (*secrets.Bundle, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("reading secrets bundle: %w", err)
	}
	b, err := secrets.LoadBundle(path)
	if err != nil {
		return nil, fmt.Errorf("reading secrets bundle %s: %w", path, err)
	}
	if err := b.Validate(); err != nil {
		return nil, fmt.Errorf("secrets bundle %s is invalid: %w", path, err)
	}
	if b.Certs == nil || b.Certs.OS == nil || b.Certs.K8s == nil || b.Certs.Etcd == nil {
		return nil, fmt.Errorf("secrets bundle %s lacks a CA (os, k8s or etcd)", path)
	}
	return b, nil
}

// NewSecrets mints a bundle for the Talos version's config contract. The
// CAs' validity starts at now.
func NewSecrets(talosVersion string, now time.Time) (*secrets.Bundle, error) {
	contract, err := config.ParseContractFromVersion(talosVersion)
	if err != nil {
		return nil, fmt.Errorf("parsing Talos version %q: %w", talosVersion, err)
	}
	b, err := secrets.NewBundle(secrets.NewFixedClock(now), contract)
	if err != nil {
		return nil, fmt.Errorf("generating secrets bundle: %w", err)
	}
	return b, nil
}

// EncodeSecrets serialises a bundle the way `talosctl gen secrets` does.
func EncodeSecrets(b *secrets.Bundle) ([]byte, error) {
	out, err := yaml.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("encoding secrets bundle: %w", err)
	}
	return out, nil
}

// LoadOrCreateSecrets returns the cluster's bundle at path, creating it
// (mode 0600, write-once) when absent. A second bundle would orphan every
// node configured with the first, so an existing file is never replaced,
// even if it fails to load: that is an error for a human to look at.
func LoadOrCreateSecrets(path, talosVersion string, now time.Time) (b *secrets.Bundle, created bool, err error) {
	return loadOrStoreSecrets(path, func() (*secrets.Bundle, error) { return NewSecrets(talosVersion, now) })
}

// loadOrStoreSecrets is LoadOrCreateSecrets with the new bundle from fresh.
func loadOrStoreSecrets(path string, fresh func() (*secrets.Bundle, error)) (b *secrets.Bundle, created bool, err error) {
	b, err = LoadSecrets(path)
	if err == nil {
		return b, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, err
	}
	b, err = fresh()
	if err != nil {
		return nil, false, err
	}
	data, err := EncodeSecrets(b)
	if err != nil {
		return nil, false, err
	}
	if err := fsutil.WriteNew(path, data, 0o600); err != nil {
		if errors.Is(err, fsutil.ErrExists) {
			// Lost a race with another writer: theirs is the bundle now.
			b, err = LoadSecrets(path)
			return b, false, err
		}
		return nil, false, fmt.Errorf("writing secrets bundle: %w", err)
	}
	// Reload what was written so callers always work from the stored bytes.
	b, err = LoadSecrets(path)
	if err != nil {
		return nil, false, err
	}
	return b, true, nil
}

// SecretValues lists the bundle's secret values in the forms they take in
// rendered configs (tokens as is, private keys base64-encoded), for a
// redaction set: a config diff's context lines must never show them.
func SecretValues(b *secrets.Bundle) []string {
	if b == nil {
		return nil
	}
	var out []string
	add := func(v string) {
		if v != "" {
			out = append(out, v)
		}
	}
	if b.Secrets != nil {
		add(b.Secrets.BootstrapToken)
		add(b.Secrets.SecretboxEncryptionSecret)
		add(b.Secrets.AESCBCEncryptionSecret)
	}
	if b.TrustdInfo != nil {
		add(b.TrustdInfo.Token)
	}
	if b.Cluster != nil {
		add(b.Cluster.Secret)
	}
	if c := b.Certs; c != nil {
		for _, kp := range []*x509.PEMEncodedCertificateAndKey{c.Etcd, c.K8s, c.K8sAggregator, c.OS} {
			if kp != nil && len(kp.Key) > 0 {
				add(base64.StdEncoding.EncodeToString(kp.Key))
			}
		}
		if c.K8sServiceAccount != nil && len(c.K8sServiceAccount.Key) > 0 {
			add(base64.StdEncoding.EncodeToString(c.K8sServiceAccount.Key))
		}
	}
	return out
}
