package talos

import (
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	blockres "github.com/siderolabs/talos/pkg/machinery/resources/block"
)

// secureBootCP is oneCP whose node installs the Secure Boot installer and
// encrypts STATE and EPHEMERAL with a TPM-sealed key.
func secureBootCP(dir string) GenerateOptions {
	o := oneCP(dir)
	o.Nodes[0].InstallImage = "factory.talos.dev/nocloud-installer-secureboot/ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515:v1.13.3"
	o.Nodes[0].EncryptTPM = true
	return o
}

// A Secure Boot node's config carries its Secure Boot installer and the
// VolumeConfig documents of STATE and EPHEMERAL (luks2, slot 0 sealed by
// the TPM) at every generated version, and passes machinery's strict
// metal validation (Generate refuses a config that does not).
func TestSecureBootNodeConfig(t *testing.T) {
	for _, version := range []string{"v1.12.6", "v1.13.3", "v1.14.1"} {
		t.Run(version, func(t *testing.T) {
			o := atVersion(secureBootCP, version)(clusterDir(t, "secrets.yaml"))
			o.Nodes[0].InstallImage = strings.Replace(o.Nodes[0].InstallImage, "v1.13.3", version, 1)
			o.Nodes = append(o.Nodes, Node{Name: "wk-1", Role: RoleWorker, IP: "10.10.0.21", DiskBus: "scsi"})
			res, err := Generate(o)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				node      string
				encrypted bool
				image     string
			}{{"cp-1", true, o.Nodes[0].InstallImage}, {"wk-1", false, o.InstallImage}} {
				n, _ := res.Rendered.Node(c.node)
				cfg, err := configloader.NewFromBytes(n.Config)
				if err != nil {
					t.Fatal(err)
				}
				got := ""
				if u := cfg.UnattendedInstallConfig(); u != nil {
					got = u.InstallerImage()
				} else {
					got = cfg.Machine().Install().Image() //nolint:staticcheck // the form before v1.14
				}
				if got != c.image {
					t.Errorf("%s installs %q, want %q", c.node, got, c.image)
				}
				for _, name := range []string{"STATE", "EPHEMERAL"} {
					vc, ok := cfg.Volumes().ByName(name)
					enc := ok && vc.Encryption() != nil && vc.Encryption().Provider() == blockres.EncryptionProviderLUKS2
					if enc != c.encrypted {
						t.Errorf("%s %s encrypted %v, want %v", c.node, name, enc, c.encrypted)
						continue
					}
					if enc {
						keys := vc.Encryption().Keys()
						if len(keys) != 1 || keys[0].Slot() != 0 || keys[0].TPM() == nil {
							t.Errorf("%s %s keys %+v, want one TPM key in slot 0", c.node, name, keys)
						}
					}
				}
			}
		})
	}
}

// A rollout upgrades each node with its own installer where it has one
// (a Secure Boot node's), else with the cluster's.
func TestRollOutImageOf(t *testing.T) {
	o := RollOutOptions{Image: "plain:v2", Images: map[string]string{"cp-1": "secureboot:v2"}}
	if o.imageOf("cp-1") != "secureboot:v2" || o.imageOf("wk-1") != "plain:v2" {
		t.Errorf("imageOf: %s %s", o.imageOf("cp-1"), o.imageOf("wk-1"))
	}
}
