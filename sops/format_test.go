package sops_test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	gosops "github.com/getsops/sops/v3"
	"github.com/getsops/sops/v3/aes"
	sopsage "github.com/getsops/sops/v3/age"
	"github.com/getsops/sops/v3/cmd/sops/formats"
	sopsconfig "github.com/getsops/sops/v3/config"
	"github.com/getsops/sops/v3/decrypt"
	"github.com/getsops/sops/v3/keys"
	"github.com/getsops/sops/v3/keyservice"
	sopsyaml "github.com/getsops/sops/v3/stores/yaml"
	"github.com/getsops/sops/v3/version"

	"github.com/homelab/bootstrap/sops"
)

// rich holds what the format has to carry: comments above, beside and
// after entries and list items, nested maps and lists, every scalar type
// yaml.v3 decodes (int, float, bool, null, strings that look like them),
// an empty string, a _unencrypted key, a block scalar and a second
// document.
const rich = `# head of the file
apiVersion: v1 # beside a value
kind: Secret
metadata:
  name: rich
  # above a nested key
  labels:
    app: demo
stringData:
  password: correct-horse
  port: 5432
  ratio: 0.25
  enabled: true
  nothing: null
  quoted: "true"
  empty: ""
  token_unencrypted: visible
  list:
    # above the first item
    - one
    - 2 # beside an item
    - three: 3
      four: [4, 4.5]
    # after the last item
  pem: |
    -----BEGIN CERTIFICATE-----
    MIIB
    -----END CERTIFICATE-----
# foot of the first document
---
second: document
nested:
  deep:
    deeper: [a, b]
`

// libraryEncrypt encrypts as the sops library does (its YAML store, tree
// and AES cipher, the key wrapped through its local key service).
func libraryEncrypt(t *testing.T, plain []byte, recipients string, md gosops.Metadata) []byte {
	t.Helper()
	store := sopsyaml.NewStore(&sopsconfig.YAMLStoreConfig{})
	branches, err := store.LoadPlainFile(plain)
	if err != nil {
		t.Fatal(err)
	}
	masters, err := sopsage.MasterKeysFromRecipients(recipients)
	if err != nil {
		t.Fatal(err)
	}
	var group gosops.KeyGroup
	for _, m := range masters {
		group = append(group, keys.MasterKey(m))
	}
	md.KeyGroups, md.Version = []gosops.KeyGroup{group}, version.Version
	tree := gosops.Tree{Branches: branches, Metadata: md}
	key, errs := tree.GenerateDataKeyWithKeyServices([]keyservice.KeyServiceClient{keyservice.NewLocalClient()})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	cipher := aes.NewCipher()
	mac, err := tree.Encrypt(key, cipher)
	if err != nil {
		t.Fatal(err)
	}
	tree.Metadata.LastModified = time.Unix(1700000000, 0).UTC()
	if tree.Metadata.MessageAuthenticationCode, err = cipher.Encrypt(mac, key, tree.Metadata.LastModified.Format(time.RFC3339)); err != nil {
		t.Fatal(err)
	}
	out, err := store.EmitEncryptedFile(tree)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// masked replaces what differs between two encryptions of the same file
// (ciphertexts, IVs, wrapped keys) so the layouts compare.
func masked(b []byte) string {
	s := regexp.MustCompile(`ENC\[AES256_GCM,data:[^,]*,iv:[^,]*,tag:[^,]*,type:([a-z]+)\]`).ReplaceAllString(string(b), "ENC[$1]")
	return regexp.MustCompile(`(?s)-----BEGIN AGE ENCRYPTED FILE-----.*?-----END AGE ENCRYPTED FILE-----`).ReplaceAllString(s, "AGE")
}

// The format, both ways, under each rule of what is encrypted: the
// library decrypts what Encrypt writes to the same bytes it decrypts its
// own encryption to; Decrypt opens the library's file to those bytes too;
// and both files have the same layout once ciphertexts are masked.
func TestFormatMatchesTheLibrary(t *testing.T) {
	ids := testIdentity(t)
	t.Setenv(sops.KeyFileEnv, "testdata/test-identity.agekey")
	cases := []struct {
		name string
		o    sops.EncryptOptions
		md   gosops.Metadata
	}{
		{"default", sops.EncryptOptions{}, gosops.Metadata{UnencryptedSuffix: gosops.DefaultUnencryptedSuffix}},
		{"encrypted_regex", sops.EncryptOptions{EncryptedRegex: "^(data|stringData)$"}, gosops.Metadata{EncryptedRegex: "^(data|stringData)$"}},
		{"unencrypted_regex", sops.EncryptOptions{UnencryptedRegex: "^(kind|name)$"}, gosops.Metadata{UnencryptedRegex: "^(kind|name)$"}},
		{"encrypted_suffix", sops.EncryptOptions{EncryptedSuffix: "word"}, gosops.Metadata{EncryptedSuffix: "word"}},
		{"mac_only_encrypted", sops.EncryptOptions{EncryptedRegex: "^stringData$", MACOnlyEncrypted: true}, gosops.Metadata{EncryptedRegex: "^stringData$", MACOnlyEncrypted: true}},
	}
	// Comments inside lists are left out: sops v3.13.2 cannot decrypt
	// them (TestListCommentsFailTheCLIsMAC).
	noListComments := listComments.ReplaceAllString(rich, "")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.o.Recipients, c.o.Now = ids.Recipients, time.Unix(1700000000, 0)
			ours, err := sops.Encrypt([]byte(noListComments), c.o)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(ours), "correct-horse") && c.name != "encrypted_suffix" {
				t.Fatalf("the password is in clear:\n%s", ours)
			}
			theirs := libraryEncrypt(t, []byte(noListComments), ids.Recipients[0], c.md)
			if masked(ours) != masked(theirs) {
				t.Errorf("layout differs from the library's.\nours:\n%s\nlibrary:\n%s", masked(ours), masked(theirs))
			}
			want, err := decrypt.DataWithFormat(theirs, formats.Yaml)
			if err != nil {
				t.Fatal(err)
			}
			got, err := decrypt.DataWithFormat(ours, formats.Yaml)
			if err != nil {
				t.Fatalf("the library cannot decrypt ours: %v\n%s", err, ours)
			}
			// Both decrypt to the same text; a comment after a list's last
			// item stays encrypted in both (the library emits it one level
			// deeper than it read it, so its path no longer opens it), and
			// only its ciphertext differs.
			if masked(got) != masked(want) {
				t.Errorf("the library decrypts ours to\n%s\nwant\n%s", got, want)
			}
			mine, err := sops.Decrypt(theirs, ids)
			if err != nil {
				t.Fatalf("Decrypt of the library's file: %v", err)
			}
			if string(mine) != string(want) {
				t.Errorf("Decrypt of the library's file gives\n%s\nwant\n%s", mine, want)
			}
			// A changed clear value fails the MAC unless only encrypted
			// values are covered.
			changed := strings.Replace(string(theirs), "kind: Secret", "kind: ConfigMap", 1)
			if changed == string(theirs) {
				changed = strings.Replace(changed, "token_unencrypted: visible", "token_unencrypted: changed", 1)
			}
			_, err = sops.Decrypt([]byte(changed), ids)
			if macOnly := c.o.MACOnlyEncrypted; (err == nil) != macOnly {
				t.Errorf("a changed clear value (mac_only_encrypted %v): %v", macOnly, err)
			}
		})
	}
}

