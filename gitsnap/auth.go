package gitsnap

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/homelab/bootstrap/internal/fsutil"
)

// AuthFileName is the per-cluster credential file of the snapshot server,
// in the cluster's state directory (which no snapshot ever contains).
const AuthFileName = "gitsnap-auth"

// authUser is the user name clients present; the password is the secret.
const authUser = "flux"

// BasicAuth is the credential clients of the snapshot server present
// (HTTP basic auth, RFC 7617). Flux sends it from the GitRepository's
// secretRef Secret (username, password).
type BasicAuth struct {
	Username string
	Password string
}

// EnsureAuth returns the cluster's snapshot credential from stateDir,
// creating it once (0600, 32 random bytes) and never rewriting it, and the
// path of its file.
func EnsureAuth(stateDir string) (BasicAuth, string, error) {
	path := filepath.Join(stateDir, AuthFileName)
	a, err := ReadAuth(path)
	if err == nil {
		return a, path, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return BasicAuth{}, "", err
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return BasicAuth{}, "", err
	}
	a = BasicAuth{Username: authUser, Password: base64.RawURLEncoding.EncodeToString(b)}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return BasicAuth{}, "", err
	}
	if err := fsutil.WriteNew(path, []byte(a.Username+":"+a.Password+"\n"), 0o600); err != nil {
		if errors.Is(err, fsutil.ErrExists) {
			// Another run created it first: use theirs.
			a, err = ReadAuth(path)
			return a, path, err
		}
		return BasicAuth{}, "", fmt.Errorf("writing the snapshot credential: %w", err)
	}
	return a, path, nil
}

// ReadAuth reads a credential file ("user:password"). It refuses a file
// others may read: the password guards the served tree.
func ReadAuth(path string) (BasicAuth, error) {
	st, err := os.Stat(path)
	if err != nil {
		return BasicAuth{}, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return BasicAuth{}, fmt.Errorf("%s is readable by others (mode %#o): chmod 600 it", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return BasicAuth{}, err
	}
	user, pass, ok := strings.Cut(strings.TrimSpace(string(b)), ":")
	if !ok || user == "" || len(pass) < 16 {
		return BasicAuth{}, fmt.Errorf("%s: want one line user:password with a password of at least 16 characters", path)
	}
	return BasicAuth{Username: user, Password: pass}, nil
}

// allows reports whether r carries this credential; the comparison takes
// the same time whatever the input.
func (a *BasicAuth) allows(r *http.Request) bool {
	user, pass, ok := r.BasicAuth()
	if !ok {
		return false
	}
	u := subtle.ConstantTimeCompare([]byte(user), []byte(a.Username))
	p := subtle.ConstantTimeCompare([]byte(pass), []byte(a.Password))
	return u&p == 1
}

// set adds the credential to an outgoing request (the probe).
func (a *BasicAuth) set(r *http.Request) {
	if a != nil {
		r.SetBasicAuth(a.Username, a.Password)
	}
}
