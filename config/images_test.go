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

// The VMs' agent option follows what gets installed: the stock installer
// carries no extensions, so the guest agent of the default schematic
// (which the derived ISO still boots) is gone after the install.
func TestGuestAgentFollowsTheInstaller(t *testing.T) {
	cfg, err := Parse("testdata/good/three-plus-two.yaml", mustRead(t, "testdata/good/three-plus-two.yaml"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Proxmox.ISO = ISO{}
	guest := factory.New([]string{factory.GuestAgent}, nil).MustID()
	for _, tc := range []struct {
		installer string
		agent     bool
	}{
		{"", true},
		{"ghcr.io/siderolabs/installer:" + cfg.Cluster.TalosVersion, false},
		{"registry.example.org/talos/installer:" + cfg.Cluster.TalosVersion, false},
		{"factory.talos.dev/nocloud-installer/" + guest + ":" + cfg.Cluster.TalosVersion, true},
	} {
		cfg.Cluster.InstallImage = tc.installer
		if im := cfg.Images(); im.GuestAgent != tc.agent || !im.ISODerived {
			t.Errorf("installer %q: guest agent %v, want %v", tc.installer, im.GuestAgent, tc.agent)
		}
	}
}

// warningsAbout runs validation and returns the warnings on path.
func warningsAbout(t *testing.T, cfg *Config, path string) []string {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, w := range cfg.Warnings() {
		if w.Path == path {
			out = append(out, w.Msg)
		}
	}
	return out
}

func TestInstallerOutsideTheSchematicWarns(t *testing.T) {
	cfg, err := Parse("testdata/good/three-plus-two.yaml", mustRead(t, "testdata/good/three-plus-two.yaml"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	v := cfg.Cluster.TalosVersion
	cfg.Proxmox.ISO = ISO{}
	// The stock installer under the derived ISO: the agent is gone after
	// the install, and the message says so and how to keep it.
	cfg.Cluster.InstallImage = "ghcr.io/siderolabs/installer:" + v
	ws := warningsAbout(t, cfg, "cluster.installImage")
	if len(ws) != 1 || !strings.Contains(ws[0], "is not an Image Factory installer") || !strings.Contains(ws[0], "agent: 0") || !strings.Contains(ws[0], "siderolabs/qemu-guest-agent") {
		t.Errorf("stock installer: %q", ws)
	}
	// Without extensions there is nothing to lose.
	cfg.Cluster.Schematic.Extensions = []string{}
	if ws := warningsAbout(t, cfg, "cluster.installImage"); len(ws) != 0 {
		t.Errorf("stock installer, empty schematic: %q", ws)
	}
	// A factory installer of another schematic: the ISO (derived) and the
	// installer differ, and cluster.schematic does not describe what runs.
	cfg.Cluster.Schematic.Extensions = []string{factory.GuestAgent}
	other := factory.New([]string{"siderolabs/i915"}, nil).MustID()
	cfg.Cluster.InstallImage = "factory.talos.dev/nocloud-installer/" + other + ":" + v
	ws = warningsAbout(t, cfg, "cluster.installImage")
	if len(ws) != 2 || !strings.Contains(ws[0], "different schematics") || !strings.Contains(ws[1], "not from cluster.schematic") || !strings.Contains(ws[1], factory.ShortID(other)) {
		t.Errorf("installer of another schematic: %q", ws)
	}
	// The same schematic written out explicitly: nothing to say.
	cfg.Cluster.InstallImage = "factory.talos.dev/nocloud-installer/" + cfg.Images().SchematicID + ":" + v
	if ws := warningsAbout(t, cfg, "cluster.installImage"); len(ws) != 0 {
		t.Errorf("explicit installer of the declared schematic: %q", ws)
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
	found := false
	for _, w := range warningsAbout(t, cfg, "proxmox.iso.url") {
		if strings.Contains(w, "different schematics") {
			found = true
		}
	}
	if !found {
		t.Errorf("no warning for an ISO of another schematic: %v", cfg.Warnings())
	}
}
