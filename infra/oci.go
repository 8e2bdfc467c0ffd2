package infra

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/registry"
)

// OCIPlainHTTP reports whether the registry of an oci:// repository
// speaks plain HTTP only. The infra stage installs from such a registry
// without being told: Helm v3's registry client retries over HTTP when
// the TLS handshake is answered in HTTP (pkg/registry/fallback.go at
// v3.22.0). source-controller does not: it talks plain HTTP to a
// registry only when the HelmRepository says `insecure: true`
// (internal/helm/registry/client.go NewClient at v1.9.5), so a handover
// without it could never fetch the chart. The probe is the one Helm's
// fallback reacts to: a TLS handshake answered in HTTP.
func OCIPlainHTTP(ctx context.Context, repoURL string) (bool, error) {
	u, err := url.Parse(repoURL)
	if err != nil || u.Scheme != registry.OCIScheme || u.Host == "" {
		return false, fmt.Errorf("%q is not an oci://host/path repository", repoURL)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	host := u.Host
	if u.Port() == "" {
		host += ":443"
	}
	// Only whether the answer is TLS matters here: nothing is sent, so the
	// certificate is not judged (a private CA is still HTTPS).
	d := tls.Dialer{Config: &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12, InsecureSkipVerify: true}} //nolint:gosec // a probe that sends nothing

	conn, err := d.DialContext(ctx, "tcp", host)
	if err == nil {
		conn.Close()
		return false, nil
	}
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) && strings.HasPrefix(string(rh.RecordHeader[:]), "HTTP/") {
		return true, nil
	}
	return false, fmt.Errorf("probing %s over TLS: %w", u.Host, err)
}
