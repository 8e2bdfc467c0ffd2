package sops_test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/getsops/sops/v3/cmd/sops/formats"
	"github.com/getsops/sops/v3/decrypt"
	"go.yaml.in/yaml/v3"

	"github.com/homelab/bootstrap/sops"
)

const plain = `apiVersion: v1
kind: Secret
metadata:
  name: demo
  namespace: homelab
stringData:
  password: correct-horse-battery-staple
  port: 5432
`

func testIdentity(t *testing.T) sops.Identities {
	t.Helper()
	data, err := os.ReadFile("testdata/test-identity.agekey")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := sops.ParseIdentities(data, "testdata/test-identity.agekey")
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func parse(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v:\n%s", err, b)
	}
	return m
}

// testdata/cli-encrypted.yaml was written by the sops 3.11.0 CLI (built from
// the module this package pins): `sops encrypt --age <test recipient>
// --encrypted-regex '^(data|stringData)$'`.
func TestDecryptsWhatTheCLIWrote(t *testing.T) {
	enc, err := os.ReadFile("testdata/cli-encrypted.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !sops.IsEncrypted(enc) || strings.Contains(string(enc), "correct-horse") {
		t.Fatal("the fixture is not encrypted")
	}
	out, err := sops.Decrypt(enc, testIdentity(t))
	if err != nil {
		t.Fatal(err)
	}
	got := parse(t, out)
	if got["stringData"].(map[string]any)["password"] != "correct-horse-battery-staple" || got["sops"] != nil {
		t.Fatalf("decrypted:\n%s", out)
	}
}