// listComments matches the comment lines of rich that sit inside a list.
var listComments = regexp.MustCompile(`(?m)^    # (above the first item|after the last item)\n| # beside an item`)

// A comment inside a list, encrypted, is stored as a string item of the
// list; sops v3.13.2 hashes it into the MAC when decrypting but not when
// encrypting (sops.go Tree.Decrypt at v3.13.2), so it fails its own files
// and ours alike, and kustomize-controller v1.9.5 with it. Decrypt still
// opens both (every other sops does); DecryptAsFlux refuses both, naming
// where the comment is.
func TestListCommentsFailTheCLIsMAC(t *testing.T) {
	ids := testIdentity(t)
	t.Setenv(sops.KeyFileEnv, "testdata/test-identity.agekey")
	if listComments.ReplaceAllString(rich, "") == rich {
		t.Fatal("rich holds no comment inside a list")
	}
	theirs := libraryEncrypt(t, []byte(rich), ids.Recipients[0], gosops.Metadata{UnencryptedSuffix: gosops.DefaultUnencryptedSuffix})
	ours, err := sops.Encrypt([]byte(rich), sops.EncryptOptions{Recipients: ids.Recipients})
	if err != nil {
		t.Fatal(err)
	}
	for name, enc := range map[string][]byte{"the library's": theirs, "ours": ours} {
		if _, err := decrypt.DataWithFormat(enc, formats.Yaml); err == nil || !strings.Contains(err.Error(), "Failed to verify data integrity") {
			t.Errorf("the sops v3.13.2 library decrypts %s file with comments in a list: %v", name, err)
		}
		if _, err := sops.Decrypt(enc, ids); err != nil {
			t.Errorf("Decrypt of %s file: %v", name, err)
		}
		if _, err := sops.DecryptAsFlux(enc, ids); err == nil || !strings.Contains(err.Error(), "stringData.list") || !strings.Contains(err.Error(), "kustomize-controller") {
			t.Errorf("DecryptAsFlux of %s file: %v", name, err)
		}
	}
	// Without them, DecryptAsFlux opens what the library opens.
	plain := listComments.ReplaceAllString(rich, "")
	enc := libraryEncrypt(t, []byte(plain), ids.Recipients[0], gosops.Metadata{UnencryptedSuffix: gosops.DefaultUnencryptedSuffix})
	if _, err := sops.DecryptAsFlux(enc, ids); err != nil {
		t.Errorf("DecryptAsFlux without comments in lists: %v", err)
	}
}

// Files the library wrote with the comment rules, which Encrypt never
// writes, still open, with their comments.
func TestDecryptsTheLibrarysCommentRules(t *testing.T) {
	ids := testIdentity(t)
	t.Setenv(sops.KeyFileEnv, "testdata/test-identity.agekey")
	doc := "public: one\n# sops:enc\nsecret: two\nlist:\n  # sops:enc\n  - three\n  - four\n"
	for _, md := range []gosops.Metadata{{EncryptedCommentRegex: "sops:enc"}, {UnencryptedCommentRegex: "sops:enc"}} {
		enc := libraryEncrypt(t, []byte(doc), ids.Recipients[0], md)
		want, err := decrypt.DataWithFormat(enc, formats.Yaml)
		if err != nil {
			t.Fatal(err)
		}
		got, err := sops.Decrypt(enc, ids)
		if err != nil || string(got) != string(want) {
			t.Errorf("%+v: Decrypt gives %v\n%s\nwant\n%s", md, err, got, want)
		}
	}
}

func TestVersionIsTheLibrarys(t *testing.T) {
	if sops.Version != version.Version {
		t.Errorf("sops.Version %s, the library pinned in go.mod is %s", sops.Version, version.Version)
	}
}
