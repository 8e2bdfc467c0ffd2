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
	ca        *x509.CertificateAuthority
	token     string
	clusterID string
}

// configuredTLS is apid in configured mode: a server certificate for the
// node's IP issued from the OS CA in the node's own config, and client
// certificates verified against that CA. Control planes hold the CA key
// (and, once their installed system runs, serve trustd for the others);
// workers only the certificate, so their certificate comes from a control
// plane's trustd that they can reach (see findSigner), or not at all yet.
func configuredTLS(s *Sim, ip, hostname string, cfg config.Provider, trustdRunning bool) (*tls.Config, error) {
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
		if trustdRunning {
			s.registerSigner(ip, osCA.Crt, signer{ca: ca, token: sec.Token(), clusterID: clusterID(cfg)})
		}
	} else {
		sg, ok := s.findSigner(cfg, osCA.Crt, sec.Token())
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

// findSigner is a worker looking for trustd. Its endpoints are the cluster
// endpoint's host (StaticEndpointController) and, with discovery enabled,
// the control planes the discovery service lists
// (internal/app/machined/pkg/controllers/secrets/api.go and
// controllers/k8s/static_endpoint.go at v1.13.3). An endpoint host that is a
// control plane's own address reaches that node's trustd; any other host is
// taken for the control planes' shared VIP, which a control plane only
// holds once etcd runs (its election is in etcd: operator/vip.go), so it
// reaches a trustd only after the etcd bootstrap.
func (s *Sim) findSigner(cfg config.Provider, caCrt []byte, token string) (signer, bool) {
	endpointHost := ""
	discovery := false
	// The endpoint is in KubeClusterConfig and discovery in
	// DiscoveryServiceConfig documents from Talos v1.14; the container's
	// accessors answer from either form (container.go at machinery v1.14.1).
	if cl := cfg.K8sClusterConfig(); cl != nil && cl.ClusterEndpoint() != nil {
		endpointHost = cl.ClusterEndpoint().Hostname()
	}
	legacy := cfg.Cluster() != nil && cfg.Cluster().Discovery().Enabled()
	discovery = (legacy || len(cfg.DiscoveryServiceConfigs()) > 0) && !s.opts.DiscoveryUnreachable
	s.mu.Lock()
	defer s.mu.Unlock()
	_, endpointIsNode := s.nodes[endpointHost]
	for ip, e := range s.signers {
		if !bytes.Equal(e.caCrt, caCrt) || e.signer.token != token {
			continue
		}
		switch {
		case discovery:
		case endpointIsNode && ip == endpointHost:
		case !endpointIsNode && endpointHost != "" && s.etcdRunningLocked(e.signer.clusterID):
		default:
			continue
		}
		return e.signer, true
	}
	return signer{}, false
}

type signerEntry struct {
	caCrt  []byte
	signer signer
}
