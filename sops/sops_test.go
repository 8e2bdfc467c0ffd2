package sops_test

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

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

func TestLoadIdentitiesOrder(t *testing.T) {
	env := map[string]string{sops.KeyFileEnv: "testdata/test-identity.agekey"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	ids, err := sops.LoadIdentities("", lookup)
	if err != nil || ids.Source != "testdata/test-identity.agekey" {
		t.Fatalf("from %s: %+v %v", sops.KeyFileEnv, ids.Source, err)
	}
	id, rec, _ := sops.GenerateIdentity()
	env = map[string]string{sops.KeyEnv: id}
	if ids, err = sops.LoadIdentities("", lookup); err != nil || ids.Recipients[0] != rec {
		t.Fatalf("from %s: %+v %v", sops.KeyEnv, ids.Recipients, err)
	}
	// An explicit file wins over both.
	env[sops.KeyFileEnv] = "nowhere"
	if ids, err = sops.LoadIdentities("testdata/test-identity.agekey", lookup); err != nil || ids.Recipients[0] != testIdentity(t).Recipients[0] {
		t.Fatalf("explicit file: %+v %v", ids.Recipients, err)
	}
}
