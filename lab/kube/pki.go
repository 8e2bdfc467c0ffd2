package kube

import (
	stdx509 "crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Admin certificate subject and lifetime, as Talos issues them.
const (
	adminCommonName   = "admin"
	adminOrganization = "system:masters"
	// AdminUser is the user name of the kubeconfigs Kubeconfig and
	// IssueKubeconfig issue.
	AdminUser = adminCommonName
	// LabAdminUser is the lab's own cluster-admin identity (its in-process
	// clients, AdminKubeconfigPath, the Flux controllers).
	LabAdminUser = "lab-admin"
	// AdminCertLifetime is Talos' default admin kubeconfig certificate lifetime.
	AdminCertLifetime = 365 * 24 * time.Hour
)

// PKI is the Kubernetes key material of a Talos cluster: the Kubernetes CA
// (certificate and key) and the service-account signing key, all PEM.
type PKI struct {
	CACertPEM            []byte
	CAKeyPEM             []byte
	ServiceAccountKeyPEM []byte
}

// PKIFromBundle takes the Kubernetes CA and service-account key out of a
// Talos secrets bundle.
func PKIFromBundle(b *secrets.Bundle) (PKI, error) {
	if b == nil || b.Certs == nil || b.Certs.K8s == nil || b.Certs.K8sServiceAccount == nil {
		return PKI{}, errors.New("secrets bundle has no Kubernetes CA or service-account key")
	}
	return PKI{
		CACertPEM:            b.Certs.K8s.Crt,
		CAKeyPEM:             b.Certs.K8s.Key,
		ServiceAccountKeyPEM: b.Certs.K8sServiceAccount.Key,
	}, nil
}

// OptionsFromMachineConfig fills the cluster identity of Options from a Talos
// control-plane machine config: cluster name, endpoint, extra API server
// SANs, the Kubernetes CA and service-account key, the service CIDR and
// whether workloads may run on control planes. Log, BinDir and the like are
// left for the caller.
func OptionsFromMachineConfig(cfg config.Config) (Options, error) {
	// The container's K8s accessors answer from the typed documents of
	// Talos v1.14 (KubeAPIServerCAConfig, KubeServiceAccountConfig,
	// KubeClusterConfig, KubeAPIServerConfig, KubeNodeConfig,
	// KubeNetworkConfig, KubeEtcdEncryptionConfig) or from the v1alpha1
	// cluster section before (config/container/container.go and
	// v1alpha1_k8s_bridge.go at machinery v1.14.1).
	if cfg == nil || cfg.K8sClusterConfig() == nil {
		return Options{}, errors.New("machine config has no cluster section")
	}
	var ca *x509.PEMEncodedCertificateAndKey
	if c := cfg.K8sAPIServerCAConfig(); c != nil {
		ca = c.IssuingCA()
	}
	var sa *x509.PEMEncodedKey
	if s := cfg.K8sServiceAccountConfig(); s != nil {
		sa = s.IssuingKey()
	}
	if ca == nil || len(ca.Key) == 0 || sa == nil || len(sa.Key) == 0 {
		return Options{}, errors.New("machine config carries no Kubernetes CA key or service-account key (not a control-plane config)")
	}
	cl := cfg.K8sClusterConfig()
	if cl.ClusterEndpoint() == nil {
		return Options{}, errors.New("machine config has no cluster endpoint")
	}
	opts := Options{
		ClusterName: cl.ClusterName(),
		Endpoint:    cl.ClusterEndpoint().String(),
		PKI:         PKI{CACertPEM: ca.Crt, CAKeyPEM: ca.Key, ServiceAccountKeyPEM: sa.Key},
		// Workloads run on control planes when their node config carries
		// no control-plane NoSchedule taint (the v1alpha1 bridge adds it
		// unless allowSchedulingOnControlPlanes; v1.14 lists it in
		// KubeNodeConfig).
		ScheduleOnControlPlanes: true,
		Encryption:              encryptionOf(cfg),
	}
	if a := cfg.K8sAPIServerConfig(); a != nil {
		opts.CertSANs = append([]string{}, a.CertSANs()...)
	}
	if n := cfg.K8sNodeConfig(); n != nil {
		if _, tainted := n.Taints()[constants.LabelNodeRoleControlPlane]; tainted {
			opts.ScheduleOnControlPlanes = false
		}
	}
	if n := cfg.K8sNetworkConfig(); n != nil && len(n.ServiceCIDRs()) > 0 {
		opts.ServiceCIDR = n.ServiceCIDRs()[0].String()
	}
	return opts, nil
}

// encryptionOf reads the secrets the API server encrypts with: the
// v1alpha1 cluster secrets before Talos v1.14; from v1.14 the keys of the
// KubeEtcdEncryptionConfig document, where machinery's generator writes
// the secretbox secret as key "key2" and an older bundle's AES-CBC secret
// as "key1" (config/generate/kubernetes.go at v1.14.1).
func encryptionOf(cfg config.Config) Encryption {
	var enc Encryption
	if c := cfg.Cluster(); c != nil {
		enc = Encryption{Secretbox: c.SecretboxEncryptionSecret(), AESCBC: c.AESCBCEncryptionSecret()}
	}
	if enc.Secretbox != "" || enc.AESCBC != "" {
		return enc
	}
	e := cfg.K8sEtcdEncryptionConfig()
	if e == nil {
		return enc
	}
	resources, _ := e.EtcdEncryptionConfig()["resources"].([]any)
	for _, r := range resources {
		rm, _ := r.(map[string]any)
		providers, _ := rm["providers"].([]any)
		for _, p := range providers {
			pm, _ := p.(map[string]any)
			for _, kind := range []string{"secretbox", "aescbc"} {
				km, _ := pm[kind].(map[string]any)
				keys, _ := km["keys"].([]any)
				for _, k := range keys {
					kk, _ := k.(map[string]any)
					secret, _ := kk["secret"].(string)
					switch kk["name"] {
					case "key2":
						enc.Secretbox = secret
					case "key1":
						enc.AESCBC = secret
					}
				}
			}
		}
	}
	return enc
}

// IssueKubeconfig returns an admin kubeconfig the way Talos issues one: a
// client certificate with CN=admin, O=system:masters signed by the
// Kubernetes CA, a cluster named clusterName at server, a user
// "admin@<cluster>" and a context "admin@<cluster>" in namespace default.
func IssueKubeconfig(clusterName, server string, caCertPEM, caKeyPEM []byte, lifetime time.Duration) ([]byte, error) {
	if lifetime <= 0 {
		lifetime = AdminCertLifetime
	}
	return issueKubeconfig(clusterName, server, caCertPEM, caKeyPEM, adminCommonName, []string{adminOrganization}, lifetime)
}

func issueKubeconfig(clusterName, server string, caCertPEM, caKeyPEM []byte, cn string, orgs []string, lifetime time.Duration) ([]byte, error) {
	if _, err := url.Parse(server); err != nil {
		return nil, fmt.Errorf("issuing kubeconfig: bad server URL %q: %w", server, err)
	}
	ca, err := x509.NewCertificateAuthorityFromCertificateAndKey(&x509.PEMEncodedCertificateAndKey{Crt: caCertPEM, Key: caKeyPEM})
	if err != nil {
		return nil, fmt.Errorf("issuing kubeconfig: loading the Kubernetes CA: %w", err)
	}
	kp, err := x509.NewKeyPair(ca,
		x509.CommonName(cn),
		x509.Organization(orgs...),
		x509.NotAfter(time.Now().Add(lifetime)),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageClientAuth}),
	)
	if err != nil {
		return nil, fmt.Errorf("issuing kubeconfig: signing the %s client certificate: %w", cn, err)
	}
	user := "admin@" + clusterName
	if cn != adminCommonName {
		user = cn + "@" + clusterName
	}
	context := user
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[clusterName] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caCertPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: kp.CrtPEM, ClientKeyData: kp.KeyPEM}
	cfg.Contexts[context] = &clientcmdapi.Context{Cluster: clusterName, AuthInfo: user, Namespace: "default"}
	cfg.CurrentContext = context
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("issuing kubeconfig: encoding: %w", err)
	}
	return out, nil
}

// issueServingCert signs the API server's serving certificate with the
// Kubernetes CA for the given IPs and DNS names.
func issueServingCert(p PKI, ips []net.IP, dnsNames []string) (certPEM, keyPEM []byte, err error) {
	ca, err := x509.NewCertificateAuthorityFromCertificateAndKey(&x509.PEMEncodedCertificateAndKey{Crt: p.CACertPEM, Key: p.CAKeyPEM})
	if err != nil {
		return nil, nil, fmt.Errorf("loading the Kubernetes CA: %w", err)
	}
	kp, err := x509.NewKeyPair(ca,
		x509.CommonName("kube-apiserver"),
		x509.IPAddresses(ips),
		x509.DNSNames(dnsNames),
		x509.NotAfter(time.Now().Add(AdminCertLifetime)),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageServerAuth}),
	)
	if err != nil {
		return nil, nil, fmt.Errorf("signing the API server certificate: %w", err)
	}
	return kp.CrtPEM, kp.KeyPEM, nil
}
