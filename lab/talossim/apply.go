package talossim

import (
	"bytes"
	"context"
	stdx509 "crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/compatibility"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configdiff"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/types/block/blockhelpers"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// criUpLocked reports whether the installed system's boot sequence has
// started cri (IsBootstrapAllowed waits for it: v1alpha1_runtime.go).
func (n *Node) criUpLocked(now time.Time) bool {
	return n.phase == PhaseRunning && !now.Before(n.bootedAt.Add(n.sim.scaled(n.sim.opts.Profile.BootstrapReady)))
}

// canApplyImmediate is Runtime.CanApplyImmediate
// (internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_runtime.go at
// v1.13.3): only the v1alpha1 document is compared, after copying into the
// new config the parts that apply at once (.debug, .cluster, .machine.ca,
// acceptedCAs, time, certSANs, install, network, sysfs, sysctls, logging,
// controlPlane, kubelet, kernel, registries, pods, seccompProfiles, node
// annotations/labels/taints, and five features). Everything else (the
// machine type, the token, disks, files, env…) needs a reboot. Changing
// .machine.install.image therefore applies without a reboot and upgrades
// nothing.
func canApplyImmediate(current, next config.Provider) error {
	if current == nil {
		return errors.New("no current config")
	}
	cur := current.RawV1Alpha1()
	if cur == nil {
		return errors.New("current config is not v1alpha1")
	}
	nc := next.RawV1Alpha1()
	if nc == nil {
		return errors.New("new config is not v1alpha1")
	}
	nc = nc.DeepCopy()
	nc.ConfigDebug = cur.ConfigDebug
	nc.ClusterConfig = cur.ClusterConfig
	if nc.MachineConfig != nil && cur.MachineConfig != nil {
		m, c := nc.MachineConfig, cur.MachineConfig
		m.MachineCA = c.MachineCA
		m.MachineAcceptedCAs = c.MachineAcceptedCAs
		m.MachineTime = c.MachineTime //nolint:staticcheck // as the real runtime does
		m.MachineCertSANs = c.MachineCertSANs
		m.MachineInstall = c.MachineInstall
		m.MachineNetwork = c.MachineNetwork //nolint:staticcheck // as the real runtime does
		m.MachineSysfs = c.MachineSysfs
		m.MachineSysctls = c.MachineSysctls
		m.MachineLogging = c.MachineLogging
		m.MachineControlPlane = c.MachineControlPlane
		m.MachineKubelet = c.MachineKubelet
		m.MachineKernel = c.MachineKernel
		m.MachineRegistries = c.MachineRegistries //nolint:staticcheck // as the real runtime does
		m.MachinePods = c.MachinePods
		m.MachineSeccompProfiles = c.MachineSeccompProfiles
		m.MachineNodeAnnotations = c.MachineNodeAnnotations
		m.MachineNodeLabels = c.MachineNodeLabels
		m.MachineNodeTaints = c.MachineNodeTaints
		if m.MachineFeatures != nil && c.MachineFeatures != nil {
			m.MachineFeatures.KubernetesTalosAPIAccessConfig = c.MachineFeatures.KubernetesTalosAPIAccessConfig
			m.MachineFeatures.KubePrismSupport = c.MachineFeatures.KubePrismSupport
			m.MachineFeatures.HostDNSSupport = c.MachineFeatures.HostDNSSupport
			m.MachineFeatures.ImageCacheSupport = c.MachineFeatures.ImageCacheSupport
			m.MachineFeatures.FeatureNodeAddressSortAlgorithm = c.MachineFeatures.FeatureNodeAddressSortAlgorithm
		}
	}
	if reflect.DeepEqual(cur, nc) {
		return nil
	}
	diff, err := configdiff.DiffConfigs(container.NewV1Alpha1(cur), container.NewV1Alpha1(nc))
	if err != nil {
		return fmt.Errorf("error calculating diff: %w", err)
	}
	return fmt.Errorf("this config change can't be applied in immediate mode\ndiff:\n%s", diff)
}

// validateKubernetesImages is the part of the v1alpha1 runtime validation
// that ties a config to the node's Talos version
// (pkg/machinery/config/types/v1alpha1/v1alpha1_validation.go
// ValidateKubernetesImageTag): the kubelet image, and on control planes the
// API server, controller manager and scheduler images, must carry a
// Kubernetes version that Talos version supports (machinery's
// compatibility package). A real node checks against its own build; the
// simulated node against the version it runs.
func validateKubernetesImages(cfg config.Provider, talosVersion string) error {
	if cfg.Machine() == nil || cfg.RawV1Alpha1() == nil {
		return nil
	}
	tv, err := compatibility.ParseTalosVersion(&machine.VersionInfo{Tag: talosVersion})
	if err != nil {
		return fmt.Errorf("failed to parse Talos version: %w", err)
	}
	check := func(name, ref string) error {
		kv, err := compatibility.KubernetesVersionFromImageRef(ref)
		if err != nil {
			return fmt.Errorf("%s image is not valid: failed to parse Kubernetes version from image reference %q: %w", name, ref, err)
		}
		if err := kv.SupportedWith(tv); err != nil {
			return fmt.Errorf("%s image is not valid: %w", name, err)
		}
		return nil
	}
	var errs []error
	errs = append(errs, check("kubelet", kubeletImage(cfg)))
	if cfg.Machine().Type().IsControlPlane() {
		pods := StaticPodImages(cfg)
		for _, name := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			if ref, ok := pods[name]; ok {
				errs = append(errs, check(name, ref))
			}
		}
	}
	return errors.Join(errs...)
}

