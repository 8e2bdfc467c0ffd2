package proxmox

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/rs/zerolog"
)

// PinError means the server presented a certificate whose SHA-256
// fingerprint is not the pinned one.
type PinError struct {
	Want, Got string
}

func (e *PinError) Error() string {
	return fmt.Sprintf("TLS certificate fingerprint mismatch: pinned %s, server presented %s (if the Proxmox certificate was renewed, update the pinned fingerprint)", e.Want, e.Got)
}

// UnknownAuthorityError means the server's certificate did not verify
// against the configured (or system) roots; it carries the fingerprint the
// server presented so the user can pin it.
type UnknownAuthorityError struct {
	Err         error
	Fingerprint string
}

func (e *UnknownAuthorityError) Error() string {
	return fmt.Sprintf("verifying the Proxmox TLS certificate: %v; the server presented SHA-256 fingerprint %s: pin it (tls fingerprint) after checking it in the Proxmox GUI (node > System > Certificates), or give the CA file", e.Err, e.Fingerprint)
}

func (e *UnknownAuthorityError) Unwrap() error { return e.Err }

// FormatFingerprint renders a SHA-256 fingerprint as the Proxmox GUI shows
// it: upper-case hex pairs joined by colons.
func FormatFingerprint(sum []byte) string {
	parts := make([]string, len(sum))
	for i, b := range sum {
		parts[i] = fmt.Sprintf("%02X", b)
	}
	return strings.Join(parts, ":")
}

// normalizeFingerprint accepts "AB:CD:..", "ab cd ..", "abcd.." and
// "sha256:.." forms and returns 64 lower-case hex digits.
func normalizeFingerprint(fp string) (string, error) {
	fp = strings.ToLower(strings.TrimSpace(fp))
	fp = strings.TrimPrefix(fp, "sha256:")
	fp = strings.NewReplacer(":", "", " ", "", "-", "").Replace(fp)
	if len(fp) != 64 {
		return "", fmt.Errorf("TLS fingerprint must be a SHA-256 (64 hex digits), got %d digits", len(fp))
	}
	if _, err := hex.DecodeString(fp); err != nil {
		return "", fmt.Errorf("TLS fingerprint is not hex: %w", err)
	}
	return fp, nil
}

// tlsConfig builds the client TLS settings: a pinned leaf fingerprint, a CA
// file, or both; insecure only when asked for, and then loudly.
func tlsConfig(o Options, serverName string, log zerolog.Logger) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	var roots *x509.CertPool
	if o.CAFile != "" || len(o.CAPEM) > 0 {
		pem := o.CAPEM
		if o.CAFile != "" {
			b, err := os.ReadFile(o.CAFile)
			if err != nil {
				return nil, fmt.Errorf("reading Proxmox CA file: %w", err)
			}
			pem = b
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, errors.New("the Proxmox CA file holds no PEM certificate")
		}
	}
	var pin string
	if o.Fingerprint != "" {
		fp, err := normalizeFingerprint(o.Fingerprint)
		if err != nil {
			return nil, err
		}
		pin = fp
	}
	if o.Insecure {
		if pin != "" || roots != nil {
			return nil, errors.New("insecure TLS cannot be combined with a pinned fingerprint or CA file")
		}
		log.Warn().Msg("!!! Proxmox TLS verification is DISABLED (insecure: true): anyone on the network path can impersonate the Proxmox API and read the API token. Pin the certificate fingerprint instead.")
		cfg.InsecureSkipVerify = true
		return cfg, nil
	}
	// Verification happens in VerifyConnection so a failure can name the
	// fingerprint the server presented.
	cfg.InsecureSkipVerify = true
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the Proxmox API presented no certificate")
		}
		leaf := cs.PeerCertificates[0]
		sum := sha256.Sum256(leaf.Raw)
		if pin != "" {
			if hex.EncodeToString(sum[:]) != pin {
				want, _ := hex.DecodeString(pin)
				return &PinError{Want: FormatFingerprint(want), Got: FormatFingerprint(sum[:])}
			}
			if roots == nil {
				return nil
			}
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: serverName})
		if err != nil {
			return &UnknownAuthorityError{Err: err, Fingerprint: FormatFingerprint(sum[:])}
		}
		return nil
	}
	return cfg, nil
}