// What Encrypt writes, the sops CLI's own decrypt path (the decrypt
// package, identities from SOPS_AGE_KEY_FILE) reads back.
func TestTheSOPSDecryptPathReadsWhatWeWrite(t *testing.T) {
	ids := testIdentity(t)
	enc, err := sops.Encrypt([]byte(plain), sops.EncryptOptions{Recipients: ids.Recipients, EncryptedRegex: "^(data|stringData)$", Now: time.Unix(1700000000, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(enc), "correct-horse") || !strings.Contains(string(enc), "name: demo") || !sops.IsEncrypted(enc) {
		t.Fatalf("encrypted:\n%s", enc)
	}
	t.Setenv(sops.KeyFileEnv, "testdata/test-identity.agekey")
	out, err := decrypt.DataWithFormat(enc, formats.Yaml)
	if err != nil {
		t.Fatal(err)
	}
	if want := parse(t, []byte(plain)); !reflect.DeepEqual(parse(t, out), want) {
		t.Fatalf("sops decrypted\n%s\nwant\n%s", out, plain)
	}
	// And ours, with the MAC checked.
	mine, err := sops.Decrypt(enc, ids)
	if err != nil || !reflect.DeepEqual(parse(t, mine), parse(t, []byte(plain))) {
		t.Fatalf("Decrypt: %v\n%s", err, mine)
	}
	if _, err := sops.Encrypt(enc, sops.EncryptOptions{Recipients: ids.Recipients}); err == nil {
		t.Error("encrypting an encrypted file twice was not refused")
	}
}

func TestAnotherKeyIsNamed(t *testing.T) {
	enc, err := os.ReadFile("testdata/cli-encrypted.yaml")
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := sops.GenerateIdentity()
	if err != nil {
		t.Fatal(err)
	}
	ids, err := sops.ParseIdentities([]byte(other), "other.agekey")
	if err != nil {
		t.Fatal(err)
	}
	_, err = sops.Decrypt(enc, ids)
	if err == nil || !strings.Contains(err.Error(), "other.agekey") || !strings.Contains(err.Error(), testIdentity(t).Recipients[0]) {
		t.Fatalf("decrypting with another key: %v", err)
	}
}

// The MAC covers the values left in plaintext too: a changed name is
// caught.
func TestTamperingFailsTheMAC(t *testing.T) {
	enc, err := os.ReadFile("testdata/cli-encrypted.yaml")
	if err != nil {
		t.Fatal(err)
	}
	changed := strings.Replace(string(enc), "name: demo", "name: other", 1)
	if _, err := sops.Decrypt([]byte(changed), testIdentity(t)); err == nil || !strings.Contains(err.Error(), "MAC") {
		t.Fatalf("a changed file decrypted: %v", err)
	}
}

func TestFileSealer(t *testing.T) {
	ids := testIdentity(t)
	s := &sops.FileSealer{Recipients: ids.Recipients, KeyFile: "testdata/test-identity.agekey"}
	stored, err := s.Seal([]byte(plain))
	if err != nil {
		t.Fatal(err)
	}
	if !sops.IsEncrypted(stored) || strings.Contains(string(stored), "correct-horse") || strings.Contains(string(stored), "5432") {
		t.Fatalf("sealed:\n%s", stored)
	}
	back, err := s.Open(stored)
	if err != nil || !reflect.DeepEqual(parse(t, back), parse(t, []byte(plain))) {
		t.Fatalf("open: %v\n%s", err, back)
	}
	// Plaintext passes through Open; without recipients Seal stores plaintext.
	if b, err := s.Open([]byte(plain)); err != nil || string(b) != plain {
		t.Errorf("open plaintext: %v", err)
	}
	if b, err := (&sops.FileSealer{}).Seal([]byte(plain)); err != nil || string(b) != plain {
		t.Errorf("seal without recipients: %v", err)
	}
	// The identity is looked up only when something is encrypted, and a
	// missing one names where it was looked for.
	missing := &sops.FileSealer{KeyFile: "testdata/none.agekey"}
	if _, err := missing.Open(stored); err == nil || !strings.Contains(err.Error(), "none.agekey") {
		t.Errorf("open without the identity file: %v", err)
	}
}

// TestLoadIdentitiesFromEverySource: without an explicit file the
// identities of every source the sops CLI reads count together
// ($SOPS_AGE_KEY, $SOPS_AGE_KEY_FILE, $SOPS_AGE_KEY_CMD, keys.txt); a
// failing source does not hide the others; none at all names them.
func TestLoadIdentitiesFromEverySource(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	fromFile := testIdentity(t).Recipients[0]
	keyID, keyRec, _ := sops.GenerateIdentity()
	cmdID, cmdRec, _ := sops.GenerateIdentity()
	cfgID, cfgRec, _ := sops.GenerateIdentity()
	keysTxt := filepath.Join(os.Getenv("XDG_CONFIG_HOME"), filepath.FromSlash(sops.UserConfigPath))
	if err := os.MkdirAll(filepath.Dir(keysTxt), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keysTxt, []byte("# created: 2026-01-01\n"+cfgID+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		sops.KeyFileEnv: "testdata/test-identity.agekey",
		sops.KeyEnv:     keyID,
		sops.KeyCmdEnv:  "printf '%s\\n' " + cmdID,
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	ids, err := sops.LoadIdentities("", lookup)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{fromFile, keyRec, cmdRec, cfgRec} {
		if !slices.Contains(ids.Recipients, want) {
			t.Errorf("recipients %v lack %s (sources %s)", ids.Recipients, want, ids.Source)
		}
	}
	// The identities handed to Flux decrypt for every one of them.
	for _, id := range []string{keyID, cmdID, cfgID} {
		if !strings.Contains(string(ids.Data), id) {
			t.Errorf("the identity data lacks one of the sources' identities")
		}
	}
	// A broken source does not hide a working one, as in the CLI.
	env = map[string]string{sops.KeyFileEnv: "nowhere", sops.KeyCmdEnv: "false"}
	if ids, err = sops.LoadIdentities("", lookup); err != nil || !slices.Equal(ids.Recipients, []string{cfgRec}) {
		t.Errorf("with a missing file and a failing command: %v %v, want keys.txt's identity", ids.Recipients, err)
	}
	// Nothing anywhere: the error names where it looked.
	os.Remove(keysTxt)
	if _, err = sops.LoadIdentities("", lookup); err == nil || !strings.Contains(err.Error(), sops.KeyFileEnv) || !strings.Contains(err.Error(), "keys.txt") {
		t.Errorf("no identity anywhere: %v", err)
	}
	// An explicit file is read alone.
	env = map[string]string{sops.KeyEnv: keyID}
	if ids, err = sops.LoadIdentities("testdata/test-identity.agekey", lookup); err != nil || !slices.Equal(ids.Recipients, []string{fromFile}) {
		t.Fatalf("explicit file: %+v %v", ids.Recipients, err)
	}
}

// identities makes n fresh age identities: their file text and recipients.
func identities(t *testing.T, n int) (keys, recipients []string) {
	t.Helper()
	for range n {
		id, rec, err := sops.GenerateIdentity()
		if err != nil {
			t.Fatal(err)
		}
		keys, recipients = append(keys, id), append(recipients, rec)
	}
	return keys, recipients
}

// Shamir key groups: the data key is split among three groups, any two
// decrypt. The sops library reads what Encrypt writes; Decrypt combines
// two groups' shares and names what is missing with one.
func TestShamirKeyGroups(t *testing.T) {
	keys, recs := identities(t, 3)
	enc, err := sops.Encrypt([]byte(plain), sops.EncryptOptions{Groups: [][]string{{recs[0]}, {recs[1]}, {recs[2]}}, ShamirThreshold: 2})
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(enc), "recipient: age1"); n != 3 || !strings.Contains(string(enc), "key_groups:") || !strings.Contains(string(enc), "shamir_threshold: 2") {
		t.Fatalf("%d key groups:\n%s", n, enc)
	}
	t.Setenv(sops.KeyEnv, keys[0]+"\n"+keys[2])
	if out, err := decrypt.DataWithFormat(enc, formats.Yaml); err != nil || !reflect.DeepEqual(parse(t, out), parse(t, []byte(plain))) {
		t.Fatalf("the sops library with two of three groups: %v\n%s", err, out)
	}
	two, err := sops.ParseIdentities([]byte(keys[1]+"\n"+keys[2]), "two.agekey")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := sops.Decrypt(enc, two); err != nil || !reflect.DeepEqual(parse(t, out), parse(t, []byte(plain))) {
		t.Fatalf("Decrypt with two of three groups: %v\n%s", err, out)
	}
	one, err := sops.ParseIdentities([]byte(keys[1]), "one.agekey")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sops.Decrypt(enc, one); err == nil || !strings.Contains(err.Error(), "needs 2 of them") || !strings.Contains(err.Error(), recs[0]) {
		t.Errorf("Decrypt with one group: %v", err)
	}
}

// A .sops.yaml creation rule for the bundle decides how it is sealed, as
// `sops encrypt` would: its key groups and threshold replace the
// configured recipients; a rule for other files leaves them; a rule with
// a PGP key is refused before anything is written.
func TestCreationRuleDecidesTheBundle(t *testing.T) {
	keys, recs := identities(t, 3)
	repo := t.TempDir()
	bundle := filepath.Join(repo, ".talos", "lab", "secrets.yaml")
	if err := os.MkdirAll(filepath.Dir(bundle), 0o700); err != nil {
		t.Fatal(err)
	}
	writeRules := func(rules string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(repo, ".sops.yaml"), []byte(rules), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sealer := &sops.FileSealer{Recipients: []string{recs[2]}, Path: bundle}

	writeRules(`creation_rules:
  - path_regex: ^clusters/.*\.yaml$
    age: ` + recs[2] + `
  - path_regex: ^\.talos/.*/secrets\.yaml$
    shamir_threshold: 2
    key_groups:
      - age: [` + recs[0] + `]
      - age: [` + recs[1] + `]
`)
	enc, err := sealer.Seal([]byte(plain))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(enc), recs[2]) || !strings.Contains(string(enc), recs[0]) || !strings.Contains(string(enc), "shamir_threshold: 2") {
		t.Fatalf("sealed without the rule's key groups:\n%s", enc)
	}
	t.Setenv(sops.KeyEnv, keys[0]+"\n"+keys[1])
	if out, err := decrypt.DataWithFormat(enc, formats.Yaml); err != nil || !reflect.DeepEqual(parse(t, out), parse(t, []byte(plain))) {
		t.Fatalf("the sops library: %v\n%s", err, out)
	}

	writeRules(`creation_rules:
  - path_regex: ^clusters/.*\.yaml$
    age: ` + recs[0] + `
`)
	if enc, err = sealer.Seal([]byte(plain)); err != nil || !strings.Contains(string(enc), recs[2]) || strings.Contains(string(enc), recs[0]) {
		t.Fatalf("no rule for the bundle: want the configured recipient: %v\n%s", err, enc)
	}

	writeRules(`creation_rules:
  - pgp: FBC7B9E2A4F9289AC0C1D4843D16CEE4A27381B4
`)
	if _, err := sealer.Seal([]byte(plain)); err == nil || !strings.Contains(err.Error(), "age only") || !strings.Contains(err.Error(), ".sops.yaml") {
		t.Errorf("a PGP rule: %v", err)
	}
}

// TestKeySourcesAsSOPS3132 reads the sources as sops v3.13.2 does:
// $SOPS_AGE_KEY may hold several identities on a line; $SOPS_AGE_KEY_CMD
// runs once for each recipient asked for, with $SOPS_AGE_RECIPIENT set to
// it (a command answering only then gives nothing without it); a key file
// with a post-quantum line is one source still; and an SSH key source is
// named when nothing else is found, as kustomize-controller cannot use it.
func TestKeySourcesAsSOPS3132(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	first, firstRec, _ := sops.GenerateIdentity()
	second, secondRec, _ := sops.GenerateIdentity()
	pq, err := age.GenerateHybridIdentity()
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{sops.KeyEnv: first + "  " + second}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	ids, err := sops.LoadIdentities("", lookup)
	if err != nil || !slices.Equal(ids.Recipients, []string{firstRec, secondRec}) {
		t.Fatalf("two identities on one line of $SOPS_AGE_KEY: %v %v", ids.Recipients, err)
	}

	// The command answers for the PQ recipient only, as a password
	// manager keyed by recipient would.
	dir := t.TempDir()
	script := filepath.Join(dir, "key-for")
	body := "#!/bin/sh\ncase \"$" + sops.RecipientEnv + "\" in\n" + pq.Recipient().String() + ") echo " + pq.String() + " ;;\n*) echo \"no key for '$" + sops.RecipientEnv + "'\" >&2; exit 1 ;;\nesac\n"
	if err := os.WriteFile(script, []byte(body), 0o700); err != nil {
		t.Fatal(err)
	}
	env = map[string]string{sops.KeyCmdEnv: script}
	ids, err = sops.LoadIdentities("", lookup, firstRec, pq.Recipient().String())
	if err != nil || !slices.Equal(ids.Recipients, []string{pq.Recipient().String()}) {
		t.Fatalf("the key command asked per recipient: %.30q %v", ids.Recipients, err)
	}
	if _, err := sops.LoadIdentities("", lookup); err == nil || !strings.Contains(err.Error(), sops.KeyCmdEnv) {
		t.Errorf("the key command with no recipient to ask for: %v", err)
	}

	// Nothing but an SSH key: the message says why it is not taken.
	env = map[string]string{sops.SSHKeyCmdEnv: "cat id_ed25519"}
	if _, err := sops.LoadIdentities("", lookup); err == nil || !strings.Contains(err.Error(), "$"+sops.SSHKeyCmdEnv+" is set") {
		t.Errorf("only an SSH key command: %v", err)
	}
}
