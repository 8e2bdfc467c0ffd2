package stages

import (
	"strings"
	"testing"

	"github.com/homelab/bootstrap/config"
)

// A Secure Boot node's VM boots the Secure Boot ISO with a TPM, its
// config installs the Secure Boot installer, and a Talos upgrade takes it
// to the Secure Boot installer of the new version; the other nodes keep
// the cluster's ISO and installer.
func TestSecureBootNodeImages(t *testing.T) {
	cfg := config.Default()
	cfg.Cluster.Name = "lab"
	cfg.Cluster.Network.CIDR = "10.0.20.0/24"
	cfg.Nodes = []config.Node{
		{Name: "cp-1", Role: config.RoleControlPlane, VMID: 701, IP: "10.0.20.11", Cores: 2, MemoryMiB: 4096, DiskGiB: 32, VM: config.VMShape{SecureBoot: config.On}},
		{Name: "wk-1", Role: config.RoleWorker, VMID: 711, IP: "10.0.20.21", Cores: 2, MemoryMiB: 4096, DiskGiB: 32},
	}
	specs, err := VMSpecs(cfg)
	if err != nil {
		t.Fatal(err)
	}
	im := cfg.Images()
	if s := specs[0]; s.ISOFile != im.SecureBootISOFile || !s.Hardware.SecureBoot || !s.Hardware.TPM {
		t.Errorf("Secure Boot spec: %s %+v", s.ISOFile, s.Hardware)
	}
	if s := specs[1]; s.ISOFile != im.ISOFile || s.Hardware.SecureBoot || s.Hardware.TPM {
		t.Errorf("plain spec: %s %+v", s.ISOFile, s.Hardware)
	}
	if got := secureBootInstaller(cfg, cfg.Nodes[0]); got != im.SecureBootInstaller {
		t.Errorf("install image %q", got)
	}
	if got := secureBootInstaller(cfg, cfg.Nodes[1]); got != "" {
		t.Errorf("a plain node gets its own installer %q", got)
	}
	up := secureBootInstallersFor(cfg, "v1.14.1")
	if len(up) != 1 || !strings.HasSuffix(up["cp-1"], "/nocloud-installer-secureboot/"+im.SchematicID+":v1.14.1") {
		t.Errorf("upgrade installers %v", up)
	}
	if src := SecureBootISOSource(cfg); src.URL != im.SecureBootISOURL || src.Filename != im.SecureBootISOFile || src.Storage != cfg.Proxmox.ISOStorage {
		t.Errorf("Secure Boot ISO source %+v", src)
	}
}
