// Package imagefactory is the lab's Talos Image Factory: the HTTP API of
// siderolabs/image-factory v1.5.0 (internal/frontend/http/http.go) that
// this tool uses, over HTTPS with a lab CA: schematics (POST, GET), the
// Talos versions and their official extensions, and the images (the
// nocloud ISO; its .sha256 only when configured as an Enterprise factory).
// It builds nothing: an ISO is deterministic filler bytes named by
// schematic and version, and an installer image is resolved to the
// extensions it carries for the lab's simulated Talos nodes.
package imagefactory

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/factory"
	"github.com/homelab/bootstrap/lab/labca"
	"github.com/homelab/bootstrap/lab/qcow2"
)

// Options shape the lab factory.
type Options struct {
	// Versions are the Talos versions it builds (default v1.12.6, v1.13.3,
	// v1.14.1).
	Versions []string
	// Extensions are the official extensions of every version (default
	// DefaultExtensions).
	Extensions []factory.ExtensionInfo
	// ISOSize is the size of every ISO it serves (default 100 MiB).
	ISOSize int64
	// ImageSize is the size of every qcow2 disk image it serves (default
	// ISOSize: the image carries the same kernel and initramfs in its boot
	// partition, its other clusters unallocated; the real file's size is
	// unverified, an estimate).
	ImageSize int64
	// Enterprise serves <image>.sha256 as an Enterprise factory does; the
	// community build answers 402.
	Enterprise bool
	// NoSecureBoot is a factory without Secure Boot signing keys: its
	// Secure Boot assets fail to build (see secureboot.go).
	NoSecureBoot bool
	Log          zerolog.Logger
}

// DefaultExtensions are the lab's official extensions: the N100 example's
// three and a few others, with the authors of their manifests
// (siderolabs/extensions v1.13.3 */manifest.yaml.tmpl). Refs and digests
// are the lab's own.
var DefaultExtensions = []factory.ExtensionInfo{
	{Name: "siderolabs/i915", Author: "Sidero Labs", Description: "Intel i915 GPU drivers and firmware"},
	{Name: "siderolabs/intel-ucode", Author: "Sidero Labs", Description: "Intel microcode"},
	{Name: "siderolabs/iscsi-tools", Author: "Sidero Labs", Description: "iSCSI tools"},
	{Name: "siderolabs/qemu-guest-agent", Author: "Markus Reiter", Description: "QEMU guest agent"},
	{Name: "siderolabs/util-linux-tools", Author: "Sidero Labs", Description: "util-linux tools"},
}

// Server is a running lab factory.
type Server struct {
	opts   Options
	log    zerolog.Logger
	srv    *http.Server
	lis    net.Listener
	url    string
	caPEM  []byte
	caPool *x509.CertPool

	mu         sync.Mutex
	schematics map[string][]byte // ID → canonical YAML
	counts     Counts
	down       bool
}

// Counts are the requests the factory answered, by kind.
type Counts struct {
	SchematicPosts, SchematicGets, ExtensionLists, ISODownloads, ImageDownloads, ChecksumGets, InstallerPulls int
}

// Start serves the factory on a loopback port.
func Start(o Options) (*Server, error) {
	if len(o.Versions) == 0 {
		o.Versions = []string{"v1.12.6", "v1.13.3", "v1.14.1"}
	}
	if o.Extensions == nil {
		o.Extensions = DefaultExtensions
	}
	if o.ISOSize == 0 {
		o.ISOSize = 100 << 20
	}
	if o.ImageSize == 0 {
		o.ImageSize = o.ISOSize
	}
	s := &Server{opts: o, log: o.Log.With().Str("component", "imagefactory").Logger(), schematics: map[string][]byte{}}
	cert, err := s.newCerts()
	if err != nil {
		return nil, err
	}
	if s.lis, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, err
	}
	s.url = "https://" + s.lis.Addr().String()
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	go func() { _ = s.srv.ServeTLS(s.lis, "", "") }()
	return s, nil
}

// URL is the factory's base URL (https://127.0.0.1:port).
func (s *Server) URL() string { return s.url }

// Host is the factory's host:port, the registry host of its installers.
func (s *Server) Host() string { return strings.TrimPrefix(s.url, "https://") }

