package config

import (
	"strings"
	"testing"
)

// A Secure Boot node boots the Secure Boot ISO and installs and upgrades
// with the Secure Boot installer; the others keep the cluster's; TPM
// follows Secure Boot unless set; encryption falls back to the cluster's.
func TestSecureBootPerNode(t *testing.T) {
	c := Default()
	c.Nodes = []Node{
		{Name: "cp-1", Role: RoleControlPlane, VM: VMShape{SecureBoot: On}, Encryption: EncryptionTPM},
		{Name: "cp-2", Role: RoleControlPlane, VM: VMShape{SecureBoot: On, TPM: Off}},
		{Name: "wk-1", Role: RoleWorker},
	}
	c.Cluster.Encryption = EncryptionNone
	im := c.Images()
	sb, sbNoTPM, plain := c.VMShapeOf(c.Nodes[0]), c.VMShapeOf(c.Nodes[1]), c.VMShapeOf(c.Nodes[2])
	if !sb.SecureBootOn() || !sb.TPMOn() || !sbNoTPM.SecureBootOn() || sbNoTPM.TPMOn() || plain.SecureBootOn() || plain.TPMOn() {
		t.Errorf("shapes %+v %+v %+v", sb, sbNoTPM, plain)
	}
	if f := im.ISOFileOf(true); !strings.HasSuffix(f, "-nocloud-amd64-secureboot.iso") || im.ISOFileOf(false) != im.ISOFile {
		t.Errorf("ISO files %s %s", f, im.ISOFileOf(false))
	}
	if got := c.InstallImageOf(c.Nodes[0]); !strings.Contains(got, "/nocloud-installer-secureboot/"+im.SchematicID+":"+DefaultTalosVersion) {
		t.Errorf("Secure Boot installer %s", got)
	}
	if c.InstallImageOf(c.Nodes[2]) != im.InstallImage {
		t.Error("a plain node's installer changed")
	}
	if got := c.InstallImageOfFor(c.Nodes[0], "v1.14.1"); !strings.HasSuffix(got, "/nocloud-installer-secureboot/"+im.SchematicID+":v1.14.1") {
		t.Errorf("upgrade installer %s", got)
	}
	if c.EncryptionOf(c.Nodes[0]) != EncryptionTPM || c.EncryptionOf(c.Nodes[2]) != EncryptionNone {
		t.Error("encryption")
	}
	c.Cluster.Encryption = EncryptionTPM
	if c.EncryptionOf(c.Nodes[2]) != EncryptionTPM {
		t.Error("cluster default not taken")
	}
	if n := c.SecureBootNodes(); len(n) != 2 {
		t.Errorf("Secure Boot nodes %v", n)
	}
}
