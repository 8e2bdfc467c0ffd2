package config

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/netip"
	"net/url"
	"os"
	"regexp"

	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/ssh"
)

// Every file the config names is opened and parsed here, so a file that is
// there but holds the wrong thing fails validate with the parser's reason,
// not a stage minutes later.

// pveNodeRe is PVE's node name format (pve-common 9.2.1
// src/PVE/JSONSchema.pm pve_verify_node_name, format pve-node).
var pveNodeRe = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?$`)

// pveBridgeRe is the bridge a guest NIC may name (pve-common 9.2.1
// src/PVE/JSONSchema.pm parse_bridge_id, format pve-bridge-id, which
// qemu-server's net option uses).
var pveBridgeRe = regexp.MustCompile(`^[-_.\w]+$`)

// lastAddr is the last (broadcast) address of an IPv4 prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := (uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// readFile reads a file the config names at field path, reporting why it
// cannot be read.
func (v *validator) readFile(path, f string) ([]byte, bool) {
	data, err := os.ReadFile(v.c.Resolve(f))
	if err != nil {
		v.errf(path, "%s cannot be read: %v", f, unwrapPathErr(err))
		return nil, false
	}
	return data, true
}

// secretFile reads a credential file (its mode is credentialModes' to
// judge).
func (v *validator) secretFile(path, f string) ([]byte, bool) {
	if f == "" {
		return nil, false
	}
	return v.readFile(path, f)
}

// credentialModes refuses every credential file (CredentialFiles) that
// others may read: ssh refuses a key others may read for the same reason.
func (v *validator) credentialModes() {
	for _, f := range v.c.CredentialFiles() {
		if st, err := os.Stat(f.Path); err == nil && st.Mode().Perm()&0o077 != 0 {
			v.errf(f.Field, "%s is readable by others (mode %#o): chmod 600 it", f.File, st.Mode().Perm())
		}
	}
}

// caFile checks a PEM file of CA certificates.
func (v *validator) caFile(path, f string) {
	data, ok := v.readFile(path, f)
	if !ok {
		return
	}
	n := 0
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			v.errf(path, "%s holds a certificate that does not parse: %v", f, err)
			return
		}
		n++
	}
	if n == 0 {
		v.errf(path, "%s holds no PEM certificate (-----BEGIN CERTIFICATE-----): name the CA's certificate file", f)
	}
}

// valuesFile checks a Helm values file: a YAML mapping.
func (v *validator) valuesFile(path, f string) {
	if f == "" {
		return
	}
	data, ok := v.readFile(path, f)
	if !ok {
		return
	}
	var vals map[string]any
	if err := yaml.Unmarshal(data, &vals); err != nil {
		v.errf(path, "%s is not a YAML values file: %v", f, err)
	}
}

// sshKey checks an SSH deploy key: an unencrypted private key, readable by
// its owner only.
func (v *validator) sshKey(path, f string) {
	data, ok := v.secretFile(path, f)
	if !ok {
		return
	}
	_, err := ssh.ParseRawPrivateKey(data)
	var missing *ssh.PassphraseMissingError
	switch {
	case errors.As(err, &missing):
		v.errf(path, "%s is protected by a passphrase, which bootstrap does not hold: use a deploy key without one (ssh-keygen -t ed25519 -N '' -f deploy_key) and add its .pub to the repository", f)
	case err != nil:
		v.errf(path, "%s is not an SSH private key: %v", f, err)
	}
}

// manifests checks flux.manifests: a URL, or a local tarball or
// directory that exists.
func (v *validator) manifests() {
	m := v.c.Flux.Manifests
	if m == "" {
		return
	}
	if u, err := url.Parse(m); err == nil && (u.Scheme == "https" || u.Scheme == "http") {
		if u.Host == "" {
			v.errf("flux.manifests", "%q has no host", m)
		}
		return
	}
	if _, err := os.Stat(v.c.Resolve(m)); err != nil {
		v.errf("flux.manifests", "%s cannot be read: %v (a local manifests.tar.gz or directory, or an http(s) URL)", m, unwrapPathErr(err))
	}
}
