package nfs

import (
	"encoding/binary"
	"os"
	"path/filepath"

	"github.com/go-git/go-billy/v5"
	"github.com/willscott/go-nfs-client/nfs/rpc"
)

// Anonymous is the uid and gid root is mapped to under root squash
// (exports(5): anonuid and anongid default to 65534, "nobody").
const Anonymous = 65534

// SetRootSquash turns root squashing on or off, as root_squash in
// /etc/exports does (the Linux default; many NAS boxes set it): a request
// from uid 0 acts as the anonymous user, so root may create entries only
// where "others" may write or in directories the anonymous user owns, and
// what it creates belongs to that user (exports(5); what knfsd does per
// request, fs/nfsd/auth.c nfsd_setuser, is unverified here). The lab
// decides at MOUNT from the mount's AUTH_UNIX credential (its clients use
// one credential per mount); AUTH_NULL counts as the anonymous user too.
func (s *Server) SetRootSquash(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rootSquash = on
	s.log.Info().Bool("root_squash", on).Str("export", s.export).Msg("export changed")
}

// squashed says whether a mount with cred acts as the anonymous user.
func (s *Server) squashed(cred rpc.Auth) bool {
	s.mu.Lock()
	on := s.rootSquash
	s.mu.Unlock()
	if !on {
		return false
	}
	uid, ok := authUnixUID(cred)
	return !ok || uid == 0
}

// authUnixUID reads the uid of an AUTH_UNIX credential (RFC 5531
// authsys_parms: stamp, machinename, uid, gid, gids).
func authUnixUID(cred rpc.Auth) (uint32, bool) {
	const authUnix = 1
	b := cred.Body
	if cred.Flavor != authUnix || len(b) < 8 {
		return 0, false
	}
	n := binary.BigEndian.Uint32(b[4:8])
	off := 8 + int(n+3)/4*4
	if len(b) < off+4 {
		return 0, false
	}
	return binary.BigEndian.Uint32(b[off : off+4]), true
}

// squashFS is an export as the anonymous user sees it: entries are created,
// removed and renamed only in directories that user may write, and are
// its own.
type squashFS struct {
	changeFS
}

// mayWrite says whether the anonymous user may change the directory that
// holds name.
func (f squashFS) mayWrite(name string) error {
	dir := filepath.Dir(f.abs(name))
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if st.Mode().Perm()&0o002 != 0 || ownedByAnonymous(st) && st.Mode().Perm()&0o200 != 0 {
		return nil
	}
	return &os.PathError{Op: "write", Path: name, Err: os.ErrPermission}
}

func (f squashFS) own(name string) { _ = os.Lchown(f.abs(name), Anonymous, Anonymous) }

func (f squashFS) Create(name string) (billy.File, error) {
	return f.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
}

func (f squashFS) OpenFile(name string, flag int, perm os.FileMode) (billy.File, error) {
	if flag&os.O_CREATE != 0 {
		if _, err := os.Stat(f.abs(name)); os.IsNotExist(err) {
			if err := f.mayWrite(name); err != nil {
				return nil, err
			}
			file, err := f.changeFS.OpenFile(name, flag, perm)
			if err == nil {
				f.own(name)
			}
			return file, err
		}
	}
	return f.changeFS.OpenFile(name, flag, perm)
}

func (f squashFS) MkdirAll(name string, perm os.FileMode) error {
	if _, err := os.Stat(f.abs(name)); err == nil {
		return nil
	}
	// Each missing level is created in a directory the user must be
	// able to write.
	if parent := filepath.Dir(name); parent != name && parent != "." && parent != "/" {
		if err := f.MkdirAll(parent, perm); err != nil {
			return err
		}
	}
	if err := f.mayWrite(name); err != nil {
		return err
	}
	if err := f.changeFS.MkdirAll(name, perm); err != nil {
		return err
	}
	f.own(name)
	return nil
}

func (f squashFS) Remove(name string) error {
	if err := f.mayWrite(name); err != nil {
		return err
	}
	return f.changeFS.Remove(name)
}

func (f squashFS) Rename(from, to string) error {
	if err := f.mayWrite(from); err != nil {
		return err
	}
	if err := f.mayWrite(to); err != nil {
		return err
	}
	return f.changeFS.Rename(from, to)
}

func (f squashFS) Symlink(target, link string) error {
	if err := f.mayWrite(link); err != nil {
		return err
	}
	return f.changeFS.Symlink(target, link)
}