// CAPEM is the CA that signed the factory's certificate.
func (s *Server) CAPEM() []byte { return s.caPEM }

// CAPool is CAPEM as a pool.
func (s *Server) CAPool() *x509.CertPool { return s.caPool }

// Counts is what the factory answered so far.
func (s *Server) Counts() Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts
}

// SetDown makes the factory unreachable (connections reset) or back.
func (s *Server) SetDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

// Stop shuts the factory down.
func (s *Server) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	down := s.down
	s.mu.Unlock()
	if down {
		// Abort the connection (HTTP/1) or the stream (HTTP/2): the client
		// sees a network error, as with a factory it cannot reach.
		panic(http.ErrAbortHandler)
	}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	get := r.Method == http.MethodGet
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/schematics":
		s.schematicCreate(w, r)
	case get && len(parts) == 2 && parts[0] == "schematics":
		s.schematicGet(w, parts[1])
	case get && r.URL.Path == "/versions":
		writeJSON(w, s.opts.Versions)
	case get && len(parts) == 4 && parts[0] == "version" && parts[2] == "extensions" && parts[3] == "official":
		s.extensions(w, parts[1])
	case (get || r.Method == http.MethodHead) && len(parts) == 4 && parts[0] == "image":
		s.image(w, r, parts[1], parts[2], parts[3])
	default:
		// httprouter's NotFound (unverified: its exact body).
		http.Error(w, "404 page not found", http.StatusNotFound)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// schematicCreate is handleSchematicCreate (configuration.go): unmarshal
// with known fields only (400 otherwise), store under its ID, answer 201
// with the ID and the normalised YAML. Extensions are not checked here;
// the factory checks them when it builds an image.
func (s *Server) schematicCreate(w http.ResponseWriter, r *http.Request) {
	data, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	sc, err := factory.Unmarshal(data)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	norm, err := sc.Marshal()
	if err != nil {
		http.Error(w, "internal server error", http.StatusInternalServerError)
		return
	}
	id := sc.MustID()
	s.mu.Lock()
	s.counts.SchematicPosts++
	s.schematics[id] = norm
	s.mu.Unlock()
	s.log.Debug().Str("schematic", id).Msg("imagefactory: schematic registered")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(struct {
		ID        string `json:"id"`
		Schematic string `json:"schematic"`
	}{id, string(norm)})
}

