package talossim

import (
	"bytes"
	"crypto/tls"
	stdx509 "crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/machinery/config"
)

// maintenanceTLS is apid in maintenance mode: a self-signed certificate
// minted at boot and no client authentication.
func maintenanceTLS(ip string) (*tls.Config, error) {
	ca, err := x509.NewSelfSignedCertificateAuthority(
		x509.IPAddresses([]net.IP{net.ParseIP(ip)}),
		x509.CommonName("maintenance-service"),
		x509.NotAfter(time.Now().Add(24*time.Hour)),
	)
	if err != nil {
		return nil, fmt.Errorf("self-signed maintenance certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(ca.CrtPEM, ca.KeyPEM)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.NoClientCert,
	}, nil
}

// signer is a running control plane's trustd: it signs apid certificates
// for nodes that present the cluster's machine token.
type signer struct {
	ca    *x509.CertificateAuthority
	token string
}

// configuredTLS is apid in configured mode: a server certificate for the
// node's IP issued from the OS CA in the node's own config, and client
// certificates verified against that CA. Control planes hold the CA key;
// workers only the certificate, so their certificate comes from a running
// control plane of the same cluster (trustd), or not at all yet.
func configuredTLS(s *Sim, ip, hostname string, cfg config.Provider) (*tls.Config, error) {
	sec := cfg.Machine().Security()
	osCA := sec.IssuingCA()
	if osCA == nil || len(osCA.Crt) == 0 {
		return nil, errors.New("config has no machine.ca")
	}
	var ca *x509.CertificateAuthority
	if len(osCA.Key) > 0 {
		var err error
		if ca, err = x509.NewCertificateAuthorityFromCertificateAndKey(osCA); err != nil {
			return nil, fmt.Errorf("machine.ca: %w", err)
		}
		s.registerSigner(ip, osCA.Crt, signer{ca: ca, token: sec.Token()})
	} else {
		sg, ok := s.findSigner(osCA.Crt, sec.Token())
		if !ok {
			return nil, errNoSigner
		}
		ca = sg.ca
	}
	kp, err := x509.NewKeyPair(ca,
		x509.IPAddresses([]net.IP{net.ParseIP(ip)}),
		x509.CommonName(hostname),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageServerAuth}),
		x509.NotAfter(time.Now().Add(365*24*time.Hour)),
	)
	if err != nil {
		return nil, fmt.Errorf("issuing apid certificate: %w", err)
	}
	pool := stdx509.NewCertPool()
	if !pool.AppendCertsFromPEM(osCA.Crt) {
		return nil, errors.New("machine.ca.crt is not PEM")
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{*kp.Certificate},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}, nil
}

func (s *Sim) registerSigner(ip string, caCrt []byte, sg signer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.signers == nil {
		s.signers = map[string]signerEntry{}
	}
	s.signers[ip] = signerEntry{caCrt: caCrt, signer: sg}
}

func (s *Sim) dropSigner(ip string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.signers, ip)
}

func (s *Sim) findSigner(caCrt []byte, token string) (signer, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.signers {
		if bytes.Equal(e.caCrt, caCrt) && e.signer.token == token {
			return e.signer, true
		}
	}
	return signer{}, false
}

type signerEntry struct {
	caCrt  []byte
	signer signer
}
