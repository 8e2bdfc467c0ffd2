package sops_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/internal/sealed"
	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/sops"
)

// labCLI returns the path of the lab's build of a user's tool (sops, age,
// age-keygen), after checking the build manifest pins the version the
// product follows: a lab built before a bump would prove nothing about
// the new one. Without a lab the test is skipped, unless
// BOOTSTRAP_REQUIRE_LAB=1.
func labCLI(t *testing.T, name string) string {
	t.Helper()
	b, err := kube.LoadBinaries("")
	if err != nil {
		if errors.Is(err, kube.ErrNoBinaries) && os.Getenv("BOOTSTRAP_REQUIRE_LAB") != "1" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	want := map[string][2]string{
		"sops":       {"github.com/getsops/sops/v3", "v" + sops.Version},
		"age":        {"filippo.io/age", ageVersion},
		"age-keygen": {"filippo.io/age", ageVersion},
	}[name]
	if got := b.Modules[want[0]].Version; got != want[1] {
		t.Fatalf("the lab's %s is built from %s %s, the product follows %s: rebuild the lab (make lab-bins)", name, want[0], got, want[1])
	}
	p := b.Path(name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is not built (make lab-bins): %v", name, err)
	}
	return p
}

// ageVersion is the age the product and kustomize-controller v1.9.5 link
// (go.mod).
const ageVersion = "v1.3.1"

func runCLI(t *testing.T, env []string, stdin []byte, bin string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", filepath.Base(bin), strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// TestPostQuantumBothWaysWithTheCLIs: post-quantum age keys (age-keygen
// -pq, age v1.3.1; sops v3.12 and later) work both ways with the lab's
// sops 3.13.2, age and age-keygen 1.3.1: a key file mixing a classic and a
// PQ identity is one source; what the sops CLI encrypts to an age1pq1…
// recipient opens here, with only the PQ identity handed on (Only); what
// Encrypt writes to it the CLI opens; and whole files sealed to it the
// age CLI opens, and the reverse.
func TestPostQuantumBothWaysWithTheCLIs(t *testing.T) {
	sopsBin, ageBin, keygen := labCLI(t, "sops"), labCLI(t, "age"), labCLI(t, "age-keygen")
	dir := t.TempDir()
	pqFile, classicFile, keysTxt := filepath.Join(dir, "pq.txt"), filepath.Join(dir, "classic.txt"), filepath.Join(dir, "keys.txt")
	runCLI(t, nil, nil, keygen, "-pq", "-o", pqFile)
	runCLI(t, nil, nil, keygen, "-o", classicFile)
	pqRec := strings.TrimSpace(string(runCLI(t, nil, nil, keygen, "-y", pqFile)))
	classicRec := strings.TrimSpace(string(runCLI(t, nil, nil, keygen, "-y", classicFile)))
	if !strings.HasPrefix(pqRec, "age1pq1") {
		t.Fatalf("age-keygen -pq -y printed %.20s…", pqRec)
	}
	pqKey, _ := os.ReadFile(pqFile)
	classicKey, _ := os.ReadFile(classicFile)
	if err := os.WriteFile(keysTxt, append(append(classicKey, '\n'), pqKey...), 0o600); err != nil {
		t.Fatal(err)
	}

	// One PQ line no longer makes the whole source fail.
	ids, err := sops.LoadIdentities(keysTxt, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids.Recipients) != 2 || ids.Recipients[0] != classicRec || ids.Recipients[1] != pqRec {
		t.Fatalf("recipients of the mixed key file: %.20q", ids.Recipients)
	}

	// The CLI encrypts to the PQ recipient; we open it, and so do the
	// identities Only hands to Flux, which hold the PQ one alone.
	secret := filepath.Join(dir, "secret.yaml")
	if err := os.WriteFile(secret, []byte(plain), 0o600); err != nil {
		t.Fatal(err)
	}
	enc := runCLI(t, nil, nil, sopsBin, "encrypt", "--age", pqRec, "--encrypted-regex", "^(data|stringData)$", secret)
	if got := sops.FileRecipients(enc); len(got) != 1 || got[0] != pqRec {
		t.Fatalf("FileRecipients of the CLI's file: %.20q", got)
	}
	out, err := sops.DecryptAsFlux(enc, ids)
	if err != nil || !strings.Contains(string(out), "correct-horse-battery-staple") {
		t.Fatalf("Decrypt of what sops %s encrypted to age1pq1…: %v", sops.Version, err)
	}
	only, ok := ids.Only(sops.FileRecipients(enc))
	if !ok || strings.Contains(string(only.Data), strings.TrimSpace(lastLine(classicKey))) || !strings.Contains(string(only.Data), "AGE-SECRET-KEY-PQ-1") {
		t.Fatalf("Only for the PQ recipient: ok %v, %d bytes", ok, len(only.Data))
	}
	reread, err := sops.ParseIdentities(only.Data, "sops-age")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sops.Decrypt(enc, reread); err != nil {
		t.Fatalf("the identities handed on do not open the file: %v", err)
	}

	// We encrypt to both kinds (each wraps the data key in its own age
	// file, so they mix); the CLI opens it with either key file.
	ours, err := sops.Encrypt([]byte(plain), sops.EncryptOptions{Recipients: []string{pqRec, classicRec}, EncryptedRegex: "^(data|stringData)$"})
	if err != nil {
		t.Fatal(err)
	}
	for _, kf := range []string{pqFile, classicFile} {
		got := runCLI(t, []string{sops.KeyFileEnv + "=" + kf}, ours, sopsBin, "decrypt", "--input-type", "yaml", "--output-type", "yaml", "/dev/stdin")
		if !strings.Contains(string(got), "correct-horse-battery-staple") {
			t.Fatalf("sops decrypt with %s:\n%s", filepath.Base(kf), got)
		}
	}

	// Whole files (the sealed Talos files, backup copies): sealed to the
	// PQ recipient, the age CLI opens them; the age CLI's, we open.
	rec, err := sealed.ParseRecipients([]string{pqRec})
	if err != nil {
		t.Fatal(err)
	}
	box, err := sealed.Seal([]byte("sealed text"), rec)
	if err != nil {
		t.Fatal(err)
	}
	if got := runCLI(t, nil, box, ageBin, "-d", "-i", pqFile); string(got) != "sealed text" {
		t.Fatalf("age -d of a file sealed to age1pq1…: %q", got)
	}
	theirs := runCLI(t, nil, []byte("from the age CLI"), ageBin, "-r", pqRec)
	if got, err := sealed.Open(theirs, ids.Age()); err != nil || string(got) != "from the age CLI" {
		t.Fatalf("opening what age -r age1pq1… wrote: %q %v", got, err)
	}
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}
