package talossim

import (
	"fmt"
	"slices"

	"github.com/Masterminds/semver/v3"
	"github.com/siderolabs/talos/pkg/machinery/config"
	configdoc "github.com/siderolabs/talos/pkg/machinery/config/config"
)

// The simulator parses every config with machinery v1.14.1, which knows
// every document kind up to Talos v1.14. A real node knows only the kinds
// its own build registers: the decoder asks the registry for the kind and
// fails with "not registered" (pkg/machinery/config/configloader/internal/
// decoder/decoder.go and config/internal/registry/registry.go at v1.13.3).
// These are the kinds registry.Register is called with under
// pkg/machinery/config/types at v1.12.6 and v1.13.3 (the v1alpha1 document
// aside); from v1.14 the simulator's machinery is the judge.
var registeredKinds = map[string][]string{
	"v1.12": kindsV112,
	// v1.13 added eight.
	"v1.13": append(slices.Clone(kindsV112),
		"BlackholeRouteConfig", "EnvironmentConfig", "ExternalVolumeConfig", "ImageVerificationConfig",
		"KubeSpanConfig", "RoutingRuleConfig", "TCPProbeConfig", "VRFConfig"),
}

var kindsV112 = []string{
	"BondConfig", "BridgeConfig", "DHCPv4Config", "DHCPv6Config", "DummyLinkConfig",
	"EthernetConfig", "EventSinkConfig", "ExistingVolumeConfig", "ExtensionServiceConfig",
	"HCloudVIPConfig", "HostnameConfig", "KmsgLogConfig", "KubeSpanEndpointsConfig",
	"Layer2VIPConfig", "LinkAliasConfig", "LinkConfig", "NetworkDefaultActionConfig",
	"NetworkRuleConfig", "OOMConfig", "PCIDriverRebindConfig", "RawVolumeConfig",
	"RegistryAuthConfig", "RegistryMirrorConfig", "RegistryTLSConfig", "ResolverConfig",
	"SideroLinkConfig", "StaticHostConfig", "SwapVolumeConfig", "TimeSyncConfig",
	"TrustedRootsConfig", "UserVolumeConfig", "VLANConfig", "VolumeConfig",
	"WatchdogTimerConfig", "WireguardConfig", "ZswapConfig",
}

// minorOf is "v1.13" for v1.13.3 (and "" for what is no version).
func minorOf(talosVersion string) string {
	v, err := semver.NewVersion(talosVersion)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("v%d.%d", v.Major(), v.Minor())
}

// unregisteredKind is the decoder's refusal of the first document of cfg
// whose kind the node's Talos does not register, worded as the real one
// ("error decoding document <apiVersion>/<kind>/<name>: "<kind>"
// "<apiVersion>": not registered"; the real message also names the YAML
// line, which the simulator does not track).
func unregisteredKind(cfg config.Provider, talosVersion string) error {
	known, ok := registeredKinds[minorOf(talosVersion)]
	if !ok {
		return nil
	}
	for _, d := range cfg.Documents() {
		kind := d.Kind()
		if kind == "" || kind == "v1alpha1" || d.APIVersion() == "" || slices.Contains(known, kind) {
			continue
		}
		name := ""
		if nd, ok := d.(configdoc.NamedDocument); ok {
			name = nd.Name()
		}
		return fmt.Errorf("error decoding document %s/%s/%s: %q %q: not registered", d.APIVersion(), kind, name, kind, d.APIVersion())
	}
	return nil
}

// atLeast114 reports whether the node's Talos is v1.14 or newer, which
// applies every configuration change without a reboot: machined has no
// CanApplyImmediate any more, AUTO is always NO_REBOOT and REBOOT is
// refused outside maintenance (internal/app/machined/internal/server/
// v1alpha1/v1alpha1_server.go ApplyConfiguration at v1.14.0-rc.1, against
// CanApplyImmediate in the same file at v1.13.3); and may keep etcd on a
// partition of its own (dedicatedEtcdVolume).
func atLeast114(talosVersion string) bool {
	return atLeastMinor(talosVersion, 14)
}

// atLeastMinor: talosVersion is v1.<minor> or newer ("" and unparsable
// versions are not).
func atLeastMinor(talosVersion string, minor uint64) bool {
	v, err := semver.NewVersion(talosVersion)
	if err != nil {
		return false
	}
	return v.Major() > 1 || v.Minor() >= minor
}
