// Package nfs runs the lab's NFSv3 server (MOUNT and NFS on one TCP port, no
// portmapper) exporting a directory under one export path, and gives the lab
// a small NFS client to create, read and remove files over the protocol. The
// kernel NFS client may be absent, so nothing here mounts anything locally.
package nfs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-git/go-billy/v5"
	"github.com/go-git/go-billy/v5/memfs"
	"github.com/go-git/go-billy/v5/osfs"
	"github.com/rs/zerolog"
	gonfs "github.com/willscott/go-nfs"
	nfshelper "github.com/willscott/go-nfs/helpers"
)

// DefaultExportPath is the path clients mount, as in the lab config.
const DefaultExportPath = "/export/k8s"

// StandardPort is the NFS port clients assume when none is given.
const StandardPort = 2049

// Options configures the lab NFS server.
type Options struct {
	// Dir is the exported directory; empty means a fresh temporary directory
	// that Close removes.
	Dir string
	// ExportPath is what clients mount (default /export/k8s). Mounting a
	// directory below it works too, as with a kernel server; anything else
	// is refused with MNT3ERR_ACCES.
	ExportPath string
	// Addr is the TCP listen address (default 127.0.0.1:0). Use
	// "<ip>:2049" for clients that cannot be told a port.
	Addr string
	// Log receives one line per mount request.
	Log zerolog.Logger
}

// Server is a running lab NFS server.
type Server struct {
	dir      string
	ownsDir  bool
	export   string
	listener net.Listener
	log      zerolog.Logger
	done     chan error

	mu     sync.Mutex
	mounts int
	// unexported: the export was withdrawn (SetExported); rootSquash:
	// root acts as the anonymous user (SetRootSquash).
	unexported bool
	rootSquash bool

	closeOnce sync.Once
	closeErr  error
}

// Start listens and serves until Close.
func Start(opts Options) (*Server, error) {
	s := &Server{dir: opts.Dir, export: opts.ExportPath, log: opts.Log.With().Str("component", "lab-nfs").Logger(), done: make(chan error, 1)}
	if s.export == "" {
		s.export = DefaultExportPath
	}
	if !strings.HasPrefix(s.export, "/") {
		return nil, fmt.Errorf("NFS export path %q is not absolute", s.export)
	}
	s.export = path.Clean(s.export)
	if s.dir == "" {
		d, err := os.MkdirTemp("", "bootstrap-lab-nfs-*")
		if err != nil {
			return nil, fmt.Errorf("creating the NFS export dir: %w", err)
		}
		s.dir, s.ownsDir = d, true
	}
	if err := os.MkdirAll(s.dir, 0o777); err != nil {
		return nil, fmt.Errorf("creating the NFS export dir: %w", err)
	}
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		if s.ownsDir {
			os.RemoveAll(s.dir)
		}
		return nil, fmt.Errorf("NFS server listening on %s: %w", addr, err)
	}
	s.listener = l
	handler := nfshelper.NewCachingHandler(&exportHandler{server: s}, 4096)
	go func() { s.done <- gonfs.Serve(l, handler) }()
	s.log.Info().Str("addr", l.Addr().String()).Str("export", s.export).Str("dir", s.dir).Msg("NFS server serving")
	return s, nil
}

// Addr is the "host:port" the server listens on.
func (s *Server) Addr() string { return s.listener.Addr().String() }

// Host is the address clients use as the NFS server.
func (s *Server) Host() string { return s.listener.Addr().(*net.TCPAddr).IP.String() }

// Port is the TCP port of both MOUNT and NFS.
func (s *Server) Port() int { return s.listener.Addr().(*net.TCPAddr).Port }

// ExportPath is the path clients mount.
func (s *Server) ExportPath() string { return s.export }

// Dir is the exported directory on this machine.
func (s *Server) Dir() string { return s.dir }

// Mounts counts successful MOUNT requests so far.
func (s *Server) Mounts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mounts
}

// SetExported withdraws the export (false) or exports it again (true), as
// exportfs -u and exportfs -a do on a kernel server: while withdrawn every
// MOUNT of it is refused as a path that is not exported (MNT3ERR_ACCES;
// the exact status Linux mountd answers for a withdrawn export is
// unverified). Mounts already made keep their file handles here, where a
// kernel server would answer them NFS3ERR_STALE: the product's clients
// mount afresh for each volume.
func (s *Server) SetExported(exported bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unexported = !exported
	s.log.Info().Bool("exported", exported).Str("export", s.export).Msg("export changed")
}

