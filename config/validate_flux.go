package config

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// knownHosts checks flux.auth.knownHostsFile for an ssh:// repository. It
// is required: source-controller builds its git auth with fluxcd/pkg/git,
// whose AuthOptions.Validate (options.go at v0.52.0, the version
// source-controller v1.9.5 pins) refuses an SSH transport without
// known_hosts, so a GitRepository without it never syncs. The file must
// parse and hold a key for the repository's host and port, as OpenSSH
// would look it up (port 22 as the bare host, others as [host]:port).
func (v *validator) knownHosts(u *url.URL) {
	f := v.c.Flux.Auth.KnownHostsFile
	port := u.Port()
	if port == "" {
		port = "22"
	}
	addr := knownhosts.Normalize(net.JoinHostPort(u.Hostname(), port))
	scan := "ssh-keyscan " + u.Hostname()
	if port != "22" {
		scan = "ssh-keyscan -p " + port + " " + u.Hostname()
	}
	if f == "" {
		v.errf("flux.auth.knownHostsFile", "is required for the ssh repository %s: source-controller refuses SSH without known_hosts. "+
			"Write it with `%s > known_hosts`, compare the fingerprints (ssh-keygen -lf known_hosts) with your git server's, and set this field", u.Redacted(), scan)
		return
	}
	if _, err := os.Stat(v.c.Resolve(f)); err != nil {
		v.errf("flux.auth.knownHostsFile", "%s cannot be read: %v", f, unwrapPathErr(err))
		return
	}
	found, err := knownHostsHas(v.c.Resolve(f), net.JoinHostPort(u.Hostname(), port))
	switch {
	case err != nil:
		// knownhosts names the file by the path it was given: say it as the config does.
		msg := strings.ReplaceAll(strings.TrimPrefix(err.Error(), "knownhosts: "), v.c.Resolve(f), f)
		v.errf("flux.auth.knownHostsFile", "%s is not a known_hosts file: %s", f, msg)
	case !found:
		v.errf("flux.auth.knownHostsFile", "%s has no key for %s (the host of %s): add it with `%s >> %s` after checking its fingerprint", f, addr, u.Redacted(), scan, f)
	}
}

// knownHostsHas reports whether the known_hosts file at path has a key for
// addr (host:port), with OpenSSH's matching (hashed names, patterns,
// markers) as x/crypto's knownhosts implements it: a lookup with a key
// nobody has fails, and says which keys it wanted.
func knownHostsHas(path, addr string) (bool, error) {
	cb, err := knownhosts.New(path)
	if err != nil {
		return false, err
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return false, err
	}
	probe, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return false, err
	}
	host, port, _ := net.SplitHostPort(addr)
	remote := &net.TCPAddr{IP: net.ParseIP(host)}
	if remote.IP == nil {
		remote.IP = net.IPv4zero
	}
	remote.Port, _ = strconv.Atoi(port)
	var ke *knownhosts.KeyError
	if err := cb(addr, remote, probe.PublicKey()); errors.As(err, &ke) {
		return len(ke.Want) > 0, nil
	}
	// Accepted (impossible for a fresh key) or revoked: the host is named.
	return true, nil
}

// snapshotTLS checks the snapshot server's optional TLS: certificate and
// key together, a pair that loads as the server will load it
// (tls.LoadX509KeyPair), an https:// URL exactly when TLS is on, and a key
// only its owner can read.
func (v *validator) snapshotTLS(u *url.URL) {
	ls := v.c.Flux.LocalSnapshot
	on := ls.TLSCertFile != "" || ls.TLSKeyFile != ""
	switch {
	case on && (ls.TLSCertFile == "" || ls.TLSKeyFile == ""):
		v.errf("flux.localSnapshot", "set both tlsCertFile and tlsKeyFile, or neither")
		return
	case u == nil || u.Host == "":
		return // the URL is reported already
	case on && u.Scheme != "https":
		v.errf("flux.localSnapshot.url", "%s must be https:// when tlsCertFile is set (the server speaks only TLS)", ls.URL)
	case !on && u.Scheme == "https":
		v.errf("flux.localSnapshot.url", "%s is https:// but no tlsCertFile/tlsKeyFile is set: set them, or use http:// (the credential still keeps strangers out)", ls.URL)
	}
	if !on {
		return
	}
	cert, key := v.c.Resolve(ls.TLSCertFile), v.c.Resolve(ls.TLSKeyFile)
	if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
		msg := strings.ReplaceAll(strings.ReplaceAll(err.Error(), cert, ls.TLSCertFile), key, ls.TLSKeyFile)
		v.errf("flux.localSnapshot.tlsCertFile", "%s and %s are not a certificate and its key: %s", ls.TLSCertFile, ls.TLSKeyFile, msg)
		return
	}
}
