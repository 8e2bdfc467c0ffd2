package talossim_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/rs/zerolog"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"

	"github.com/homelab/bootstrap/lab/talossim"
	"github.com/homelab/bootstrap/talos"
)

// sbInstaller is a factory Secure Boot installer reference (no factory
// answers in this test: the simulator pulls nothing without one).
const sbInstaller = "factory.talos.dev/nocloud-installer-secureboot/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.13.3"

// Secure Boot and TPM-sealed volumes, from the VM's firmware: the Secure
// Boot ISO on an EFI disk in setup mode boots with Secure Boot enforced
// and, installed with the Secure Boot installer, encrypts STATE and
// EPHEMERAL with luks2; under pre-enrolled Microsoft keys it never
// answers; without a TPM the volumes fail as Talos reports it and the
// boot goes no further.
func TestSecureBootAndTPMEncryption(t *testing.T) {
	t.Parallel()
	prefix, err := talossim.RandomLoopbackPrefix(50000)
	if err != nil {
		t.Fatal(err)
	}
	ip := func(last byte) string { return talossim.HostAddr(prefix, last) }
	dir := filepath.Join(t.TempDir(), "lab")
	os.MkdirAll(dir, 0o700)
	data, err := os.ReadFile(filepath.Join("..", "..", "talos", "testdata", "secrets.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, talos.SecretsFile), data, 0o600)
	gen, err := talos.Generate(talos.GenerateOptions{Dir: dir, ClusterName: "lab", TalosVersion: "v1.13.3", Nodes: []talos.Node{
		{Name: "cp-1", Role: talos.RoleControlPlane, IP: ip(11), DiskBus: "scsi", InstallImage: sbInstaller, EncryptTPM: true},
		{Name: "cp-2", Role: talos.RoleControlPlane, IP: ip(12), DiskBus: "scsi", InstallImage: sbInstaller, EncryptTPM: true},
		{Name: "cp-3", Role: talos.RoleControlPlane, IP: ip(13), DiskBus: "scsi", InstallImage: sbInstaller, EncryptTPM: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	sim := talossim.New(talossim.Options{Cluster: talossim.NewMemoryCluster([]byte("apiVersion: v1\nkind: Config\n")), Profile: talossim.ProfileInstant,
		TalosVersion: "v1.13.3", Log: zerolog.New(zerolog.NewTestWriter(t))})
	t.Cleanup(func() { sim.Close() })
	boot := func(last byte, fw talossim.Firmware) *talossim.Node {
		n, err := sim.BootNode(context.Background(), talossim.NodeSpec{IP: ip(last), Firmware: fw, Disks: []talossim.Disk{{Bus: "scsi", Size: 32 << 30}}})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	wait := func(n *talossim.Node, p talossim.Phase) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := n.WaitPhase(ctx, p); err != nil {
			t.Fatalf("%s: %v (phase %s)", n.IP(), err, n.Phase())
		}
	}
	apply := func(n *talossim.Node, name string) {
		t.Helper()
		cfg, _ := gen.Node(name)
		if _, err := insecure(t, n.IP()).ApplyConfiguration(callCtx(t), &machine.ApplyConfigurationRequest{Data: cfg.Config, Mode: machine.ApplyConfigurationRequest_AUTO}); err != nil {
			t.Fatal(err)
		}
	}
	ctx := callCtx(t)

	good := boot(11, talossim.Firmware{UEFI: true, TPM2: true, SecureBootISO: true})
	noTPM := boot(13, talossim.Firmware{UEFI: true, SecureBootISO: true})
	msKeys := boot(12, talossim.Firmware{UEFI: true, PreEnrolledKeys: true, TPM2: true, SecureBootISO: true})
	wait(good, talossim.PhaseMaintenance)
	wait(noTPM, talossim.PhaseMaintenance)

	// Maintenance mode already reports Secure Boot (talosctl get
	// securitystate --insecure in the Talos docs).
	ss, err := safe.StateGetByID[*runtime.SecurityState](ctx, insecure(t, good.IP()).COSI, runtime.SecurityStateID)
	if err != nil || !ss.TypedSpec().SecureBoot || !ss.TypedSpec().BootedWithUKI || ss.TypedSpec().PCRSigningKeyFingerprint == "" {
		t.Fatalf("maintenance security state: %v %v", ss, err)
	}

	apply(good, "cp-1")
	wait(good, talossim.PhaseRunning)
	if !good.SecureBoot() {
		t.Error("installed with the Secure Boot installer, the node does not report Secure Boot")
	}
	for _, v := range []string{"STATE", "EPHEMERAL"} {
		if p, msg := good.EncryptionOf(v); p != "luks2" || msg != "" {
			t.Errorf("%s: provider %q, error %q", v, p, msg)
		}
	}

	// Pre-enrolled keys: the firmware refuses the signed boot loader; the
	// node never reaches maintenance mode, its API never answers.
	time.Sleep(200 * time.Millisecond)
	if msKeys.Phase() != talossim.PhaseBooting {
		t.Errorf("under Microsoft's keys the node reached %s", msKeys.Phase())
	}
	if _, err := insecure(t, msKeys.IP()).Version(ctx); err == nil {
		t.Error("under Microsoft's keys the node's API answers")
	}

	// No TPM: the install goes through, the installed boot fails at
	// STATE with the TPM's open error and goes no further.
	apply(noTPM, "cp-3")
	deadline := time.Now().Add(10 * time.Second)
	for {
		p, msg := noTPM.EncryptionOf("STATE")
		if strings.Contains(msg, "open /dev/tpm0: no such file or directory") {
			if p == "luks2" {
				t.Errorf("a failed volume reports provider %s", p)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no TPM failure on STATE: provider %q error %q (phase %s)", p, msg, noTPM.Phase())
		}
		time.Sleep(5 * time.Millisecond)
	}
	vs, err := safe.StateGetByID[*block.VolumeStatus](ctx, secure(t, mustConfig(t, gen.Talosconfig), noTPM.IP()).COSI, "STATE")
	if err != nil || vs.TypedSpec().Phase != block.VolumePhaseFailed {
		t.Errorf("STATE over the API: %v %v", vs, err)
	}
	time.Sleep(100 * time.Millisecond)
	if noTPM.Phase() == talossim.PhaseRunning {
		t.Error("without a TPM the node booted on")
	}
}

func mustConfig(t *testing.T, talosconfig []byte) *clientconfig.Config {
	t.Helper()
	cfg, err := clientconfig.FromBytes(talosconfig)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
