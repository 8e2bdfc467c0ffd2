package pvesim

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/homelab/bootstrap/lab/labca"
)

// certs mirrors PVE's layout: a cluster CA (pve-root-ca.pem) signs the
// node certificate (pve-ssl.pem) the API serves.
type certs struct {
	caPEM       []byte
	leaf        tls.Certificate
	fingerprint string
}

func newCerts(node string, hosts []string) (*certs, error) {
	spec := labca.Spec{
		CA:           pkix.Name{CommonName: "Proxmox Virtual Environment", OrganizationalUnit: []string{"pvesim"}, Organization: []string{"PVE Cluster Manager CA"}},
		Leaf:         pkix.Name{CommonName: node + ".localdomain", OrganizationalUnit: []string{"PVE Cluster Node"}, Organization: []string{"Proxmox Virtual Environment"}},
		DNSNames:     []string{"localhost", node, node + ".localdomain"},
		IPs:          []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		CALifetime:   10 * 365 * 24 * time.Hour,
		LeafLifetime: 2 * 365 * 24 * time.Hour,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			spec.IPs = append(spec.IPs, ip)
		} else if h != "" {
			spec.DNSNames = append(spec.DNSNames, h)
		}
	}
	is, err := labca.Issue(spec)
	if err != nil {
		return nil, err
	}
	return &certs{caPEM: is.CAPEM, leaf: is.Leaf, fingerprint: Fingerprint(is.LeafDER)}, nil
}

// Fingerprint formats the SHA-256 of a DER certificate the way the PVE GUI
// shows it: upper-case hex pairs separated by colons.
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	parts := make([]string, len(sum))
	for i, b := range sum {
		parts[i] = fmt.Sprintf("%02X", b)
	}
	return strings.Join(parts, ":")
}