// installTargetLocked is the install disk and installer image a config
// asks for. From Talos v1.14 an UnattendedInstallConfig document carries
// them, the disk as a CEL selector that the UnattendedInstallController
// resolves against the Disk resources with machinery's own MatchDisks,
// taking the first match (internal/app/machined/pkg/controllers/runtime/
// unattended_install.go at v1.14.0-rc.1); before, .machine.install names
// the disk. The real controller waits while no disk matches ("no disk
// matched the selector", phase pending); the simulator reports that as the
// install failing, so a test sees it at once.
func (n *Node) installTargetLocked(cfg config.Provider) (disk, image string, err error) {
	if u := cfg.UnattendedInstallConfig(); u != nil {
		expr := u.VolumeSelector()
		matched, err := blockhelpers.MatchDisks(context.Background(), n.cosi, &expr)
		if err != nil {
			return "", u.InstallerImage(), fmt.Errorf("failed to match install disk: %w", err)
		}
		if len(matched) == 0 {
			return "", u.InstallerImage(), errors.New("no disk matched the selector")
		}
		return matched[0].TypedSpec().DevPath, u.InstallerImage(), nil
	}
	if cfg.Machine() == nil {
		return "", "", errors.New("the config has no install section")
	}
	return cfg.Machine().Install().Disk(), cfg.Machine().Install().Image(), nil //nolint:staticcheck // the form before v1.14
}

// mintAdminCert issues the admin client certificate as GenerateAdmin does:
// from the Kubernetes CA, with the admin kubeconfig's common name,
// organization and lifetime (cluster.adminKubeconfig.certLifetime, one
// year by default: constants.KubernetesAdminCertDefaultLifetime).
func mintAdminCert(cfg config.Provider) (*x509.PEMEncodedCertificateAndKey, error) {
	c := cfg.Cluster()
	ca, err := x509.NewCertificateAuthorityFromCertificateAndKey(kubernetesCA(cfg))
	if err != nil {
		return nil, fmt.Errorf("error getting Kubernetes CA: %w", err)
	}
	admin := c.AdminKubeconfig()
	kp, err := x509.NewKeyPair(ca,
		x509.CommonName(admin.CommonName()),
		x509.Organization(admin.CertOrganization()),
		x509.NotBefore(time.Now().Add(-10*time.Second)),
		x509.NotAfter(time.Now().Add(admin.CertLifetime())),
		x509.KeyUsage(stdx509.KeyUsageDigitalSignature|stdx509.KeyUsageKeyEncipherment),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageClientAuth}),
	)
	if err != nil {
		return nil, fmt.Errorf("error generating Kubernetes client certificate: %w", err)
	}
	return x509.NewCertificateAndKeyFromKeyPair(kp), nil
}

