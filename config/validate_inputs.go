package config

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/distribution/reference"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/minio/minio-go/v7/pkg/s3utils"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"

	"github.com/homelab/bootstrap/internal/sealed"
	"github.com/homelab/bootstrap/talos"
)

// maxMemoryMiB is the most memory qemu-server lets a VM have: get_max_mem
// in src/PVE/QemuServer/Memory.pm (qemu-server 9.2.6) caps it at 4 TiB
// whatever the host's physical address bits. Starting a VM with more dies
// with "Total memory is bigger than ...MB". The schema's minimum is 16 MiB
// (memory_fmt), far below Talos's own minimum checked in nodes().
const maxMemoryMiB = 4 * 1024 * 1024

// cidrHostBits refuses a CIDR written as an address (10.0.20.5/24): it
// describes the network, and which network was meant is worth saying.
func (v *validator) cidrHostBits() {
	n := v.c.Cluster.Network.CIDR
	p, err := netip.ParsePrefix(n)
	if err != nil || !p.Addr().Is4() {
		return // cluster() reports the form
	}
	if p != p.Masked() {
		v.errf("cluster.network.cidr", "%s has host bits set: the network it lies in is %s; write that (the CIDR names the node network, not an address)", n, p.Masked())
	}
}

// dnsName is an RFC 1123 host name, optionally with a leading wildcard
// label as certificate SANs allow.
var dnsName = regexp.MustCompile(`^(\*\.)?([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)

// dottedDigits looks like an IPv4 address: a name of digits only is no
// host name anyone means (no top-level domain is numeric).
var dottedDigits = regexp.MustCompile(`^[0-9.]+$`)

// certSANs: each must be an IP address or a DNS name, what an x509 SAN
// can hold (Talos puts IPs in IPAddresses and the rest in DNSNames).
func (v *validator) certSANs() {
	for i, san := range v.c.Cluster.SANs {
		if san == "" {
			continue // cluster() reports it
		}
		if _, err := netip.ParseAddr(san); err == nil {
			continue
		}
		if dottedDigits.MatchString(san) {
			v.errf(fmt.Sprintf("cluster.certSANs[%d]", i), "%q is not an IP address (each part must be 0-255)", san)
			continue
		}
		if len(san) > 253 || !dnsName.MatchString(san) {
			v.errf(fmt.Sprintf("cluster.certSANs[%d]", i), "%q is neither an IP address nor a DNS name (letters, digits, '-' and '.', labels up to 63 characters)", san)
		}
	}
}

// installImage parses cluster.installImage as a container image reference
// with the parser Talos itself uses (github.com/distribution/reference).
func (v *validator) installImage() {
	img := v.c.Cluster.InstallImage
	if img == "" {
		return
	}
	ref, err := reference.ParseNormalizedNamed(img)
	if err != nil {
		v.errf("cluster.installImage", "%q is not an image reference (%v): use the form factory.talos.dev/nocloud-installer/<schematic>:v1.13.3, or leave it empty to derive it from cluster.schematic", img, err)
		return
	}
	// An upgrade with an installer of another version would never get there.
	if tagged, ok := ref.(reference.Tagged); ok && tagged.Tag() != v.c.Cluster.TalosVersion {
		v.errf("cluster.installImage", "%q installs Talos %s but cluster.talosVersion is %s: an upgrade with it would never get there; set its tag to %s, or leave installImage empty to derive it from cluster.schematic",
			img, tagged.Tag(), v.c.Cluster.TalosVersion, v.c.Cluster.TalosVersion)
	}
}

// gitBranch checks flux.branch against git's ref-name rules as go-git
// implements them (plumbing.ReferenceName.Validate).
func (v *validator) gitBranch() {
	b := v.c.Flux.Branch
	if b == "" {
		return // flux() reports it
	}
	if strings.HasPrefix(b, "refs/") {
		v.errf("flux.branch", "%q is a full ref: give the branch name only (e.g. main)", b)
		return
	}
	if err := plumbing.NewBranchReferenceName(b).Validate(); err != nil {
		v.errf("flux.branch", "%q is not a valid git branch name: no spaces, '..', '~', '^', ':', '?', '*', '[', '\\', control characters, or a trailing '.lock', '/' or '.'", b)
	}
}

// nodeResources checks what qemu-server would refuse beyond Talos's own
// minimums (checked in nodes()). The number of cores has no maximum in
// qemu-server's schema (src/PVE/QemuServer.pm: cores minimum 1): the real
// limit is the host's CPU count, which precheck reads from the node.
func (v *validator) nodeResources() {
	for i, n := range v.c.Nodes {
		if n.MemoryMiB > maxMemoryMiB {
			v.errf(fmt.Sprintf("nodes[%d].memoryMiB", i), "%d is more than Proxmox gives a VM (%d MiB, 4 TiB)", n.MemoryMiB, maxMemoryMiB)
		}
	}
}

// maxPatchBytes bounds a patch file read at validate: Talos patches are
// small, and a path to something else must not be read whole.
const maxPatchBytes = 1 << 20

// patchContents loads every patch file as a Talos config patch and
// applies it to a machine config generated for this cluster's Talos
// version and role, then validates the result as a node would — what the
// talos stage does later with the real secrets. Each failure names the
// file. It runs only when the rest of the cluster section is valid.
func (v *validator) patchContents() {
	c := &v.c.Cluster
	contract, err := talosconfig.ParseContractFromVersion(c.TalosVersion)
	if err != nil {
		return // talosVersions reports it
	}
	type target struct {
		field string
		files []string
		types []machine.Type
	}
	both := []machine.Type{machine.TypeControlPlane, machine.TypeWorker}
	targets := []target{
		{"cluster.patches.all", c.Patches.All, both},
		{"cluster.patches.controlplane", c.Patches.ControlPlane, []machine.Type{machine.TypeControlPlane}},
		{"cluster.patches.worker", c.Patches.Worker, []machine.Type{machine.TypeWorker}},
	}
	roles := map[string]machine.Type{}
	for _, n := range v.c.Nodes {
		roles[n.Name] = machine.TypeWorker
		if n.Role == RoleControlPlane {
			roles[n.Name] = machine.TypeControlPlane
		}
	}
	for _, name := range sortedKeys(c.Patches.Nodes) {
		if t, ok := roles[name]; ok {
			targets = append(targets, target{"cluster.patches.nodes." + name, c.Patches.Nodes[name], []machine.Type{t}})
		}
	}
	var base map[machine.Type]talosconfig.Provider
	for _, t := range targets {
		for i, f := range t.files {
			field := fmt.Sprintf("%s[%d]", t.field, i)
			patch, ok := v.loadPatch(field, f)
			if !ok {
				continue
			}
			if base == nil {
				if base, err = baseConfigs(c, v.c.Images().InstallImage, contract); err != nil {
					v.errf("cluster", "cannot generate a Talos config to check the patches against: %v", err)
					return
				}
			}
			if kinds := talos.NewerKinds(contract, patch); len(kinds) > 0 {
				v.errf(field, "patch file %s writes %s, which Talos %s does not know (the document kinds came with Talos v1.14): set the v1alpha1 field instead, or set cluster.talosVersion to v1.14.x",
					f, strings.Join(kinds, ", "), c.TalosVersion)
				continue
			}
			for _, typ := range t.types {
				if err := applyAndValidate(base[typ], patch); err != nil {
					hint := ""
					if contract.MultidocKubernetesConfigSupported() && appliesBefore114(c, v.c.Images().InstallImage, typ, patch) {
						hint = "; the patch is valid for Talos v1.13, but from v1.14 the Kubernetes settings and the install disk live in typed documents (KubeNetworkConfig, KubeProxyConfig, KubeletConfig, UnattendedInstallConfig, …) that bootstrap writes, and a v1alpha1 field beside its document is refused: move the setting into the document the error names, or keep cluster.talosVersion at v1.13.x"
					}
					v.errf(field, "patch file %s does not apply to a %s config: %s%s", f, typ, oneLine(err), hint)
					break
				}
			}
		}
	}
}

// applyAndValidate applies patch to base and validates the result strictly
// for metal, as a node would. A v1alpha1 field beside the typed document
// that replaces it is refused here, by machinery's own conflict check
// (container validate, V1Alpha1ConflictValidate at v1.14.1).
func applyAndValidate(base talosconfig.Provider, patch configpatcher.Patch) error {
	out, err := configpatcher.Apply(configpatcher.WithConfig(base), []configpatcher.Patch{patch})
	var cfg talosconfig.Provider
	if err == nil {
		cfg, err = out.Config()
	}
	if err == nil {
		_, err = cfg.ValidateAsClient(talos.MetalMode{}, validation.WithStrict())
	}
	return err
}

// appliesBefore114 reports whether patch applies cleanly to a Talos v1.13
// config of the same cluster: a patch that does, and that v1.14 refuses, was
// written for the v1alpha1 form.
func appliesBefore114(c *Cluster, installImage string, typ machine.Type, patch configpatcher.Patch) bool {
	base, err := baseConfigs(c, installImage, talosconfig.TalosVersion1_13)
	if err != nil {
		return false
	}
	return applyAndValidate(base[typ], patch) == nil
}

// loadPatch reads and parses one patch file; problems are reported on field.
func (v *validator) loadPatch(field, f string) (configpatcher.Patch, bool) {
	path := v.c.Resolve(f)
	st, err := os.Stat(path)
	if err != nil || st.IsDir() {
		return nil, false // patchFiles reports it
	}
	if st.Size() > maxPatchBytes {
		v.errf(field, "patch file %s is %d bytes: not a Talos patch (they are small YAML or JSON documents)", f, st.Size())
		return nil, false
	}
	data, err := os.ReadFile(path)
	if err != nil {
		v.errf(field, "patch file %s cannot be read: %v", f, unwrapPathErr(err))
		return nil, false
	}
	patch, err := configpatcher.LoadPatch(data)
	if err != nil {
		v.errf(field, "patch file %s is not a Talos config patch: %s", f, oneLine(err))
		return nil, false
	}
	return patch, true
}

// baseConfigs generates a throwaway control plane and worker config for
// the cluster's Talos version, to apply patches to.
func baseConfigs(c *Cluster, installImage string, contract *talosconfig.VersionContract) (map[machine.Type]talosconfig.Provider, error) {
	bundle, err := secrets.NewBundle(secrets.NewFixedClock(time.Now()), contract)
	if err != nil {
		return nil, err
	}
	opts := []generate.Option{generate.WithVersionContract(contract), generate.WithSecretsBundle(bundle), generate.WithInstallDisk("/dev/sda")}
	opts = append(opts, generate.WithInstallImage(installImage))
	in, err := generate.NewInput(c.Name, c.Endpoint, strings.TrimPrefix(c.KubernetesVersion, "v"), opts...)
	if err != nil {
		return nil, err
	}
	out := map[machine.Type]talosconfig.Provider{}
	for _, t := range []machine.Type{machine.TypeControlPlane, machine.TypeWorker} {
		if out[t], err = in.Config(t); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// oneLine joins a multi-line error into one line for the report.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// backupCopy checks the snapshot copy target: an existing directory, and
// recipients age can encrypt to (X25519 public keys, age1…).
func (v *validator) backupCopy() {
	b := v.c.Backup
	if b.CopyDir != "" {
		if st, err := os.Stat(v.c.Resolve(b.CopyDir)); err != nil {
			v.errf("backup.copyDir", "%s cannot be used: %v (mount it, or create it)", b.CopyDir, unwrapPathErr(err))
		} else if !st.IsDir() {
			v.errf("backup.copyDir", "%s is not a directory", b.CopyDir)
		}
	}
	if len(b.AgeRecipients) > 0 && b.CopyDir == "" && !b.S3.Enabled() {
		v.errf("backup.ageRecipients", "are set but neither backup.copyDir nor backup.s3 is: only copies are encrypted (the snapshots on this host are 0600)")
	}
	v.backupS3()
	bad := false
	for i, r := range b.AgeRecipients {
		if _, err := sealed.ParseRecipient(r); err != nil {
			bad = true
			v.notARecipient(fmt.Sprintf("backup.ageRecipients[%d]", i), r, err, "keep the identity in a 0600 file off this config (a restore reads it: --age-identity FILE)")
		}
	}
	if _, err := sealed.ParseRecipients(b.AgeRecipients); !bad && err != nil {
		v.errf("backup.ageRecipients", "%v (every copy is one age file encrypted to all of them)", err)
	}
}

// backupS3 checks the S3 copy target from what the config and its files
// say: an endpoint URL, a bucket name S3 accepts, credentials that can be
// found (the environment or a 0600 shared credentials file holding the
// profile), a CA file that parses.
func (v *validator) backupS3() {
	s := v.c.Backup.S3
	if !s.Enabled() {
		for path, set := range map[string]bool{"backup.s3.bucket": s.Bucket != "", "backup.s3.credentialsFile": s.CredentialsFile != "", "backup.s3.caFile": s.CAFile != ""} {
			if set {
				v.errf(path, "is set but backup.s3.endpoint is not: set the endpoint (https://host[:port]) or remove backup.s3")
			}
		}
		return
	}
	if u, err := url.Parse(s.Endpoint); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		v.errf("backup.s3.endpoint", "%q is not an endpoint URL: want https://host[:port] (no path; the bucket goes in backup.s3.bucket)", s.Endpoint)
	}
	if err := s3utils.CheckValidBucketNameStrict(s.Bucket); err != nil {
		v.errf("backup.s3.bucket", "%q: %v", s.Bucket, err)
	}
	if strings.HasPrefix(s.Prefix, "/") {
		v.errf("backup.s3.prefix", "%q starts with /: keys are relative to the bucket (e.g. homelab/etcd/)", s.Prefix)
	}
	if s.CAFile != "" {
		v.caFile("backup.s3.caFile", s.CAFile)
	}
	// pathStyle: false addresses the bucket as <bucket>.<host>
	// (backup.NewS3): no name exists under an IP address.
	if u, err := url.Parse(s.Endpoint); err == nil && !s.PathStyle {
		if h := u.Hostname(); net.ParseIP(h) != nil || h == "localhost" {
			v.errf("backup.s3.pathStyle", "is false, which addresses the bucket as %s.%s (virtual-hosted), and %s has no names under it: set pathStyle: true (<endpoint>/<bucket>, what MinIO, Garage and SeaweedFS answer at an address)", s.Bucket, h, h)
		}
	}
	// Resolved as the run resolves them (S3Credentials): the environment,
	// the profile, the shared credentials file.
	if _, field, err := v.c.resolveS3Credentials(os.ReadFile); err != nil {
		v.errf(field, "%v", err)
	}
}
