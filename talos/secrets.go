package talos

import (
	"encoding/base64"
	"encoding/pem"
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
	"github.com/homelab/bootstrap/sops"
)

// SecretsFile is the secrets bundle's name inside the cluster directory.
const SecretsFile = "secrets.yaml"

// Sealer keeps the secrets bundle encrypted at rest (SOPS with age): the
// stored bytes are Seal's, and only Open's plaintext is ever decoded, in
// memory. A nil Sealer keeps the bundle as plaintext YAML (mode 0600).
type Sealer interface {
	// Seal returns the bytes to store for a plaintext bundle.
	Seal(plain []byte) ([]byte, error)
	// Open returns the plaintext of stored bytes, decrypting them when
	// they are encrypted and passing plaintext through.
	Open(stored []byte) ([]byte, error)
}

// LoadSecrets reads and validates the bundle at path, opening it with s
// (nil: a plaintext bundle). It reports fs.ErrNotExist (wrapped) when there
// is none yet.
func LoadSecrets(path string, s Sealer) (*secrets.Bundle, error) {
	stored, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading secrets bundle: %w", err)
	}
	plain := stored
	switch {
	case s != nil:
		if plain, err = s.Open(stored); err != nil {
			// %v: whatever failed, the bundle exists; it must never
			// look absent (fs.ErrNotExist) and be minted again.
			return nil, fmt.Errorf("opening secrets bundle %s: %v", path, err)
		}
	case sops.IsEncrypted(stored):
		return nil, fmt.Errorf("secrets bundle %s is SOPS-encrypted and no age identity is configured: set secrets.age (recipients and keyFile)", path)
	}
	b, err := decodeBundle(plain)
	if err != nil {
		return nil, fmt.Errorf("reading secrets bundle %s: %w", path, err)
	}
	// The contract only says whether Kubernetes is disabled (then the
	// Kubernetes secrets are not required: bundle.go Validate at machinery
	// v1.14.1); it never is here.
	if err := b.Validate(config.TalosVersionCurrent); err != nil {
		return nil, fmt.Errorf("secrets bundle %s is invalid: %w", path, err)
	}
	if b.Certs == nil || b.Certs.OS == nil || b.Certs.K8s == nil || b.Certs.Etcd == nil {
		return nil, fmt.Errorf("secrets bundle %s lacks a CA (os, k8s or etcd)", path)
	}
	return b, nil
}

// decodeBundle decodes a plaintext bundle as secrets.LoadBundle does
// (machinery config/generate/secrets at v1.14.1), from bytes: a decrypted
// bundle never touches the disk.
func decodeBundle(plain []byte) (*secrets.Bundle, error) {
	b := &secrets.Bundle{Clock: secrets.NewClock()}
	if err := yaml.Unmarshal(plain, b); err != nil {
		return nil, err
	}
	return b, nil
}

// NewSecrets mints a bundle for the Talos version's config contract. The
// CAs' validity starts at now.
func NewSecrets(talosVersion string, now time.Time, ecdsaServiceAccountKey bool) (*secrets.Bundle, error) {
	contract, err := config.ParseContractFromVersion(talosVersion)
	if err != nil {
		return nil, fmt.Errorf("parsing Talos version %q: %w", talosVersion, err)
	}
	var opts []secrets.Option
	if ecdsaServiceAccountKey {
		// The version contract's RSA-4096 key costs up to seconds of
		// prime search; machinery offers ECDSA for whoever prefers it
		// (secrets.WithECDSAServiceAccountKey, bundle.go at v1.14.1).
		opts = append(opts, secrets.WithECDSAServiceAccountKey())
	}
	b, err := secrets.NewBundle(secrets.NewFixedClock(now), contract, opts...)
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

// loadOrStoreSecrets returns the cluster's bundle at path, storing the one
// fresh makes (mode 0600, write-once) when absent. A second bundle would
// orphan every node configured with the first, so an existing file is
// never replaced, even if it fails to load: that is an error for a human
// to look at.
func loadOrStoreSecrets(path string, s Sealer, fresh func() (*secrets.Bundle, error)) (b *secrets.Bundle, created bool, err error) {
	b, err = LoadSecrets(path, s)
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
	if s != nil {
		if data, err = s.Seal(data); err != nil {
			return nil, false, fmt.Errorf("encrypting the new secrets bundle: %w", err)
		}
	}
	if err := fsutil.WriteNew(path, data, 0o600); err != nil {
		if errors.Is(err, fsutil.ErrExists) {
			// Lost a race with another writer: theirs is the bundle now.
			b, err = LoadSecrets(path, s)
			return b, false, err
		}
		return nil, false, fmt.Errorf("writing secrets bundle: %w", err)
	}
	// Reload what was written so callers always work from the stored bytes.
	b, err = LoadSecrets(path, s)
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

// EncryptSecrets migrates a plaintext bundle at path to the Sealer's
// encryption, never minting a secret: the plaintext is first kept as
// "<path>.bak-<UTC>" (0600), the sealed bytes are opened again and must
// decode to the same bundle, and only then replace the file, atomically.
// An already encrypted bundle is left alone (done false).
func EncryptSecrets(path string, s Sealer, now time.Time) (backup string, done bool, err error) {
	stored, err := os.ReadFile(path)
	if err != nil {
		return "", false, fmt.Errorf("reading secrets bundle: %w", err)
	}
	if sops.IsEncrypted(stored) {
		return "", false, nil
	}
	if s == nil {
		return "", false, errors.New("no age recipients to encrypt the bundle to")
	}
	b, err := LoadSecrets(path, nil)
	if err != nil {
		return "", false, err
	}
	want, err := EncodeSecrets(b)
	if err != nil {
		return "", false, err
	}
	sealed, err := s.Seal(stored)
	if err != nil {
		return "", false, fmt.Errorf("encrypting %s: %w", path, err)
	}
	if !sops.IsEncrypted(sealed) {
		return "", false, errors.New("no age recipients to encrypt the bundle to")
	}
	// Read back with the identity before anything changes: a bundle that
	// cannot be opened here is a cluster lost.
	opened, err := s.Open(sealed)
	if err != nil {
		return "", false, fmt.Errorf("the encrypted bundle could not be read back (nothing changed): %v", err)
	}
	back, err := decodeBundle(opened)
	if err != nil {
		return "", false, fmt.Errorf("the encrypted bundle does not decode (nothing changed): %v", err)
	}
	got, err := EncodeSecrets(back)
	if err != nil || string(got) != string(want) {
		return "", false, fmt.Errorf("the encrypted bundle reads back different (nothing changed): %v", err)
	}
	if backup, err = fsutil.Backup(path, now); err != nil {
		return "", false, fmt.Errorf("backing up %s: %w", path, err)
	}
	if err := fsutil.WriteAtomic(path, sealed, 0o600); err != nil {
		return backup, false, fmt.Errorf("writing the encrypted bundle: %w", err)
	}
	return backup, true, nil
}

// serviceAccountKeyKind is "rsa" or "ecdsa" for the bundle's service
// account key, read from its PEM block type (as siderolabs/crypto x509
// NewRSAKey and NewECDSAKey encode them); "" when it is neither.
func serviceAccountKeyKind(b *secrets.Bundle) string {
	if b == nil || b.Certs == nil || b.Certs.K8sServiceAccount == nil {
		return ""
	}
	block, _ := pem.Decode(b.Certs.K8sServiceAccount.Key)
	switch {
	case block == nil:
		return ""
	case block.Type == x509.PEMTypeRSAPrivate:
		return "rsa"
	case block.Type == x509.PEMTypeECPrivate:
		return "ecdsa"
	}
	return ""
}