// schematicGet is handleSchematicGet: the YAML, or 404 "schematic not found".
func (s *Server) schematicGet(w http.ResponseWriter, id string) {
	s.mu.Lock()
	s.counts.SchematicGets++
	data, ok := s.schematics[id]
	s.mu.Unlock()
	if !ok {
		http.Error(w, "schematic not found", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(data)
}

// extensions is handleOfficialExtensions (meta.go). For a version the
// factory does not build the real answer is unverified; the lab answers 404.
func (s *Server) extensions(w http.ResponseWriter, version string) {
	if !strings.HasPrefix(version, "v") {
		version = "v" + version
	}
	if !slices.Contains(s.opts.Versions, version) {
		http.Error(w, "version not found", http.StatusNotFound)
		return
	}
	s.mu.Lock()
	s.counts.ExtensionLists++
	s.mu.Unlock()
	out := make([]factory.ExtensionInfo, 0, len(s.opts.Extensions))
	for _, e := range s.opts.Extensions {
		e.Ref = fmt.Sprintf("ghcr.io/%s:%s", e.Name, version)
		sum := sha256.Sum256([]byte(e.Ref))
		e.Digest = "sha256:" + hex.EncodeToString(sum[:])
		out = append(out, e)
	}
	writeJSON(w, out)
}

// build resolves what the factory would build for a schematic and version
// (EnhanceFromSchematic, internal/profile/profile.go): every official
// extension must exist for the version ("official extension %q is not
// available for Talos version %s", 400), old names through the aliases.
func (s *Server) build(id, version string) (factory.Schematic, []factory.ExtensionInfo, int, error) {
	s.mu.Lock()
	data, ok := s.schematics[id]
	s.mu.Unlock()
	if !ok {
		return factory.Schematic{}, nil, http.StatusNotFound, errors.New("schematic not found")
	}
	if !strings.HasPrefix(version, "v") {
		version = "v" + version
	}
	if !slices.Contains(s.opts.Versions, version) {
		// Unverified: the factory's answer for a version it does not build.
		return factory.Schematic{}, nil, http.StatusNotFound, fmt.Errorf("version %s not found", version)
	}
	sc, err := factory.Unmarshal(data)
	if err != nil {
		return factory.Schematic{}, nil, http.StatusInternalServerError, err
	}
	cat := factory.Catalog{Extensions: s.opts.Extensions}
	var exts []factory.ExtensionInfo
	for _, name := range sc.Extensions() {
		e, _, ok := cat.Lookup(name)
		if !ok {
			return sc, nil, http.StatusBadRequest, fmt.Errorf("error enhancing profile from schematic: official extension %q is not available for Talos version %s", name, version)
		}
		exts = append(exts, e)
	}
	return sc, exts, http.StatusOK, nil
}

// image is handleImage (image.go) for ISOs, <platform>-<arch>.iso, and
// qcow2 disk images, <platform>-<arch>.qcow2 (ParseFromPath,
// internal/profile/profile.go), with .sha256/.sha512 answered 402 unless
// Enterprise.
func (s *Server) image(w http.ResponseWriter, r *http.Request, id, version, file string) {
	want := ""
	for _, suf := range []string{".sha256", ".sha512"} {
		if f, ok := strings.CutSuffix(file, suf); ok {
			file, want = f, suf
		}
	}
	if want != "" && !s.opts.Enterprise {
		http.Error(w, "enterprise not enabled: checksum endpoint is not available", http.StatusPaymentRequired)
		return
	}
	if _, _, code, err := s.build(id, version); err != nil {
		http.Error(w, err.Error(), code)
		return
	}
	if err := s.secureBootAsset(file); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if (path.Ext(file) != ".iso" && path.Ext(file) != ".qcow2") || !strings.Contains(file, "-") {
		// The lab builds ISOs and qcow2 disk images only.
		http.Error(w, "error parsing profile from path: unsupported in the lab: "+file, http.StatusBadRequest)
		return
	}
	if want == ".sha256" || want == ".sha512" {
		s.mu.Lock()
		s.counts.ChecksumGets++
		s.mu.Unlock()
		if want == ".sha512" {
			http.Error(w, "the lab publishes sha256 only", http.StatusNotFound)
			return
		}
		// Format unverified (the Enterprise checksummer is not public):
		// sha256sum's "<hex>  <file>".
		_, _ = fmt.Fprintf(w, "%s  %s\n", s.ISOSHA256(id, version, file), file)
		return
	}
	size, ctype := s.opts.ISOSize, "application/x-iso9660-image"
	s.mu.Lock()
	if path.Ext(file) == ".qcow2" {
		s.counts.ImageDownloads++
		size, ctype = s.opts.ImageSize, "application/octet-stream"
	} else {
		s.counts.ISODownloads++
	}
	s.mu.Unlock()
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.Header().Set("Content-Type", ctype)
	w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="%s"`, file))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	_, _ = io.Copy(w, s.iso(id, version, file))
}

// ISOSHA256 is the SHA-256 of the image (ISO or disk image) the factory
// serves for a schematic, version and file name.
func (s *Server) ISOSHA256(id, version, file string) string {
	h := sha256.New()
	_, _ = io.Copy(h, s.iso(id, version, file))
	return hex.EncodeToString(h.Sum(nil))
}

// iso is the content of an image for a schematic, version and file name:
// filler bytes, after a qcow2 header of the nocloud image's virtual size
// for the version (factory.DiskImageBytes) for a .qcow2 disk image.
func (s *Server) iso(id, version, file string) io.Reader {
	r := &isoReader{seed: sha256.Sum256([]byte(id + "/" + version + "/" + file)), size: s.opts.ISOSize}
	if path.Ext(file) != ".qcow2" {
		return r
	}
	h := qcow2.Header(factory.DiskImageBytes(version))
	r.size = s.opts.ImageSize - int64(len(h))
	return io.MultiReader(bytes.NewReader(h), r)
}

// isoReader yields size bytes: seed repeated, so each image differs. It
// copies from the seed tiled once, not byte by byte: the lab serves
// 100 MiB per VM download on the same cores as the run it measures.
type isoReader struct {
	seed  [32]byte
	off   int64
	size  int64
	tiled []byte
}

func (r *isoReader) Read(p []byte) (int, error) {
	if r.off >= r.size {
		return 0, io.EOF
	}
	if r.tiled == nil {
		r.tiled = bytes.Repeat(r.seed[:], 2048)
	}
	if rest := r.size - r.off; int64(len(p)) > rest {
		p = p[:rest]
	}
	n := 0
	for n < len(p) {
		start := int((r.off + int64(n)) % int64(len(r.seed)))
		n += copy(p[n:], r.tiled[start:])
	}
	r.off += int64(n)
	return n, nil
}

// Extension is one system extension as a Talos node reports it
// (ExtensionStatus spec metadata): name and version from its manifest.
type Extension struct {
	Name, Version, Author, Description string
}

// Installer resolves an installer image the factory serves
// (<host>/[<platform>-]installer/<id>:<version>, registry.go) to the
// extensions a node installed from it runs: the official ones by their
// manifest names — the last element of the factory name, as for
// qemu-guest-agent, i915 and intel-ucode in siderolabs/extensions v1.13.3 —
// then the factory's virtual "schematic" extension whose version is the
// schematic ID (internal/artifacts/schematic.go). An image of another
// registry is not the factory's (nil, false) and carries no extension: the
// stock ghcr.io/siderolabs/installer is built with no
// --system-extension-image (talos v1.13.3 Makefile, target installer). One
// the factory cannot build fails the pull.
func (s *Server) Installer(image string) ([]Extension, bool, error) {
	ref, ok := factory.ParseInstaller(image)
	if !ok || ref.Host != s.Host() {
		return nil, false, nil
	}
	s.mu.Lock()
	s.counts.InstallerPulls++
	s.mu.Unlock()
	if strings.HasSuffix(ref.Name, "-secureboot") {
		if err := s.secureBootAsset(ref.Name); err != nil {
			return nil, true, fmt.Errorf("pulling %s: %w", image, err)
		}
	}
	out, err := s.builtExtensions(ref.ID, ref.Version)
	if err != nil {
		return nil, true, fmt.Errorf("pulling %s: %w", image, err)
	}
	return out, true, nil
}

// builtExtensions are the extensions an image of schematic id for version
// runs: the official ones by manifest name, then the virtual "schematic".
func (s *Server) builtExtensions(id, version string) ([]Extension, error) {
	_, exts, _, err := s.build(id, version)
	if err != nil {
		return nil, err
	}
	out := make([]Extension, 0, len(exts)+1)
	for _, e := range exts {
		out = append(out, Extension{Name: factory.ManifestName(e.Name), Version: version, Author: e.Author, Description: e.Description})
	}
	out = append(out, Extension{Name: factory.SchematicExtension, Version: id, Author: "Image Factory (" + s.url + ")",
		Description: "Virtual extension which specifies the schematic of the image built with schematic."})
	return out, nil
}

// DiskImage resolves the URL of a disk image this factory serves
// (…/image/<id>/<version>/nocloud-amd64.qcow2) to what a VM whose disk was
// imported from it boots: the image's Talos version and the extensions of
// its schematic, as Installer resolves an installer. ok is false for any
// other URL.
func (s *Server) DiskImage(url string) (version string, exts []Extension, ok bool, err error) {
	if !strings.HasPrefix(url, s.url+"/") || path.Ext(url) != ".qcow2" {
		return "", nil, false, nil
	}
	id, version, ok := factory.ParseISOURL(url)
	if !ok {
		return "", nil, false, nil
	}
	exts, err = s.builtExtensions(id, version)
	return version, exts, true, err
}

func (s *Server) newCerts() (tls.Certificate, error) {
	is, err := labca.Issue(labca.Spec{
		CA: pkix.Name{CommonName: "lab image factory CA"}, Leaf: pkix.Name{CommonName: "factory.lab"},
		DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		CALifetime: 365 * 24 * time.Hour, LeafLifetime: 365 * 24 * time.Hour,
	})
	if err != nil {
		return tls.Certificate{}, err
	}
	s.caPEM, s.caPool = is.CAPEM, is.Pool()
	return is.Leaf, nil
}
