package talos

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"slices"
	"time"

	cryptox509 "github.com/siderolabs/crypto/x509"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/role"
)

// RenewBefore is how long an existing client certificate (the
// talosconfig's, the admin kubeconfig's) must still be valid to be kept;
// below it a run mints or fetches a fresh one, so a cluster whose runs
// come at least that often never meets an expired one (Talos issues both
// for one year: constants.TalosAPIDefaultCertificateValidityDuration,
// KubernetesAdminCertDefaultLifetime).
const RenewBefore = 30 * 24 * time.Hour

// RenderTalosconfig builds the admin talosconfig (context named after the
// cluster) for the bundle's OS CA. The client certificate carries a fresh
// key and its own validity window, so minting one on every run would churn
// the file: an existing certificate from existing is reused when it chains
// to this bundle's CA, has the admin role and stays valid for 30 more days.
func RenderTalosconfig(bundle *secrets.Bundle, cluster string, endpoints, nodes []string, existing []byte, now time.Time) ([]byte, error) {
	caPEM := bundle.Certs.OS.Crt
	ctx := &clientconfig.Context{
		Endpoints: slices.Clone(endpoints),
		Nodes:     slices.Clone(nodes),
		CA:        base64.StdEncoding.EncodeToString(caPEM),
	}
	if crt, key, ok := reusableClientCert(existing, cluster, caPEM, now); ok {
		ctx.Crt, ctx.Key = crt, key
	} else {
		cert, err := secrets.NewAdminCertificateAndKey(now, bundle.Certs.OS, role.MakeSet(role.Admin),
			constants.TalosAPIDefaultCertificateValidityDuration)
		if err != nil {
			return nil, fmt.Errorf("issuing the talosconfig client certificate: %w", err)
		}
		ctx.Crt = base64.StdEncoding.EncodeToString(cert.Crt)
		ctx.Key = base64.StdEncoding.EncodeToString(cert.Key)
	}
	cfg := &clientconfig.Config{Context: cluster, Contexts: map[string]*clientconfig.Context{cluster: ctx}}
	out, err := cfg.Bytes()
	if err != nil {
		return nil, fmt.Errorf("encoding talosconfig: %w", err)
	}
	return out, nil
}

func reusableClientCert(existing []byte, cluster string, caPEM []byte, now time.Time) (crt, key string, ok bool) {
	if len(existing) == 0 {
		return "", "", false
	}
	cfg, err := clientconfig.FromBytes(existing)
	if err != nil {
		return "", "", false
	}
	c := cfg.Contexts[cluster]
	if c == nil || c.Crt == "" || c.Key == "" {
		return "", "", false
	}
	ca, err := base64.StdEncoding.DecodeString(c.CA)
	if err != nil || !bytes.Equal(bytes.TrimSpace(ca), bytes.TrimSpace(caPEM)) {
		return "", "", false
	}
	crtPEM, err := base64.StdEncoding.DecodeString(c.Crt)
	if err != nil {
		return "", "", false
	}
	keyPEM, err := base64.StdEncoding.DecodeString(c.Key)
	if err != nil {
		return "", "", false
	}
	if err := checkClientCert(crtPEM, keyPEM, caPEM, now.Add(RenewBefore)); err != nil {
		return "", "", false
	}
	return c.Crt, c.Key, true
}

// checkClientCert verifies that crtPEM is an admin client certificate
// issued by caPEM, valid at the instant at, and that keyPEM matches it.
func checkClientCert(crtPEM, keyPEM, caPEM []byte, at time.Time) error {
	block, _ := pem.Decode(crtPEM)
	if block == nil {
		return fmt.Errorf("no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("bad CA PEM")
	}
	if _, err := cert.Verify(x509.VerifyOptions{
		Roots: roots, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return err
	}
	if !slices.Contains(cert.Subject.Organization, string(role.Admin)) {
		return fmt.Errorf("certificate lacks the %s role", role.Admin)
	}
	pair := &cryptox509.PEMEncodedCertificateAndKey{Crt: crtPEM, Key: keyPEM}
	if _, err := pair.GetCert(); err != nil {
		return err
	}
	if _, err := pair.GetKey(); err != nil {
		return err
	}
	return nil
}
