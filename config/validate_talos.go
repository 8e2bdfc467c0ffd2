package config

import (
	"strings"

	"github.com/Masterminds/semver/v3"
	blang "github.com/blang/semver/v4"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/compatibility"
	"github.com/siderolabs/talos/pkg/machinery/compatibility/talos112"
	"github.com/siderolabs/talos/pkg/machinery/compatibility/talos113"
	"github.com/siderolabs/talos/pkg/machinery/compatibility/talos114"
)

// kubernetesRange is the Kubernetes versions a Talos minor supports, from
// machinery's compatibility package (pkg/machinery/compatibility/talos1xx):
// from min up to, not including, max.
type kubernetesRange struct{ min, max blang.Version }

// generatedTalosMinors are the Talos versions bootstrap generates configs
// for. Every node's patch uses the multi-document network configs
// (HostnameConfig, LinkConfig, Layer2VIPConfig, ResolverConfig), which exist
// from Talos v1.12 on (pkg/machinery/config/types/network first appears at
// v1.12.0); v1.14 is the machinery this binary is built with, whose
// generator writes each minor's own form (the version contract).
var generatedTalosMinors = map[uint64]kubernetesRange{
	12: {talos112.MinimumKubernetesVersion, talos112.MaximumKubernetesVersion},
	13: {talos113.MinimumKubernetesVersion, talos113.MaximumKubernetesVersion},
	14: {talos114.MinimumKubernetesVersion, talos114.MaximumKubernetesVersion},
}

// generatedTalosNames says which minors generatedTalosMinors holds, for
// messages.
const generatedTalosNames = "Talos v1.12.x, v1.13.x and v1.14.x"

// talosVersions checks cluster.talosVersion and cluster.kubernetesVersion:
// the form, a Talos version configs are generated for, and a Kubernetes
// version that Talos version supports — what a node's runtime validation
// would refuse at apply time (v1alpha1 ValidateKubernetesImageTag).
func (v *validator) talosVersions() {
	c := &v.c.Cluster
	tv, err := semver.StrictNewVersion(strings.TrimPrefix(c.TalosVersion, "v"))
	talosOK := err == nil && strings.HasPrefix(c.TalosVersion, "v")
	if !talosOK {
		v.errf("cluster.talosVersion", "%q is not a Talos version: use the form v1.14.1", c.TalosVersion)
	}
	var k8sRange kubernetesRange
	if talosOK {
		var supported bool
		k8sRange, supported = generatedTalosMinors[tv.Minor()]
		switch {
		case supported && tv.Major() == 1:
		case tv.Major() == 1 && tv.Minor() < 12:
			v.errf("cluster.talosVersion", "%s is not supported: bootstrap generates configs for %s (the multi-document network configs it writes exist from v1.12)", c.TalosVersion, generatedTalosNames)
			talosOK = false
		default:
			v.errf("cluster.talosVersion", "%s is not supported: bootstrap generates configs for %s (it is built with Talos machinery v1.14 and does not know a newer config format)", c.TalosVersion, generatedTalosNames)
			talosOK = false
		}
	}
	kv, err := compatibility.ParseKubernetesVersion(strings.TrimPrefix(c.KubernetesVersion, "v"))
	if _, serr := semver.StrictNewVersion(strings.TrimPrefix(c.KubernetesVersion, "v")); err != nil || serr != nil {
		v.errf("cluster.kubernetesVersion", "%q is not a Kubernetes version: use the form 1.36.1", c.KubernetesVersion)
		return
	}
	if !talosOK {
		return
	}
	target, err := compatibility.ParseTalosVersion(&machine.VersionInfo{Tag: c.TalosVersion})
	if err != nil {
		v.errf("cluster.talosVersion", "%s: %v", c.TalosVersion, err)
		return
	}
	if err := kv.SupportedWith(target); err != nil {
		v.errf("cluster.kubernetesVersion", "%s: %v; Talos v1.%d supports Kubernetes %s up to (not including) %s",
			c.KubernetesVersion, err, tv.Minor(), k8sRange.min, k8sRange.max)
	}
}

// Service account key kinds (cluster.serviceAccountKey).
const (
	ServiceAccountKeyRSA   = "rsa"
	ServiceAccountKeyECDSA = "ecdsa"
)

// serviceAccountKey checks cluster.serviceAccountKey: empty (the default,
// RSA) or one of the two kinds Talos' secrets bundle makes.
func (v *validator) serviceAccountKey() {
	switch v.c.Cluster.ServiceAccountKey {
	case "", ServiceAccountKeyRSA, ServiceAccountKeyECDSA:
	default:
		v.errf("cluster.serviceAccountKey", "%q must be rsa or ecdsa", v.c.Cluster.ServiceAccountKey)
	}
}

// ECDSAServiceAccountKey reports whether a new secrets bundle signs
// service account tokens with an ECDSA key instead of the RSA key the
// Talos version contract selects.
func (c Cluster) ECDSAServiceAccountKey() bool { return c.ServiceAccountKey == ServiceAccountKeyECDSA }
