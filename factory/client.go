package factory

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"
)

// Client talks to an Image Factory over its HTTP API (the routes of
// internal/frontend/http/http.go at image-factory v1.5.0).
type Client struct {
	base string
	http *http.Client
}

// ClientOptions configure a Client.
type ClientOptions struct {
	// URL is the factory's base URL (DefaultURL when empty).
	URL string
	// CAFile, when set, is the only CA the factory's certificate is
	// verified against (a self-hosted factory with a private CA); the
	// system's roots otherwise.
	CAFile string
	// Timeout bounds each request (30 s when zero).
	Timeout time.Duration
}

// NewClient builds a client; it makes no call.
func NewClient(o ClientOptions) (*Client, error) {
	base := strings.TrimSuffix(o.URL, "/")
	if base == "" {
		base = DefaultURL
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("image factory CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("image factory CA: %s holds no PEM certificate", o.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &Client{base: base, http: &http.Client{Transport: tr, Timeout: o.Timeout}}, nil
}

// URL is the factory's base URL.
func (c *Client) URL() string { return c.base }

// StatusError is a factory answer other than the one expected.
type StatusError struct {
	Method, URL string
	Code        int
	Body        string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("image factory: %s %s: HTTP %d %s", e.Method, e.URL, e.Code, strings.TrimSpace(e.Body))
}

// Unreachable reports whether err means the factory could not be asked at
// all (network, TLS, timeout) rather than that it answered.
func Unreachable(err error) bool {
	var se *StatusError
	return err != nil && !errors.As(err, &se) && !errors.Is(err, context.Canceled)
}

func (c *Client) do(ctx context.Context, method, path, contentType string, body []byte) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("image factory %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("image factory %s: reading %s: %w", c.base, path, err)
	}
	return resp.StatusCode, data, nil
}

func (c *Client) getJSON(ctx context.Context, path string, into any) error {
	code, data, err := c.do(ctx, http.MethodGet, path, "", nil)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return &StatusError{Method: "GET", URL: c.base + path, Code: code, Body: string(data)}
	}
	if err := json.Unmarshal(data, into); err != nil {
		return fmt.Errorf("image factory: GET %s%s: %w", c.base, path, err)
	}
	return nil
}

// Versions lists the Talos versions the factory builds (GET /versions,
// handleVersions in meta.go: a JSON array of "vX.Y.Z").
func (c *Client) Versions(ctx context.Context) ([]string, error) {
	var out []string
	return out, c.getJSON(ctx, "/versions", &out)
}

// ExtensionInfo is one official extension the factory offers for a Talos
// version (client.ExtensionInfo in pkg/client/client.go; name is the
// image's repository, e.g. siderolabs/qemu-guest-agent).
type ExtensionInfo struct {
	Name        string `json:"name"`
	Ref         string `json:"ref"`
	Digest      string `json:"digest"`
	Author      string `json:"author"`
	Description string `json:"description"`
}

// Extensions lists the official extensions for a Talos version (GET
// /version/:version/extensions/official, handleOfficialExtensions).
func (c *Client) Extensions(ctx context.Context, version string) ([]ExtensionInfo, error) {
	var out []ExtensionInfo
	return out, c.getJSON(ctx, "/version/"+version+"/extensions/official", &out)
}

// Known reports whether the factory holds the schematic (GET
// /schematics/:id: 200 with its YAML, 404 "schematic not found",
// handleSchematicGet in configuration.go).
func (c *Client) Known(ctx context.Context, id string) (bool, error) {
	code, data, err := c.do(ctx, http.MethodGet, "/schematics/"+id, "", nil)
	switch {
	case err != nil:
		return false, err
	case code == http.StatusOK:
		return true, nil
	case code == http.StatusNotFound:
		return false, nil
	}
	return false, &StatusError{Method: "GET", URL: c.base + "/schematics/" + id, Code: code, Body: string(data)}
}

// Get reads a schematic the factory holds (GET /schematics/:id,
// handleSchematicGet: its normalised YAML, 404 "schematic not found"). A
// schematic with customizations this tool does not declare (an overlay,
// meta values) is an error: it cannot be compared.
func (c *Client) Get(ctx context.Context, id string) (Schematic, error) {
	code, data, err := c.do(ctx, http.MethodGet, "/schematics/"+id, "", nil)
	if err != nil {
		return Schematic{}, err
	}
	if code != http.StatusOK {
		return Schematic{}, &StatusError{Method: "GET", URL: c.base + "/schematics/" + id, Code: code, Body: string(data)}
	}
	return Unmarshal(data)
}

// Register uploads the schematic (POST /schematics with its YAML; 201 and
// {"id", "schematic"}, handleSchematicCreate). The factory's ID must be the
// one computed here: if not, the images derived from the local ID would
// not be the ones the factory builds.
func (c *Client) Register(ctx context.Context, s Schematic) (string, error) {
	body, err := s.Marshal()
	if err != nil {
		return "", err
	}
	code, data, err := c.do(ctx, http.MethodPost, "/schematics", "application/yaml", body)
	if err != nil {
		return "", err
	}
	if code != http.StatusCreated && code != http.StatusOK {
		return "", &StatusError{Method: "POST", URL: c.base + "/schematics", Code: code, Body: string(data)}
	}
	var resp struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(data, &resp); err != nil {
		return "", fmt.Errorf("image factory: POST /schematics: %w", err)
	}
	if want := s.MustID(); resp.ID != want {
		return resp.ID, fmt.Errorf("image factory %s registered the schematic as %s where it hashes to %s here: its schematic format differs from this tool's", c.base, resp.ID, want)
	}
	return resp.ID, nil
}

// Ensure registers the schematic unless the factory already knows it;
// registered says whether it was uploaded now.
func (c *Client) Ensure(ctx context.Context, s Schematic) (registered bool, err error) {
	known, err := c.Known(ctx, s.MustID())
	if err != nil || known {
		return false, err
	}
	if _, err := c.Register(ctx, s); err != nil {
		return false, err
	}
	return true, nil
}

var hexSum = regexp.MustCompile(`(?i)\b[0-9a-f]{64}\b`)

// Checksum asks for the SHA-256 the factory publishes beside an image
// (<image URL>.sha256, image.go). Only an Enterprise factory serves it;
// the community build answers 402 Payment Required ("enterprise not
// enabled: checksum endpoint is not available"), and then ok is false. The
// checksum file's format is unverified (the Enterprise checksummer is not
// in the public source): the first 64-hex-digit word is taken.
func (c *Client) Checksum(ctx context.Context, imageURL string) (sum string, ok bool, err error) {
	path, found := strings.CutPrefix(imageURL, c.base)
	if !found {
		return "", false, fmt.Errorf("image factory: %s is not under %s", imageURL, c.base)
	}
	code, data, err := c.do(ctx, http.MethodGet, path+".sha256", "", nil)
	switch {
	case err != nil:
		return "", false, err
	case code == http.StatusPaymentRequired || code == http.StatusNotFound:
		return "", false, nil
	case code != http.StatusOK:
		return "", false, &StatusError{Method: "GET", URL: imageURL + ".sha256", Code: code, Body: string(data)}
	}
	m := hexSum.Find(data)
	if m == nil {
		return "", false, fmt.Errorf("image factory: %s.sha256 holds no SHA-256: %q", imageURL, firstLine(data))
	}
	return strings.ToLower(string(m)), true, nil
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}
