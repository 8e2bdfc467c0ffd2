package e2e_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/e2e"
)

// secureBootNode makes the lab config's node name a Secure Boot node with
// a TPM and TPM-sealed STATE and EPHEMERAL (nodes[].vm.secureBoot on, tpm
// by default with it, nodes[].encryption tpm), and returns the check to
// run after the first run: its VM has the TPM 2.0 state volume and an EFI
// disk in setup mode, the Secure Boot ISO is on the ISO storage, the node
// reports Secure Boot and luks2 volumes, and the postcheck's
// talos-security row passes. Then the config asks Secure Boot of the
// installed plain node wk-1: the talos stage refuses (exit 2) naming it
// and bootstrap node replace, applying nothing; the config is put back.
func secureBootNode(t *testing.T, ctx context.Context, h *e2e.Harness, name string) func(*e2e.Result) {
	t.Helper()
	if err := h.EditConfig(func(s string) (string, error) {
		re := regexp.MustCompile(`(?m)^(  - \{name: ` + regexp.QuoteMeta(name) + `, .*)\}$`)
		if !re.MatchString(s) {
			return "", fmt.Errorf("no node %s in the lab config:\n%s", name, s)
		}
		return re.ReplaceAllString(s, `${1}, encryption: tpm, vm: {secureBoot: "on"}}`), nil
	}); err != nil {
		t.Fatal(err)
	}
	return func(first *e2e.Result) {
		t.Helper()
		cfg := h.Config()
		var ip string
		for _, n := range cfg.Nodes {
			vm, ok := h.Lab.PVE.VM(n.VMID)
			if !ok {
				t.Fatalf("VM %d %s missing", n.VMID, n.Name)
			}
			tpm := vm.Config["tpmstate0"]
			if n.Name != name {
				if tpm != "" {
					t.Errorf("VM %s has a TPM it was not asked for: %s", n.Name, tpm)
				}
				continue
			}
			ip = n.IP
			if !regexp.MustCompile(`^[^:]+:vm-\d+-disk-\d+,size=4M,version=v2\.0$`).MatchString(tpm) {
				t.Errorf("VM %s tpmstate0 = %q, want a 4M TPM 2.0 state volume", n.Name, tpm)
			}
			if !strings.Contains(vm.Config["efidisk0"], "pre-enrolled-keys=0") {
				t.Errorf("VM %s efidisk0 = %q: not in setup mode", n.Name, vm.Config["efidisk0"])
			}
		}
		sbISO := cfg.Proxmox.ISOStorage + ":iso/" + cfg.Images().SecureBootISOFile
		if isos := h.Lab.PVE.Volumes(cfg.Proxmox.ISOStorage, "iso"); !slices.Contains(isos, sbISO) {
			t.Errorf("the Secure Boot ISO %s is not on the ISO storage: %v", sbISO, isos)
		}
		node, ok := h.Lab.Talos.Node(ip)
		if !ok {
			t.Fatalf("no Talos node at %s", ip)
		}
		// Secure Boot on only if the VM booted the factory's Secure Boot
		// ISO in setup mode, and runs the Secure Boot installer's system.
		if !node.SecureBoot() {
			t.Errorf("%s does not report Secure Boot", name)
		}
		for _, v := range []string{"STATE", "EPHEMERAL"} {
			if p, msg := node.EncryptionOf(v); p != "luks2" {
				t.Errorf("%s %s: provider %q (%s), want luks2", name, v, p, msg)
			}
		}
		row := ""
		for _, line := range strings.Split(first.Stdout, "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "talos-security" {
				row = line
			}
		}
		if f := strings.Fields(row); len(f) < 2 || f[1] != "PASS" {
			t.Errorf("postcheck talos-security row: %q\n%s", row, first.Stdout)
		}

		before, err := os.ReadFile(h.ConfigPath())
		if err != nil {
			t.Fatal(err)
		}
		applies := 0
		for _, n := range h.Lab.Talos.Nodes() {
			applies += n.Counters().Applies
		}
		setNodeVM(t, h, "wk-1", `{secureBoot: "on"}`)
		switched := run(t, ctx, h, "run", "--stage", "talos")
		if switched.ExitCode != 2 || !strings.Contains(switched.Stderr+switched.Stdout, "wk-1 runs without Secure Boot") ||
			!strings.Contains(switched.Stderr+switched.Stdout, "bootstrap node replace wk-1") {
			t.Errorf("switching Secure Boot on under installed wk-1: exit %d\n%s", switched.ExitCode, switched.Tail(20))
		}
		after := 0
		for _, n := range h.Lab.Talos.Nodes() {
			after += n.Counters().Applies
		}
		if after != applies {
			t.Errorf("the refused run applied %d configs", after-applies)
		}
		if err := h.EditConfig(func(string) (string, error) { return string(before), nil }); err != nil {
			t.Fatal(err)
		}
		// The refusal left the stage failed in the state: the config put
		// back, the stage runs through again, changing nothing.
		if back := run(t, ctx, h, "run", "--stage", "talos"); back.ExitCode != 0 {
			t.Fatalf("the talos stage with the config put back: exit %d\n%s", back.ExitCode, back.Tail(20))
		}
	}
}