// kubernetesCA is the Kubernetes CA a control plane's config holds: the
// KubeAPIServerCAConfig document from Talos v1.14, .cluster.ca before
// (K8sAPIServerCAConfig answers either: container.go at machinery v1.14.1).
func kubernetesCA(cfg config.Provider) *x509.PEMEncodedCertificateAndKey {
	if c := cfg.K8sAPIServerCAConfig(); c != nil {
		return c.IssuingCA()
	}
	return nil
}

// clusterID is the cluster's discovery identity: the DiscoveryIdentityConfig
// document from Talos v1.14, .cluster.id before (DiscoveryIdentityConfig
// in container.go at machinery v1.14.1 answers either).
func clusterID(cfg config.Provider) string {
	if d := cfg.DiscoveryIdentityConfig(); d != nil {
		return d.ClusterID()
	}
	return ""
}

// withConfiguredAdminCert gives a kubeconfig the simulated control plane
// served (its address and CA) the admin certificate the node's config
// would mint (mintAdminCert): its lifetime follows
// cluster.adminKubeconfig.certLifetime as on Talos. A kubeconfig whose
// client certificate another CA issued (a test's stand-in) is left as
// it is.
func withConfiguredAdminCert(data []byte, cfg config.Provider) ([]byte, error) {
	if cfg == nil || cfg.Cluster() == nil {
		return data, nil
	}
	kc, err := clientcmd.Load(data)
	if err != nil {
		return data, nil
	}
	kctx := kc.Contexts[kc.CurrentContext]
	if kctx == nil || kc.AuthInfos[kctx.AuthInfo] == nil || len(kc.AuthInfos[kctx.AuthInfo].ClientCertificateData) == 0 {
		return data, nil
	}
	ai := kc.AuthInfos[kctx.AuthInfo]
	ca := kubernetesCA(cfg)
	roots := stdx509.NewCertPool()
	block, _ := pem.Decode(ai.ClientCertificateData)
	if ca == nil || !roots.AppendCertsFromPEM(ca.Crt) || block == nil {
		return data, nil
	}
	crt, err := stdx509.ParseCertificate(block.Bytes)
	if err != nil {
		return data, nil
	}
	if _, err := crt.Verify(stdx509.VerifyOptions{Roots: roots, KeyUsages: []stdx509.ExtKeyUsage{stdx509.ExtKeyUsageClientAuth}}); err != nil {
		return data, nil
	}
	pair, err := mintAdminCert(cfg)
	if err != nil {
		return nil, err
	}
	ai.ClientCertificateData, ai.ClientKeyData = pair.Crt, pair.Key
	return clientcmd.Write(*kc)
}

// generateAdminKubeconfig mints an admin kubeconfig from a control plane's
// machine config the way Talos does (pkg/kubeconfig/generate.go
// GenerateAdmin at v1.13.3): server = the cluster endpoint, CA = the
// Kubernetes CA, a client certificate from that CA with the admin
// kubeconfig's common name and organization.
func generateAdminKubeconfig(cfg config.Provider) ([]byte, error) {
	if cfg == nil || cfg.Cluster() == nil {
		return nil, errors.New("no cluster config")
	}
	pair, err := mintAdminCert(cfg)
	if err != nil {
		return nil, err
	}
	// The CA documents and the cluster name and endpoint moved to
	// KubeAPIServerCAConfig and KubeClusterConfig in Talos v1.14; the
	// container's accessors answer from either form.
	caCfg, cl := cfg.K8sAPIServerCAConfig(), cfg.K8sClusterConfig()
	if caCfg == nil || cl == nil || cl.ClusterEndpoint() == nil {
		return nil, errors.New("no cluster config")
	}
	cas := [][]byte{}
	for _, a := range caCfg.AcceptedCAs() {
		cas = append(cas, a.Crt)
	}
	cas = append(cas, caCfg.IssuingCA().Crt)
	name := cl.ClusterName()
	return clientcmd.Write(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{name: {Server: cl.ClusterEndpoint().String(), CertificateAuthorityData: bytes.Join(cas, nil)}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"admin@" + name: {ClientCertificateData: pair.Crt, ClientKeyData: pair.Key}},
		Contexts:       map[string]*clientcmdapi.Context{"admin@" + name: {Cluster: name, Namespace: "default", AuthInfo: "admin@" + name}},
		CurrentContext: "admin@" + name,
	})
}
