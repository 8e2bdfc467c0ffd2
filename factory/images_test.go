package factory

import "testing"

func TestImagesFollowTheFactory(t *testing.T) {
	id := New([]string{"siderolabs/qemu-guest-agent"}, nil).MustID()
	img := Images{Factory: "https://factory.talos.dev/", ID: id, Version: "v1.13.3"}
	if got, want := img.ISOURL(), "https://factory.talos.dev/image/"+id+"/v1.13.3/nocloud-amd64.iso"; got != want {
		t.Errorf("ISO URL %s, want %s", got, want)
	}
	if got, want := img.Installer(), "factory.talos.dev/nocloud-installer/"+id+":v1.13.3"; got != want {
		t.Errorf("installer %s, want %s", got, want)
	}
	// Before Talos 1.10 the factory names the metal installer.
	old := Images{Factory: "https://factory.example:8443", ID: id, Version: "v1.9.5"}
	if got, want := old.Installer(), "factory.example:8443/installer/"+id+":v1.9.5"; got != want {
		t.Errorf("installer %s, want %s", got, want)
	}
	if got := img.ISOFile(); got != "talos-v1.13.3-ce4c980550dd-nocloud-amd64.iso" {
		t.Errorf("ISO file %s", got)
	}
	ref, ok := ParseInstaller(img.Installer())
	if !ok || ref.ID != id || ref.Version != "v1.13.3" || ref.Name != "nocloud-installer" || ref.Host != "factory.talos.dev" {
		t.Errorf("ParseInstaller: %+v %v", ref, ok)
	}
	if _, ok := ParseInstaller("ghcr.io/siderolabs/installer:v1.13.3"); ok {
		t.Error("the vanilla installer parsed as a factory one")
	}
	gotID, ver, ok := ParseISOURL(img.ISOURL())
	if !ok || gotID != id || ver != "v1.13.3" {
		t.Errorf("ParseISOURL: %s %s %v", gotID, ver, ok)
	}
	if _, _, ok := ParseISOURL("https://github.com/siderolabs/talos/releases/download/v1.13.3/metal-amd64.iso"); ok {
		t.Error("a release URL parsed as a factory one")
	}
}

// The disk image's virtual size follows Talos' expected nocloud-amd64
// profiles (pkg/imager/profile/testdata at v1.13.3 and v1.14.0-rc.1: diskSize 1306525696,
// 2356150272, 4453302272 bytes).
func TestDiskImageBytesFollowsTheImager(t *testing.T) {
	for version, want := range map[string]int64{"v1.9.6": 1306525696, "v1.10.0": 2356150272, "v1.11.5": 4453302272, "v1.13.3": 4453302272, "1.12.0": 4453302272, "v1.14.1": 4453302272} {
		if got := DiskImageBytes(version); got != want {
			t.Errorf("%s: %d bytes, want %d", version, got, want)
		}
	}
}
