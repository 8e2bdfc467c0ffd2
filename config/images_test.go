package config

import (
	"strings"
	"testing"

	"github.com/homelab/bootstrap/factory"
)

func TestImagesDerivedFromTheSchematic(t *testing.T) {
	cfg, err := Parse("testdata/good/three-plus-two.yaml", mustRead(t, "testdata/good/three-plus-two.yaml"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Proxmox.ISO = ISO{}
	cfg.Cluster.InstallImage = ""
	im := cfg.Images()
	guest := factory.New([]string{factory.GuestAgent}, nil).MustID()
	if im.SchematicID != guest || !im.GuestAgent || !im.ISODerived || !im.InstallerDerived {
		t.Fatalf("default schematic: %+v", im)
	}
	if want := "factory.talos.dev/nocloud-installer/" + guest + ":" + cfg.Cluster.TalosVersion; im.InstallImage != want {
		t.Errorf("installer %s, want %s", im.InstallImage, want)
	}
	if !strings.Contains(im.ISOURL, "/image/"+guest+"/") || !strings.Contains(im.ISOFile, factory.ShortID(guest)) {
		t.Errorf("ISO %s %s", im.ISOURL, im.ISOFile)
	}
	// Reordering the list is the same schematic (no rollout for it).
	cfg.Cluster.Schematic.Extensions = []string{"siderolabs/intel-ucode", factory.GuestAgent, "siderolabs/i915"}
	a := cfg.Images().SchematicID
	cfg.Cluster.Schematic.Extensions = []string{"siderolabs/i915", "siderolabs/intel-ucode", factory.GuestAgent}
	if b := cfg.Images().SchematicID; a != b {
		t.Errorf("reordered extensions changed the schematic: %s %s", a, b)
	}
	// Without the guest agent the VMs get agent: 0.
	cfg.Cluster.Schematic.Extensions = []string{}
	if im := cfg.Images(); im.GuestAgent || im.SchematicID != factory.New(nil, nil).MustID() {
		t.Errorf("empty schematic: %+v", im)
	}
	// Explicit images win; another version's installer follows the schematic.
	cfg.Cluster.InstallImage = "ghcr.io/siderolabs/installer:" + cfg.Cluster.TalosVersion
	cfg.Proxmox.ISO = ISO{URL: "https://example.org/talos.iso", File: "talos.iso"}
	if im := cfg.Images(); im.ISODerived || im.InstallerDerived || im.ISOFile != "talos.iso" || cfg.InstallImageFor("v1.13.9") != cfg.Cluster.InstallImage {
		t.Errorf("explicit images: %+v", im)
	}
}

func TestExplicitISOAndInstallerDisagree(t *testing.T) {
	cfg, err := Parse("testdata/good/three-plus-two.yaml", mustRead(t, "testdata/good/three-plus-two.yaml"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	other := factory.New([]string{"siderolabs/i915"}, nil).MustID()
	cfg.Proxmox.ISO = ISO{URL: "https://factory.talos.dev/image/" + other + "/" + cfg.Cluster.TalosVersion + "/nocloud-amd64.iso", File: "talos.iso"}
	cfg.Cluster.InstallImage = ""
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, w := range cfg.Warnings() {
		if w.Path == "proxmox.iso.url" && strings.Contains(w.Msg, "different schematics") {
			found = true
		}
	}
	if !found {
		t.Errorf("no warning for an ISO of another schematic: %v", cfg.Warnings())
	}
}
