package imagefactory

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/factory"
)

func start(t *testing.T, o Options) (*Server, *factory.Client) {
	t.Helper()
	o.ISOSize = 1 << 20
	s, err := Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, s.CAPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := factory.NewClient(factory.ClientOptions{URL: s.URL(), CAFile: ca})
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// The product's client against the lab factory: the API round trip the
// provision stage makes.
func TestSchematicLifecycle(t *testing.T) {
	ctx := context.Background()
	s, c := start(t, Options{})
	sc := factory.New([]string{"siderolabs/i915", "siderolabs/intel-ucode", "siderolabs/qemu-guest-agent"}, nil)
	id := sc.MustID()
	img := factory.Images{Factory: s.URL(), ID: id, Version: "v1.13.3"}

	if known, err := c.Known(ctx, id); err != nil || known {
		t.Fatalf("known before registration: %v %v", known, err)
	}
	// The ISO of an unknown schematic is a 404, as wget would see it.
	resp, err := httpClient(s).Get(img.ISOURL())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("ISO of an unregistered schematic: HTTP %d", resp.StatusCode)
	}
	if registered, err := c.Ensure(ctx, sc); err != nil || !registered {
		t.Fatalf("Ensure: %v %v", registered, err)
	}
	if registered, err := c.Ensure(ctx, sc); err != nil || registered {
		t.Fatalf("second Ensure registered again: %v %v", registered, err)
	}
	if got := s.Counts().SchematicPosts; got != 1 {
		t.Errorf("%d POSTs, want 1", got)
	}

	// The community factory publishes no checksum (402).
	if _, ok, err := c.Checksum(ctx, img.ISOURL()); err != nil || ok {
		t.Errorf("checksum from a community factory: %v %v", ok, err)
	}
	resp, err = httpClient(s).Get(img.ISOURL())
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, _ := io.Copy(h, resp.Body)
	resp.Body.Close()
	if n != 1<<20 || hex.EncodeToString(h.Sum(nil)) != s.ISOSHA256(id, "v1.13.3", "nocloud-amd64.iso") {
		t.Errorf("ISO: %d bytes, checksum mismatch", n)
	}

	exts, pulled, err := s.Installer(img.Installer())
	if err != nil || !pulled {
		t.Fatalf("installer: %v %v", pulled, err)
	}
	names := []string{}
	for _, e := range exts {
		names = append(names, e.Name+"="+e.Version)
	}
	want := []string{"i915=v1.13.3", "intel-ucode=v1.13.3", "qemu-guest-agent=v1.13.3", "schematic=" + id}
	if len(names) != len(want) {
		t.Fatalf("extensions %v, want %v", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Errorf("extension %d: %s, want %s", i, names[i], want[i])
		}
	}
	if _, pulled, _ := s.Installer("ghcr.io/siderolabs/installer:v1.13.3"); pulled {
		t.Error("the vanilla installer resolved through the factory")
	}
}

func TestEnterpriseChecksumAndBadExtension(t *testing.T) {
	ctx := context.Background()
	s, c := start(t, Options{Enterprise: true})
	sc := factory.New([]string{"siderolabs/qemu-guest-agent"}, nil)
	if _, err := c.Register(ctx, sc); err != nil {
		t.Fatal(err)
	}
	img := factory.Images{Factory: s.URL(), ID: sc.MustID(), Version: "v1.13.3"}
	sum, ok, err := c.Checksum(ctx, img.ISOURL())
	if err != nil || !ok || sum != s.ISOSHA256(img.ID, "v1.13.3", "nocloud-amd64.iso") {
		t.Errorf("enterprise checksum: %q %v %v", sum, ok, err)
	}

	bad := factory.New([]string{"siderolabs/no-such-thing"}, nil)
	if _, err := c.Register(ctx, bad); err != nil {
		t.Fatalf("the factory checks extensions at build time, not at POST: %v", err)
	}
	badImg := factory.Images{Factory: s.URL(), ID: bad.MustID(), Version: "v1.13.3"}
	if _, _, err := s.Installer(badImg.Installer()); err == nil {
		t.Error("an installer with an unknown extension was pulled")
	}
	list, err := c.Extensions(ctx, "v1.13.3")
	if err != nil || len(list) != len(DefaultExtensions) || list[0].Ref == "" {
		t.Errorf("extensions: %d %v", len(list), err)
	}
	var se *factory.StatusError
	if _, err := c.Extensions(ctx, "v0.1.0"); !errors.As(err, &se) || se.Code != 404 {
		t.Errorf("extensions of an unknown version: %v", err)
	}
	s.SetDown(true)
	if _, err := c.Versions(ctx); !factory.Unreachable(err) {
		t.Errorf("a down factory is not unreachable: %v", err)
	}
}

func httpClient(s *Server) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: s.CAPool(), MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr}
}

// A schematic may still list an extension by an old name the factory
// resolves (siderolabs/i915-ucode builds siderolabs/i915): the name the
// product expects a node to report is the one the built image reports.
func TestRenamedExtensionReportsItsNewName(t *testing.T) {
	ctx := context.Background()
	s, c := start(t, Options{})
	sc := factory.New([]string{"siderolabs/i915-ucode", "siderolabs/qemu-guest-agent"}, nil)
	if _, err := c.Ensure(ctx, sc); err != nil {
		t.Fatal(err)
	}
	img := factory.Images{Factory: s.URL(), ID: sc.MustID(), Version: "v1.13.3"}
	exts, _, err := s.Installer(img.Installer())
	if err != nil {
		t.Fatal(err)
	}
	reported := map[string]bool{}
	for _, e := range exts {
		reported[e.Name] = true
	}
	for _, name := range sc.Extensions() {
		if !reported[factory.ManifestName(name)] {
			t.Errorf("%s: the product expects %q, the node reports %v", name, factory.ManifestName(name), exts)
		}
	}
}

// A schematic with its extensions in another order is another ID (the
// factory hashes them as written); Get returns what was registered, and
// the product's SameImage sees through the order.
func TestReorderedSchematicIsAnotherIDWithTheSameImage(t *testing.T) {
	ctx := context.Background()
	_, c := start(t, Options{})
	a := factory.New([]string{"siderolabs/i915", "siderolabs/qemu-guest-agent"}, nil)
	b := factory.New([]string{"siderolabs/qemu-guest-agent", "siderolabs/i915"}, nil)
	for _, s := range []factory.Schematic{a, b} {
		if _, err := c.Register(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if a.MustID() == b.MustID() {
		t.Fatal("the reordered schematic got the same ID")
	}
	got, err := c.Get(ctx, b.MustID())
	if err != nil {
		t.Fatal(err)
	}
	if got.MustID() != b.MustID() || !got.SameImage(a) {
		t.Errorf("Get: %+v (ID %s), want the registered order and the same image as %v", got, got.MustID(), a.Extensions())
	}
	var se *factory.StatusError
	if _, err := c.Get(ctx, strings.Repeat("0", 64)); !errors.As(err, &se) || se.Code != http.StatusNotFound {
		t.Errorf("Get of an unknown schematic: %v, want a 404", err)
	}
}
