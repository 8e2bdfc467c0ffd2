package nfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/homelab/bootstrap/internal/oncrpc"
)

// The client speaks MOUNT v3 and NFSv3 (RFC 1813) itself over
// internal/oncrpc, with a source port the kernel picks. An NFS client
// library that binds a random port below 1024 as root (as the one this
// replaced did) can take 111 while no portmapper listens yet, and rpcbind
// started afterwards then runs without its TCP listener (lab/ganesha).

// dialTimeout bounds connecting; callTimeout bounds one call when the
// caller's context has no deadline.
const (
	dialTimeout = 3 * time.Second
	callTimeout = 30 * time.Second
)

// NFSv3 and MOUNT v3 procedures and statuses the client uses.
const (
	mountProcMnt  = 1
	mountProcUmnt = 3

	nfsProcSetattr = 2
	nfsProcLookup  = 3
	nfsProcRead    = 6
	nfsProcWrite   = 7
	nfsProcCreate  = 8
	nfsProcMkdir   = 9
	nfsProcRemove  = 12
	nfsProcRmdir   = 13
	nfsProcRename  = 14
	nfsProcReaddir = 16

	nfs3OK        = 0
	nfs3ErrNoEnt  = 2
	nfs3ErrExist  = 17
	nfs3ErrNotDir = 20

	nf3Dir = 2

	// ioSize is the size of one READ or WRITE.
	ioSize = 64 << 10
)

// mountStatusNames are MOUNT v3's mountstat3 values (RFC 1813 5.1.5).
var mountStatusNames = map[uint32]string{1: "MNT3ERR_PERM", 2: "MNT3ERR_NOENT", 5: "MNT3ERR_IO", 13: "MNT3ERR_ACCES",
	20: "MNT3ERR_NOTDIR", 22: "MNT3ERR_INVAL", 63: "MNT3ERR_NAMETOOLONG", 10004: "MNT3ERR_NOTSUPP", 10006: "MNT3ERR_SERVERFAULT"}

// Status is an NFSv3 error status (nfsstat3).
type Status uint32

func (s Status) Error() string {
	if name, ok := statusNames[s]; ok {
		return name
	}
	return "NFS3 status " + strconv.Itoa(int(s))
}

// statusNames are RFC 1813's nfsstat3 names of the statuses a provisioner
// meets, with what the kernel client turns each into (so a lab message
// reads as a pod's would).
var statusNames = map[Status]string{
	1:  "operation not permitted (NFS3ERR_PERM)",
	2:  "no such file or directory (NFS3ERR_NOENT)",
	13: "permission denied (NFS3ERR_ACCES)",
	17: "file exists (NFS3ERR_EXIST)",
	28: "no space left on device (NFS3ERR_NOSPC)",
	30: "read-only file system (NFS3ERR_ROFS)",
	70: "stale file handle (NFS3ERR_STALE)",
}

// Is lets errors.Is(err, fs.ErrNotExist) and fs.ErrExist match.
func (s Status) Is(target error) bool {
	return (s == nfs3ErrNoEnt && target == fs.ErrNotExist) || (s == nfs3ErrExist && target == fs.ErrExist)
}

// Mount is an NFSv3 mount made over the protocol (no kernel mount): a client
// connection to host:port with one export path mounted.
type Mount struct {
	conn *oncrpc.Conn
	path string
	root []byte
}

// Dial connects to an NFS server that serves MOUNT and NFS on port (no
// portmapper, as the lab server) and mounts exportPath as root (AUTH_UNIX
// uid 0), as a provisioner pod would.
func Dial(ctx context.Context, host string, port int, exportPath string) (*Mount, error) {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	conn, err := oncrpc.Dial(dctx, addr, false)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("connecting to NFS server %s: %w", addr, err)
	}
	conn.AuthUnix("bootstrap-lab", 0, 0)
	m := &Mount{conn: conn, path: exportPath}
	var w oncrpc.Writer
	w.String(exportPath)
	r, err := m.call(ctx, oncrpc.ProgMount, mountProcMnt, w.Bytes())
	if err == nil {
		if st := r.U32(); r.Err() == nil && st != 0 {
			name := mountStatusNames[st]
			if name == "" {
				name = "mountstat3 " + strconv.Itoa(int(st))
			}
			err = errors.New(name)
		} else {
			m.root, err = r.Opaque(), r.Err()
		}
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("mounting %s:%s: %w", addr, exportPath, err)
	}
	return m, nil
}

func (m *Mount) call(ctx context.Context, prog, proc uint32, args []byte) (*oncrpc.Reader, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, callTimeout)
		defer cancel()
	}
	return m.conn.Call(ctx, prog, 3, proc, args)
}