// Close stops listening (connections already open are cut when their
// clients go) and removes the export dir if Start created it.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		err := s.listener.Close()
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
		}
		if s.ownsDir {
			if rerr := os.RemoveAll(s.dir); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
		if err != nil {
			s.closeErr = fmt.Errorf("closing the NFS server: %w", err)
		}
	})
	return s.closeErr
}

// exportHandler answers MOUNT for the export path and directories below it,
// with AUTH_NULL and AUTH_UNIX accepted, squashing root when told to.
type exportHandler struct {
	server *Server
}

func (h *exportHandler) Mount(_ context.Context, conn net.Conn, req gonfs.MountRequest) (gonfs.MountStatus, billy.Filesystem, []gonfs.AuthFlavor) {
	s := h.server
	p := path.Clean("/" + string(req.Dirpath))
	remote := conn.RemoteAddr().String()
	s.mu.Lock()
	unexported := s.unexported
	s.mu.Unlock()
	var rel string
	switch {
	case unexported:
		s.log.Warn().Str("client", remote).Str("path", p).Msg("mount refused: the export is withdrawn")
		return gonfs.MountStatusErrAcces, h.refused(), nil
	case p == s.export:
	case strings.HasPrefix(p, s.export+"/"):
		rel = strings.TrimPrefix(p, s.export+"/")
	default:
		s.log.Warn().Str("client", remote).Str("path", p).Msg("mount refused: not exported")
		return gonfs.MountStatusErrAcces, h.refused(), nil
	}
	dir := filepath.Join(s.dir, filepath.FromSlash(rel))
	fi, err := os.Stat(dir)
	switch {
	case err != nil:
		return gonfs.MountStatusErrNoEnt, h.refused(), nil
	case !fi.IsDir():
		return gonfs.MountStatusErrNotDir, h.refused(), nil
	}
	s.mu.Lock()
	s.mounts++
	s.mu.Unlock()
	s.log.Debug().Str("client", remote).Str("path", p).Msg("mounted")
	var fs billy.Filesystem = changeFS{osfs.New(dir)}
	if s.squashed(req.Header.Cred) {
		fs = squashFS{changeFS{osfs.New(dir)}}
	}
	return gonfs.MountStatusOk, fs, []gonfs.AuthFlavor{gonfs.AuthFlavorNull, gonfs.AuthFlavorUnix}
}

// refused is the filesystem returned with a failed mount: go-nfs asks for a
// handle of it even then (and crashes on nil), but never sends it.
func (h *exportHandler) refused() billy.Filesystem {
	return memfs.New()
}

func (h *exportHandler) Change(fs billy.Filesystem) billy.Change {
	if c, ok := fs.(billy.Change); ok {
		return c
	}
	return nil
}

func (h *exportHandler) FSStat(context.Context, billy.Filesystem, *gonfs.FSStat) error { return nil }

// Handles are issued by the caching handler wrapped around this one.
func (h *exportHandler) ToHandle(billy.Filesystem, []string) []byte { return nil }
func (h *exportHandler) FromHandle([]byte) (billy.Filesystem, []string, error) {
	return nil, nil, errors.New("handles are resolved by the caching handler")
}
func (h *exportHandler) InvalidateHandle(billy.Filesystem, []byte) error { return nil }
func (h *exportHandler) HandleLimit() int                                { return -1 }

// changeFS adds attribute changes (SETATTR) to an OS-backed billy
// filesystem.
type changeFS struct{ billy.Filesystem }

func (f changeFS) abs(name string) string { return f.Join(f.Root(), name) }

func (f changeFS) Chmod(name string, mode os.FileMode) error { return os.Chmod(f.abs(name), mode) }
func (f changeFS) Lchown(name string, uid, gid int) error    { return os.Lchown(f.abs(name), uid, gid) }
func (f changeFS) Chown(name string, uid, gid int) error     { return os.Chown(f.abs(name), uid, gid) }
func (f changeFS) Chtimes(name string, atime, mtime time.Time) error {
	return os.Chtimes(f.abs(name), atime, mtime)
}

// HostPort splits "host:port", taking StandardPort when no port is given.
func HostPort(addr string) (string, int, error) {
	if net.ParseIP(addr) != nil || !strings.Contains(addr, ":") {
		return addr, StandardPort, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("bad NFS server address %q: %w", addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", 0, fmt.Errorf("bad NFS port in %q", addr)
	}
	return host, p, nil
}
