// Package sealed keeps the files that hold keys but are derived from the
// cluster's secrets bundle (machine configs, talosconfig, kubeconfig):
// plaintext (mode 0600) when the bundle is plaintext, age-encrypted to the
// bundle's recipients when it is encrypted, so no key sits in plaintext on
// disk beside an encrypted bundle. The age CLI opens every sealed file:
// `age -d -i keys.txt nodes/cp-1.yaml.age`.
package sealed

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"filippo.io/age"
	"filippo.io/age/armor"

	"github.com/homelab/bootstrap/internal/fsutil"
)

// Suffix ends the name of a sealed file: the plaintext file's name + ".age".
const Suffix = ".age"

// Files reads and writes derived files that hold keys. Each is named by its
// plaintext path; a sealed one lives at that path + Suffix. A nil *Files
// keeps everything plaintext.
type Files struct {
	// Recipients seal every file written; none writes plaintext.
	Recipients []age.Recipient
	// Identities open sealed files; called on the first one read.
	Identities func() ([]age.Identity, error)
	// Source names where the identities come from, for messages.
	Source string
}

// Sealing says whether files are written encrypted.
func (f *Files) Sealing() bool { return f != nil && len(f.Recipients) > 0 }

// Path is where the file named by path is kept when written now.
func (f *Files) Path(path string) string {
	if f.Sealing() {
		return path + Suffix
	}
	return path
}

// Stored is where the file named by path is kept on disk, sealed or not,
// and whether it is sealed; fs.ErrNotExist when it is neither.
func Stored(path string) (string, bool, error) {
	// A sealed copy wins: a plaintext one beside it is a leftover the
	// next write removes.
	for _, p := range []string{path + Suffix, path} {
		_, err := os.Stat(p)
		if err == nil {
			return p, p != path, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", false, err
		}
	}
	return "", false, fmt.Errorf("%s: %w", path, fs.ErrNotExist)
}

// Read returns the plaintext of the file named by path, decrypting its
// sealed copy when that is what is kept. A missing file is fs.ErrNotExist
// (wrapped).
func (f *Files) Read(path string) ([]byte, error) {
	data, _, err := f.read(path)
	return data, err
}

// read is Read, with where the file is kept.
func (f *Files) read(path string) ([]byte, string, error) {
	stored, isSealed, err := Stored(path)
	if err != nil {
		return nil, "", err
	}
	data, err := os.ReadFile(stored)
	if err != nil || !isSealed {
		return data, stored, err
	}
	if f == nil || f.Identities == nil {
		return nil, "", fmt.Errorf("%s is age-encrypted and no age identity is configured: set secrets.age.keyFile", stored)
	}
	ids, err := f.Identities()
	if err != nil {
		return nil, "", fmt.Errorf("opening %s: %w", stored, err)
	}
	plain, err := Open(data, ids)
	if err != nil {
		return nil, "", fmt.Errorf("opening %s with %s: %w", stored, f.Source, err)
	}
	return plain, stored, nil
}

// Compare reads the file named by path and says whether it already is
// data, kept in the form Path gives with no other form beside it. old is
// its plaintext; a missing file is fs.ErrNotExist (wrapped).
func (f *Files) Compare(path string, data []byte) (old []byte, same bool, err error) {
	old, stored, err := f.read(path)
	if err != nil {
		return nil, false, err
	}
	if !bytes.Equal(old, data) || stored != f.Path(path) {
		return old, false, nil
	}
	if !f.Sealing() {
		// A sealed copy would have been the one read (Stored).
		return old, true, nil
	}
	// Kept sealed: a plaintext leftover beside it still has to go.
	switch _, err := os.Stat(path); {
	case errors.Is(err, fs.ErrNotExist):
		return old, true, nil
	case err != nil:
		return old, false, err
	}
	return old, false, nil
}

// other is the form of path that Path does not give.
func (f *Files) other(path string) string {
	if f.Sealing() {
		return path
	}
	return path + Suffix
}

// WriteIfChanged keeps data as the file named by path (0600, atomically),
// sealed when Recipients are set, and reports whether anything was
// written. An unchanged file, and its mtime, is left alone: a sealed one
// is compared after opening it, since every sealing differs. The other
// form, left from before encryption was switched on or off, is removed
// once the new one is in place.
func (f *Files) WriteIfChanged(path string, data []byte) (bool, error) {
	_, same, err := f.Compare(path, data)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	if same {
		return false, nil
	}
	out := data
	if f.Sealing() {
		if out, err = Seal(data, f.Recipients); err != nil {
			return false, fmt.Errorf("sealing %s: %w", f.Path(path), err)
		}
	}
	if err := fsutil.WriteAtomic(f.Path(path), out, 0o600); err != nil {
		return false, err
	}
	if err := os.Remove(f.other(path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return true, err
	}
	return true, nil
}

// ParseRecipient parses an age public key as the age CLI v1.3.1 does
// (parse.go parseRecipient): post-quantum hybrid (age1pq1…, age-keygen
// -pq) or X25519 (age1…).
func ParseRecipient(s string) (age.Recipient, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "age1pq1") {
		return age.ParseHybridRecipient(s)
	}
	return age.ParseX25519Recipient(s)
}

// ErrMixedRecipients says a list holds both post-quantum and classic
// recipients: age v1.3.1 refuses to encrypt one file to both (age.go
// encryptHdr, "incompatible recipients"), since the classic ones would
// leave it open to a quantum computer. SOPS files are not affected: sops
// wraps the data key in a separate age file per recipient.
var ErrMixedRecipients = errors.New("post-quantum (age1pq1…) and classic (age1…) recipients cannot be mixed: age refuses to encrypt one file to both; use one kind")

// ParseRecipients parses age public keys (ParseRecipient) that one file
// can be encrypted to: all post-quantum or all classic.
func ParseRecipients(keys []string) ([]age.Recipient, error) {
	var out []age.Recipient
	pq := 0
	for _, k := range keys {
		r, err := ParseRecipient(k)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", k, err)
		}
		if _, ok := r.(*age.HybridRecipient); ok {
			pq++
		}
		out = append(out, r)
	}
	if pq > 0 && pq < len(out) {
		return nil, ErrMixedRecipients
	}
	return out, nil
}

// Seal encrypts plain to recipients with age, ASCII-armored (text, so a
// diff or a terminal shows what it is).
func Seal(plain []byte, recipients []age.Recipient) ([]byte, error) {
	var buf bytes.Buffer
	aw := armor.NewWriter(&buf)
	w, err := age.Encrypt(aw, recipients...)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(plain); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	if err := aw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Open decrypts age data, armored or binary, with ids.
func Open(data []byte, ids []age.Identity) ([]byte, error) {
	r, err := Decrypter(bytes.NewReader(data), ids)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(r)
}

// Decrypter reads the plaintext of an age file, armored or binary, with
// ids. Armor is recognised by its header after leading whitespace, as the
// age CLI does (cmd/age/age.go decrypt at filippo.io/age v1.3.1).
func Decrypter(src io.Reader, ids []age.Identity) (io.Reader, error) {
	rr := bufio.NewReader(src)
	var in io.Reader = rr
	const maxWhitespace = 1024
	if start, _ := rr.Peek(maxWhitespace + len(armor.Header)); strings.HasPrefix(string(bytes.TrimSpace(start)), armor.Header) {
		in = armor.NewReader(rr)
	}
	return age.Decrypt(in, ids...)
}
