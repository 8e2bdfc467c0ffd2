package factory

import "testing"

// The Secure Boot assets' names, as the factory parses them
// (image-factory v1.5.0 profile.go, registry.go getRequestedImage).
func TestSecureBootAssetNames(t *testing.T) {
	id := "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba"
	im := Images{Factory: "https://factory.talos.dev/", ID: id, Version: "v1.13.3"}
	for got, want := range map[string]string{
		im.SecureBootISOURL():    "https://factory.talos.dev/image/" + id + "/v1.13.3/nocloud-amd64-secureboot.iso",
		im.SecureBootISOFile():   "talos-v1.13.3-376567988ad3-nocloud-amd64-secureboot.iso",
		im.SecureBootInstaller(): "factory.talos.dev/nocloud-installer-secureboot/" + id + ":v1.13.3",
		Images{Factory: "https://factory.talos.dev", ID: id, Version: "v1.9.5"}.SecureBootInstaller(): "factory.talos.dev/installer-secureboot/" + id + ":v1.9.5",
	} {
		if got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
	if !IsSecureBootInstaller(im.SecureBootInstaller()) || IsSecureBootInstaller(im.Installer()) {
		t.Error("IsSecureBootInstaller")
	}
	if id2, v, ok := ParseISOURL(im.SecureBootISOURL()); !ok || id2 != id || v != "v1.13.3" {
		t.Error("the Secure Boot ISO URL does not parse as a factory image URL")
	}
}
