package flux

import (
	"fmt"
	"time"

	kustomizev1 "github.com/fluxcd/kustomize-controller/api/v1"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/homelab/bootstrap/kube"
)

// SyncOptions describe the GitRepository and Kustomization.
type SyncOptions struct {
	Name      string
	Namespace string
	URL       string
	Branch    string
	Path      string
	Interval  time.Duration
	// SecretName refers to a Secret with the repository's credentials;
	// empty for an anonymous source (no secretRef at all: an empty one
	// makes source-controller look for a Secret named "").
	SecretName string
	// DecryptionSecret, when set, names the Secret holding the age
	// identity kustomize-controller decrypts SOPS files with
	// (DecryptionSecret); the Kustomization gets decryption provider sops.
	DecryptionSecret string
}

// SyncObjects returns the GitRepository and the Kustomization that applies
// Path from it, built from Flux's API types.
func SyncObjects(o SyncOptions) ([]*unstructured.Unstructured, error) {
	repo := &sourcev1.GitRepository{
		TypeMeta:   metav1.TypeMeta{APIVersion: sourcev1.GroupVersion.String(), Kind: sourcev1.GitRepositoryKind},
		ObjectMeta: metav1.ObjectMeta{Name: o.Name, Namespace: o.Namespace},
		Spec: sourcev1.GitRepositorySpec{
			URL:       o.URL,
			Interval:  metav1.Duration{Duration: o.Interval},
			Reference: &sourcev1.GitRepositoryRef{Branch: o.Branch},
		},
	}
	if o.SecretName != "" {
		repo.Spec.SecretRef = &meta.LocalObjectReference{Name: o.SecretName}
	}
	ks := &kustomizev1.Kustomization{
		TypeMeta:   metav1.TypeMeta{APIVersion: kustomizev1.GroupVersion.String(), Kind: kustomizev1.KustomizationKind},
		ObjectMeta: metav1.ObjectMeta{Name: o.Name, Namespace: o.Namespace},
		Spec: kustomizev1.KustomizationSpec{
			Interval:  metav1.Duration{Duration: o.Interval},
			Path:      o.Path,
			Prune:     true,
			SourceRef: kustomizev1.CrossNamespaceSourceReference{Kind: sourcev1.GitRepositoryKind, Name: o.Name},
		},
	}
	if o.DecryptionSecret != "" {
		ks.Spec.Decryption = &kustomizev1.Decryption{Provider: DecryptionProviderSOPS, SecretRef: &meta.LocalObjectReference{Name: o.DecryptionSecret}}
	}
	var out []*unstructured.Unstructured
	for _, obj := range []runtime.Object{repo, ks} {
		u, err := kube.ApplyObject(obj)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

// Credentials for a private repository. Exactly one kind is set.
type Credentials struct {
	// SSHKey (and KnownHosts) for ssh:// URLs.
	SSHKey     []byte
	KnownHosts []byte
	// Username and Token for https:// URLs.
	Username string
	Token    string
	// CA is the PEM certificate (or CA) an https:// server must chain to,
	// for a server with a private CA or a self-signed certificate; written
	// as ca.crt, which source-controller reads (fluxcd/pkg/git options.go).
	CA []byte
}

// AuthSecret returns the Secret source-controller reads credentials from.
func AuthSecret(name, namespace string, c Credentials) (*unstructured.Unstructured, error) {
	data := map[string][]byte{}
	switch {
	case len(c.SSHKey) > 0:
		// source-controller refuses an SSH identity without known_hosts
		// (fluxcd/pkg/git AuthOptions.Validate): never write one it cannot use.
		if len(c.KnownHosts) == 0 {
			return nil, fmt.Errorf("an SSH deploy key needs known_hosts: source-controller refuses SSH without them")
		}
		data["identity"], data["known_hosts"] = c.SSHKey, c.KnownHosts
	case c.Token != "":
		user := c.Username
		if user == "" {
			user = "git"
		}
		data["username"], data["password"] = []byte(user), []byte(c.Token)
		if len(c.CA) > 0 {
			data["ca.crt"] = c.CA
		}
	default:
		return nil, fmt.Errorf("no credentials given")
	}
	return opaqueSecret(name, namespace, data)
}

// opaqueSecret is an Opaque Secret ready to apply.
func opaqueSecret(name, namespace string, data map[string][]byte) (*unstructured.Unstructured, error) {
	return kube.ApplyObject(&corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Type: corev1.SecretTypeOpaque, Data: data})
}

// DecryptionProviderSOPS is the Kustomization's decryption provider for
// SOPS (internal/decryptor at fluxcd/kustomize-controller v1.9.5).
const DecryptionProviderSOPS = "sops"

// DecryptionAgeKey is the key under which DecryptionSecret stores the age
// identity: kustomize-controller imports only data keys ending in .agekey
// as age identities (DecryptionAgeExt, internal/decryptor/decryptor.go at
// v1.9.5), so a key named age.txt or identity is silently ignored.
const DecryptionAgeKey = "identity.agekey"

// DecryptionSecretName is the Secret's name Flux's documentation uses.
const DecryptionSecretName = "sops-age"

// DecryptionSecret returns the Secret kustomize-controller reads the age
// identity from.
func DecryptionSecret(name, namespace string, identity []byte) (*unstructured.Unstructured, error) {
	if len(identity) == 0 {
		return nil, fmt.Errorf("no age identity for the decryption Secret")
	}
	return opaqueSecret(name, namespace, map[string][]byte{DecryptionAgeKey: identity})
}
