package imagefactory

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/factory"
)

// The lab factory serves a schematic's Secure Boot ISO and installer, and
// tells its Secure Boot ISO from the plain one; one without signing keys
// refuses both as the factory does ("secure boot is disabled").
func TestSecureBootAssets(t *testing.T) {
	ctx := context.Background()
	for _, keys := range []bool{true, false} {
		s, c := start(t, Options{NoSecureBoot: !keys})
		sc := factory.New([]string{"siderolabs/qemu-guest-agent"}, nil)
		if _, err := c.Register(ctx, sc); err != nil {
			t.Fatal(err)
		}
		img := factory.Images{Factory: s.URL(), ID: sc.MustID(), Version: "v1.13.3"}
		if !s.SecureBootISO(img.SecureBootISOURL()) || s.SecureBootISO(img.ISOURL()) {
			t.Error("SecureBootISO does not tell the ISOs apart")
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodHead, img.SecureBootISOURL(), nil)
		resp, err := httpClient(s).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		_, _, pullErr := s.Installer(img.SecureBootInstaller())
		switch {
		case keys && (resp.StatusCode != http.StatusOK || pullErr != nil):
			t.Errorf("with keys: ISO %d, installer %v", resp.StatusCode, pullErr)
		case !keys && (resp.StatusCode != http.StatusBadRequest || pullErr == nil || !strings.Contains(pullErr.Error(), "secure boot is disabled")):
			t.Errorf("without keys: ISO %d, installer %v", resp.StatusCode, pullErr)
		}
		if _, _, err := s.Installer(img.Installer()); err != nil {
			t.Errorf("plain installer (keys %v): %v", keys, err)
		}
	}
}
