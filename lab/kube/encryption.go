package kube

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	"sigs.k8s.io/yaml"
)

// Encryption holds the keys a Talos control plane encrypts Secrets in
// etcd with: the secrets bundle's secretboxEncryptionSecret and, on
// clusters made before Talos v1.0, aescbcEncryptionSecret.
type Encryption struct {
	Secretbox string
	AESCBC    string
}

// EncryptionConfig renders the API server's --encryption-provider-config
// as Talos does (APIServerEncryptionConfig in
// internal/app/machined/pkg/controllers/k8s/internal/k8stemplates/apiserver.go
// at siderolabs/talos v1.13.3; the flag in control_plane_static_pod.go):
// Secrets only, secretbox as key2 first (new writes), then aescbc as key1,
// then identity so unencrypted data stays readable. nil without a key: the
// API server then stores Secrets as they are, as a config without keys
// would.
func EncryptionConfig(e Encryption) ([]byte, error) {
	if e.Secretbox == "" && e.AESCBC == "" {
		return nil, nil
	}
	var providers []apiserverv1.ProviderConfiguration
	if e.Secretbox != "" {
		providers = append(providers, apiserverv1.ProviderConfiguration{Secretbox: &apiserverv1.SecretboxConfiguration{
			Keys: []apiserverv1.Key{{Name: "key2", Secret: e.Secretbox}}}})
	}
	if e.AESCBC != "" {
		providers = append(providers, apiserverv1.ProviderConfiguration{AESCBC: &apiserverv1.AESConfiguration{
			Keys: []apiserverv1.Key{{Name: "key1", Secret: e.AESCBC}}}})
	}
	providers = append(providers, apiserverv1.ProviderConfiguration{Identity: &apiserverv1.IdentityConfiguration{}})
	cfg := apiserverv1.EncryptionConfiguration{
		// The canonical group form. Talos's template sets Kind
		// EncryptionConfig and apiVersion "v1"; whether the lab's API server
		// loads that exact form is unverified here, and it decides nothing
		// about what is stored.
		TypeMeta:  metav1.TypeMeta{Kind: "EncryptionConfiguration", APIVersion: apiserverv1.SchemeGroupVersion.String()},
		Resources: []apiserverv1.ResourceConfiguration{{Resources: []string{"secrets"}, Providers: providers}},
	}
	return yaml.Marshal(cfg)
}