// nfs runs one NFSv3 procedure and returns the results after the status;
// a status other than NFS3_OK is the error.
func (m *Mount) nfs(ctx context.Context, proc uint32, args *oncrpc.Writer) (*oncrpc.Reader, error) {
	r, err := m.call(ctx, oncrpc.ProgNFS, proc, args.Bytes())
	if err != nil {
		return nil, err
	}
	if st := r.U32(); r.Err() != nil {
		return nil, r.Err()
	} else if st != nfs3OK {
		return nil, Status(st)
	}
	return r, nil
}

// Close unmounts (best effort) and closes the connection.
func (m *Mount) Close() {
	var w oncrpc.Writer
	w.String(m.path)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, _ = m.call(ctx, oncrpc.ProgMount, mountProcUmnt, w.Bytes())
	cancel()
	m.conn.Close()
}

// skipPostOpAttr reads a post_op_attr, returning the file type when present.
func skipPostOpAttr(r *oncrpc.Reader) (ftype uint32, ok bool) {
	if !r.Bool() {
		return 0, false
	}
	ftype = r.U32()
	r.Skip(84 - 4) // the rest of fattr3
	return ftype, true
}

func skipWcc(r *oncrpc.Reader) {
	if r.Bool() { // pre_op_attr: size, mtime, ctime
		r.Skip(24)
	}
	skipPostOpAttr(r)
}

// lookup resolves one name in dir.
func (m *Mount) lookup(ctx context.Context, dir []byte, name string) (fh []byte, isDir bool, err error) {
	var w oncrpc.Writer
	w.Opaque(dir)
	w.String(name)
	r, err := m.nfs(ctx, nfsProcLookup, &w)
	if err != nil {
		return nil, false, err
	}
	fh = r.Opaque()
	ftype, _ := skipPostOpAttr(r)
	return fh, ftype == nf3Dir, r.Err()
}

// walk resolves p (relative to the export) component by component.
func (m *Mount) walk(ctx context.Context, p string) (fh []byte, isDir bool, err error) {
	fh, isDir = m.root, true
	for _, part := range split(p) {
		if fh, isDir, err = m.lookup(ctx, fh, part); err != nil {
			return nil, false, fmt.Errorf("looking up %s: %w", p, err)
		}
	}
	return fh, isDir, nil
}

// parent resolves the directory holding p and returns it with p's name.
func (m *Mount) parent(ctx context.Context, p string) ([]byte, string, error) {
	parts := split(p)
	if len(parts) == 0 {
		return nil, "", fmt.Errorf("%q names the export itself", p)
	}
	dir, _, err := m.walk(ctx, strings.Join(parts[:len(parts)-1], "/"))
	return dir, parts[len(parts)-1], err
}

func split(p string) []string {
	var out []string
	for _, part := range strings.Split(strings.Trim(path.Clean("/"+p), "/"), "/") {
		if part != "" {
			out = append(out, part)
		}
	}
	return out
}

// sattr3 with only the fields given set (mode < 0 and size < 0: unset).
func sattr(w *oncrpc.Writer, mode int64, size int64) {
	w.Bool(mode >= 0)
	if mode >= 0 {
		w.U32(uint32(mode))
	}
	w.Bool(false) // uid
	w.Bool(false) // gid
	w.Bool(size >= 0)
	if size >= 0 {
		w.U64(uint64(size))
	}
	w.U32(0) // atime: don't change
	w.U32(0) // mtime: don't change
}

func (m *Mount) setattr(ctx context.Context, fh []byte, mode, size int64) error {
	var w oncrpc.Writer
	w.Opaque(fh)
	sattr(&w, mode, size)
	w.Bool(false) // no guard
	_, err := m.nfs(ctx, nfsProcSetattr, &w)
	return err
}

// MkdirAll creates dir (relative to the export) and its parents with perm,
// then sets perm explicitly, as the NFS provisioner does (its umask must not
// narrow it).
func (m *Mount) MkdirAll(ctx context.Context, dir string, perm os.FileMode) error {
	fh := m.root
	for _, part := range split(dir) {
		next, _, err := m.lookup(ctx, fh, part)
		if errors.Is(err, fs.ErrNotExist) {
			var w oncrpc.Writer
			w.Opaque(fh)
			w.String(part)
			sattr(&w, int64(perm.Perm()), -1)
			r, merr := m.nfs(ctx, nfsProcMkdir, &w)
			switch {
			case errors.Is(merr, fs.ErrExist): // made meanwhile
				next, _, err = m.lookup(ctx, fh, part)
			case merr != nil:
				return fmt.Errorf("mkdir %s: %w", part, merr)
			case r.Bool(): // post_op_fh3
				next, err = r.Opaque(), r.Err()
			default:
				next, _, err = m.lookup(ctx, fh, part)
			}
		}
		if err != nil {
			return fmt.Errorf("mkdir %s: %w", dir, err)
		}
		fh = next
	}
	return m.setattr(ctx, fh, int64(perm.Perm()), -1)
}

