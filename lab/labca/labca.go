// Package labca issues the TLS certificates of the lab's HTTPS servers (the
// Proxmox simulator, the Image Factory): a CA of the server's own and a leaf
// it signs, so the product trusts a lab server through a CA file or pool,
// as it trusts a real server with a private CA.
package labca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"
)

// Spec names the two certificates and what the leaf is valid for.
type Spec struct {
	CA, Leaf     pkix.Name
	DNSNames     []string
	IPs          []net.IP
	CALifetime   time.Duration
	LeafLifetime time.Duration
}

// Issued is a CA and the serving certificate it signed.
type Issued struct {
	CA    *x509.Certificate
	CAPEM []byte
	// Leaf is what the server presents: the leaf, then the CA.
	Leaf    tls.Certificate
	LeafDER []byte
}

// Pool is a certificate pool trusting only the CA.
func (i *Issued) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(i.CA)
	return p
}

// Issue creates a P-256 CA and a server certificate it signs, both valid
// from an hour ago (clock skew between a test and its server is nil, but a
// certificate valid from "now" is refused by a client a millisecond behind).
func Issue(s Spec) (*Issued, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: s.CA,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(s.CALifetime),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("lab CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: s.Leaf,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(s.LeafLifetime),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    s.DNSNames, IPAddresses: s.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("lab server certificate: %w", err)
	}
	return &Issued{
		CA:      ca,
		CAPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		Leaf:    tls.Certificate{Certificate: [][]byte{der, caDER}, PrivateKey: key},
		LeafDER: der,
	}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}
