package e2e_test

import (
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/lab/pveapi"
)

// TestProxmoxVersions runs the pipeline (one control plane, one worker)
// against the lab's Proxmox at the newest pve-manager of every minor
// release whose API schema was published, the oldest supported first:
// pvesim judges every call by that release's schema (pveapi), the token
// holds the README's role for the version, and the run must end with the
// postcheck green. The release each version's behaviours follow (tags on
// create by qemu-server, memory.available, VM.Monitor or the guest agent
// privileges) is the simulated one. None of these storages holds the import
// content type, so every run installs from the ISO and says why.
func TestProxmoxVersions(t *testing.T) {
	pveapi.DirForTest(t)
	t.Parallel()
	for _, version := range []string{"8.2.10", "8.4.21", "9.0.18", "9.1.19"} {
		t.Run(version, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t, 4*time.Minute)
			h := startHarness(t, e2e.Options{ControlPlanes: 1, Workers: 1, ProxmoxVersion: version})
			api, note := h.Lab.PVE.Schema()
			if api == nil || note != "" || !strings.HasPrefix(version, api.Release+".") {
				t.Fatalf("pvesim %s validates with %v (%s)", version, api, note)
			}
			r := run(t, ctx, h, "run", "--stage", "all")
			if r.ExitCode != 0 {
				t.Fatalf("run against PVE %s failed:\n%s", version, r.Tail(40))
			}
			if err := h.PostcheckGreen(); err != nil {
				t.Fatalf("PVE %s: %v\n%s", version, err, r.Tail(20))
			}
			// The boot row says why the VMs installed from the ISO: 8.2.10
			// (pve-storage 8.2.8) imports .ova files only, later releases
			// import disk images but the lab's storage holds no imports.
			why := "no storage has the import content type"
			if strings.HasPrefix(version, "8.2.") {
				why = "imports .ova only (disk images from pve-storage 8.3.6, PVE 8.4)"
			}
			if !strings.Contains(r.Stdout, why) || !strings.Contains(r.Stdout, "new VMs boot the ISO: ") {
				t.Errorf("PVE %s: the boot row does not say %q and that the ISO is used:\n%s", version, why, r.Stdout)
			}
			if c := h.Lab.Factory.Counts(); c.ISODownloads != 1 || c.ImageDownloads != 0 {
				t.Errorf("PVE %s: %d ISO and %d image downloads, want the ISO once", version, c.ISODownloads, c.ImageDownloads)
			}
			calls := h.Lab.PVE.CallList()
			if len(calls) < 15 {
				t.Fatalf("PVE %s: only %d kinds of call reached the schema: %v", version, len(calls), calls)
			}
			t.Logf("PVE %s (schema %s): %s; %d kinds of call, all in the schema", version, api.Release, r.Wall.Round(100*time.Millisecond), len(calls))
		})
	}
}