// Exists reports whether p (relative to the export) exists.
func (m *Mount) Exists(ctx context.Context, p string) (bool, error) {
	_, _, err := m.walk(ctx, p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// WriteFile creates or truncates p and writes data.
func (m *Mount) WriteFile(ctx context.Context, p string, data []byte, perm os.FileMode) error {
	dir, name, err := m.parent(ctx, p)
	if err != nil {
		return err
	}
	fh, _, err := m.lookup(ctx, dir, name)
	switch {
	case err == nil:
		err = m.setattr(ctx, fh, int64(perm.Perm()), 0)
	case errors.Is(err, fs.ErrNotExist):
		var w oncrpc.Writer
		w.Opaque(dir)
		w.String(name)
		w.U32(1) // GUARDED
		sattr(&w, int64(perm.Perm()), 0)
		if _, err = m.nfs(ctx, nfsProcCreate, &w); err == nil {
			fh, _, err = m.lookup(ctx, dir, name)
		}
	}
	if err != nil {
		return fmt.Errorf("opening %s: %w", p, err)
	}
	for off := 0; off < len(data); {
		chunk := data[off:min(off+ioSize, len(data))]
		var w oncrpc.Writer
		w.Opaque(fh)
		w.U64(uint64(off))
		w.U32(uint32(len(chunk)))
		w.U32(2) // FILE_SYNC
		w.Opaque(chunk)
		r, err := m.nfs(ctx, nfsProcWrite, &w)
		if err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
		skipWcc(r)
		n := r.U32()
		if r.Err() != nil || n == 0 {
			return fmt.Errorf("writing %s: wrote %d bytes at %d (%v)", p, n, off, r.Err())
		}
		off += int(n)
	}
	return nil
}

// ReadFile reads all of p.
func (m *Mount) ReadFile(ctx context.Context, p string) ([]byte, error) {
	fh, _, err := m.walk(ctx, p)
	if err != nil {
		return nil, err
	}
	var out []byte
	for {
		var w oncrpc.Writer
		w.Opaque(fh)
		w.U64(uint64(len(out)))
		w.U32(ioSize)
		r, err := m.nfs(ctx, nfsProcRead, &w)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", p, err)
		}
		skipPostOpAttr(r)
		r.U32() // count
		eof := r.Bool()
		data := r.Opaque()
		if r.Err() != nil {
			return nil, fmt.Errorf("reading %s: %w", p, r.Err())
		}
		out = append(out, data...)
		if eof || len(data) == 0 {
			return out, nil
		}
	}
}

// readDir lists the names in dir (without . and ..).
func (m *Mount) readDir(ctx context.Context, dir []byte) ([]string, error) {
	var (
		names  []string
		cookie uint64
		verf   = make([]byte, 8)
	)
	for {
		var w oncrpc.Writer
		w.Opaque(dir)
		w.U64(cookie)
		w.Fixed(verf)
		w.U32(ioSize)
		r, err := m.nfs(ctx, nfsProcReaddir, &w)
		if err != nil {
			return nil, err
		}
		skipPostOpAttr(r)
		verf = r.Fixed(8)
		for r.Bool() {
			r.U64() // fileid
			name := r.String()
			cookie = r.U64()
			if name != "." && name != ".." {
				names = append(names, name)
			}
		}
		eof := r.Bool()
		if r.Err() != nil {
			return nil, r.Err()
		}
		if eof {
			return names, nil
		}
	}
}

// RemoveAll removes p and everything below it; a missing p is not an error.
func (m *Mount) RemoveAll(ctx context.Context, p string) error {
	dir, name, err := m.parent(ctx, p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := m.removeAll(ctx, dir, name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", p, err)
	}
	return nil
}

func (m *Mount) removeAll(ctx context.Context, dir []byte, name string) error {
	fh, isDir, err := m.lookup(ctx, dir, name)
	if err != nil {
		return err
	}
	proc := uint32(nfsProcRemove)
	if isDir {
		children, err := m.readDir(ctx, fh)
		if err != nil {
			return err
		}
		for _, c := range children {
			if err := m.removeAll(ctx, fh, c); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
		proc = nfsProcRmdir
	}
	var w oncrpc.Writer
	w.Opaque(dir)
	w.String(name)
	_, err = m.nfs(ctx, proc, &w)
	return err
}

// Rename moves from to to, both relative to the export.
func (m *Mount) Rename(ctx context.Context, from, to string) error {
	fdir, fname, err := m.parent(ctx, from)
	if err != nil {
		return err
	}
	tdir, tname, err := m.parent(ctx, to)
	if err != nil {
		return err
	}
	var w oncrpc.Writer
	w.Opaque(fdir)
	w.String(fname)
	w.Opaque(tdir)
	w.String(tname)
	if _, err := m.nfs(ctx, nfsProcRename, &w); err != nil {
		return fmt.Errorf("renaming %s to %s: %w", from, to, err)
	}
	return nil
}

// LocalAddr is the client's end of the connection.
func (m *Mount) LocalAddr() net.Addr { return m.conn.LocalAddr() }
