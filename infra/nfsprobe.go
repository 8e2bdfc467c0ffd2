package infra

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/internal/oncrpc"
)

// NFSVerdict is the outcome of probing an NFS export.
type NFSVerdict string

// Verdicts of ProbeNFS.
const (
	NFSOK           NFSVerdict = "ok"
	NFSUnreachable  NFSVerdict = "unreachable"
	NFSNotExported  NFSVerdict = "not-exported"
	NFSNotToThis    NFSVerdict = "not-exported-to-this-host"
	NFSWriteRefused NFSVerdict = "write-refused"
	NFSv4Only       NFSVerdict = "nfsv4-only"
	NFSError        NFSVerdict = "error"
)

// NFSProbeOptions say what to probe and how.
type NFSProbeOptions struct {
	Server string
	Path   string
	// PortmapperPort is where to ask for the MOUNT and NFS ports (111).
	PortmapperPort int
	// MountPort and NFSPort, when set, skip the portmapper for that program.
	MountPort int
	NFSPort   int
	// WriteTest creates and removes a file as root to catch root squashing.
	WriteTest bool
	// Timeout bounds the whole probe, every network step included.
	Timeout time.Duration
}

// NFSExport is one entry of the server's export list.
type NFSExport struct {
	Path   string
	Groups []string
}

// NFSProbeResult is what ProbeNFS found.
type NFSProbeResult struct {
	Verdict NFSVerdict
	Detail  string
	Exports []NFSExport
}

// NFS protocol constants the probe uses.
const (
	mountProcMnt    = 1
	mountProcUmnt   = 3
	mountProcExport = 5
	nfsProcCreate   = 8
	nfsProcRemove   = 12
	mnt3ErrAcces    = 13
	nfs3ErrPerm     = 1
	nfs3ErrAcces    = 13
	nfs3ErrRofs     = 30
)

// ProbeNFS checks that the export is reachable and usable from this host:
// portmapper → MOUNT export list → mount → optional write test → unmount,
// all under one deadline. It never leaves anything behind on the export.
func ProbeNFS(ctx context.Context, o NFSProbeOptions) NFSProbeResult {
	if o.Timeout <= 0 {
		o.Timeout = 15 * time.Second
	}
	if o.PortmapperPort == 0 {
		o.PortmapperPort = 111
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	p := &nfsProbe{o: o}
	res := p.run(ctx)
	if res.Verdict == "" {
		res.Verdict = NFSOK
	}
	return res
}

type nfsProbe struct {
	o NFSProbeOptions
}

func (p *nfsProbe) addr(port int) string { return net.JoinHostPort(p.o.Server, strconv.Itoa(port)) }

func (p *nfsProbe) unreachable(ctx context.Context, what string, err error) NFSProbeResult {
	if ctx.Err() != nil {
		return NFSProbeResult{Verdict: NFSUnreachable, Detail: fmt.Sprintf("%s: no answer within %s", what, p.o.Timeout)}
	}
	return NFSProbeResult{Verdict: NFSUnreachable, Detail: fmt.Sprintf("%s: %v", what, err)}
}

func (p *nfsProbe) run(ctx context.Context) NFSProbeResult {
	// As root, from a reserved port: many servers (Linux nfsd's default
	// "secure" option) refuse MOUNT requests from other ports.
	reserved := os.Geteuid() == 0
	mountPort, nfsPort := p.o.MountPort, p.o.NFSPort
	if mountPort == 0 || nfsPort == 0 {
		pm, err := oncrpc.Dial(ctx, p.addr(p.o.PortmapperPort), reserved)
		if err != nil {
			// No portmapper: an NFSv4-only server still answers on 2049.
			if nfsPort == 0 {
				nfsPort = 2049
			}
			if c, err2 := oncrpc.Dial(ctx, p.addr(nfsPort), reserved); err2 == nil {
				c.Close()
				return NFSProbeResult{Verdict: NFSv4Only, Detail: fmt.Sprintf("%s answers on port %d but has no portmapper on %d (%v): probably NFSv4-only; the export could not be verified", p.o.Server, nfsPort, p.o.PortmapperPort, err)}
			}
			return p.unreachable(ctx, "portmapper "+p.addr(p.o.PortmapperPort), err)
		}
		defer pm.Close()
		if mountPort == 0 {
			mountPort, err = getPort(ctx, pm, oncrpc.ProgMount, 3)
			if err != nil {
				return NFSProbeResult{Verdict: NFSError, Detail: fmt.Sprintf("asking the portmapper for MOUNT v3: %v", err)}
			}
		}
		if nfsPort == 0 {
			nfsPort, err = getPort(ctx, pm, oncrpc.ProgNFS, 3)
			if err != nil {
				return NFSProbeResult{Verdict: NFSError, Detail: fmt.Sprintf("asking the portmapper for NFS v3: %v", err)}
			}
		}
		if mountPort == 0 || nfsPort == 0 {
			if v4, _ := getPort(ctx, pm, oncrpc.ProgNFS, 4); v4 != 0 {
				return NFSProbeResult{Verdict: NFSv4Only, Detail: fmt.Sprintf("%s offers NFSv4 only (no MOUNT/NFSv3 registered): the export could not be verified", p.o.Server)}
			}
			return NFSProbeResult{Verdict: NFSError, Detail: fmt.Sprintf("%s has a portmapper but no MOUNT v3 / NFS v3 service registered", p.o.Server)}
		}
	}

	mc, err := oncrpc.Dial(ctx, p.addr(mountPort), reserved)
	if err != nil {
		return p.unreachable(ctx, "MOUNT service "+p.addr(mountPort), err)
	}
	defer mc.Close()
	exports, err := exportList(ctx, mc)
	listing := true
	var rerr *oncrpc.Error
	if errors.As(err, &rerr) {
		// Some servers do not list exports (EXPORT disabled or not
		// implemented): the mount below still tells whether the path works.
		listing, err = false, nil
	}
	if err != nil {
		return NFSProbeResult{Verdict: NFSError, Detail: fmt.Sprintf("reading the export list: %v", err)}
	}
	res := NFSProbeResult{Exports: exports}
	var listed *NFSExport
	for i := range exports {
		if strings.TrimSuffix(exports[i].Path, "/") == strings.TrimSuffix(p.o.Path, "/") {
			listed = &exports[i]
		}
	}
	hostname, _ := os.Hostname()
	mc.AuthUnix(hostname, 0, 0)
	fh, status, err := mount(ctx, mc, p.o.Path)
	switch {
	case err != nil:
		res.Verdict, res.Detail = NFSError, fmt.Sprintf("mounting %s: %v", p.o.Path, err)
		return res
	case status != 0 && !listing:
		res.Verdict, res.Detail = NFSNotExported, fmt.Sprintf("%s refuses to mount %s for this host (MNT3 status %d; the server does not list its exports)", p.o.Server, p.o.Path, status)
		return res
	case status != 0 && listed == nil:
		// Servers differ: Linux mountd lists every export with its clients,
		// ganesha lists only what this client may mount. Either way the
		// path is not available to this host.
		res.Verdict, res.Detail = NFSNotExported, fmt.Sprintf("%s does not export %s to this host (exports it lists for this host: %s)", p.o.Server, p.o.Path, exportNames(exports))
		return res
	case status == mnt3ErrAcces:
		res.Verdict, res.Detail = NFSNotToThis, fmt.Sprintf("%s exports %s only to %s, not to this host (%s)", p.o.Server, p.o.Path, strings.Join(listed.Groups, ", "), localAddr(mc))
		return res
	case status != 0:
		res.Verdict, res.Detail = NFSError, fmt.Sprintf("mounting %s refused: MNT3 status %d", p.o.Path, status)
		return res
	}
	defer func() { _, _ = mc.Call(ctx, oncrpc.ProgMount, 3, mountProcUmnt, xdrStr(p.o.Path)) }()

	if !p.o.WriteTest {
		res.Detail = fmt.Sprintf("%s:%s exported and mountable (write test off)", p.o.Server, p.o.Path)
		return res
	}
	nc, err := oncrpc.Dial(ctx, p.addr(nfsPort), reserved)
	if err != nil {
		return p.unreachable(ctx, "NFS service "+p.addr(nfsPort), err)
	}
	defer nc.Close()
	nc.AuthUnix(hostname, 0, 0)
	name := ".bootstrap-probe-" + randomHex(4)
	st, err := nfsCreate(ctx, nc, fh, name)
	switch {
	case err != nil:
		res.Verdict, res.Detail = NFSError, fmt.Sprintf("write test: %v", err)
	case st == nfs3ErrAcces || st == nfs3ErrPerm:
		res.Verdict, res.Detail = NFSWriteRefused, fmt.Sprintf("%s:%s refuses writes from root (root squashing?): the provisioner creates directories as root; export it with no_root_squash or make the directory writable for the squashed user", p.o.Server, p.o.Path)
	case st == nfs3ErrRofs:
		res.Verdict, res.Detail = NFSWriteRefused, fmt.Sprintf("%s:%s is exported read-only", p.o.Server, p.o.Path)
	case st != 0:
		res.Verdict, res.Detail = NFSError, fmt.Sprintf("write test: NFS3 status %d", st)
	default:
		if rst, err := nfsRemove(ctx, nc, fh, name); err != nil || rst != 0 {
			res.Verdict, res.Detail = NFSError, fmt.Sprintf("write test: created %s but could not remove it (status %d, %v)", name, rst, err)
			return res
		}
		res.Detail = fmt.Sprintf("%s:%s exported, mountable and writable as root", p.o.Server, p.o.Path)
	}
	return res
}

func getPort(ctx context.Context, pm *oncrpc.Conn, prog, vers uint32) (int, error) {
	var w oncrpc.Writer
	w.U32(prog)
	w.U32(vers)
	w.U32(6) // TCP
	w.U32(0)
	r, err := pm.Call(ctx, oncrpc.ProgPortmap, 2, 3, w.Bytes())
	if err != nil {
		return 0, err
	}
	port := r.U32()
	return int(port), r.Err()
}

func exportList(ctx context.Context, c *oncrpc.Conn) ([]NFSExport, error) {
	r, err := c.Call(ctx, oncrpc.ProgMount, 3, mountProcExport, nil)
	if err != nil {
		return nil, err
	}
	var out []NFSExport
	for r.U32() == 1 && r.Err() == nil {
		e := NFSExport{Path: r.String()}
		for r.U32() == 1 && r.Err() == nil {
			e.Groups = append(e.Groups, r.String())
		}
		out = append(out, e)
	}
	return out, r.Err()
}

func mount(ctx context.Context, c *oncrpc.Conn, path string) (fh []byte, status uint32, err error) {
	r, err := c.Call(ctx, oncrpc.ProgMount, 3, mountProcMnt, xdrStr(path))
	if err != nil {
		return nil, 0, err
	}
	status = r.U32()
	if status == 0 {
		fh = r.Opaque()
	}
	return fh, status, r.Err()
}

func nfsCreate(ctx context.Context, c *oncrpc.Conn, dir []byte, name string) (uint32, error) {
	var w oncrpc.Writer
	w.Opaque(dir)
	w.String(name)
	w.U32(0) // UNCHECKED
	w.U32(1) // set mode
	w.U32(0o600)
	w.U32(0) // uid, gid, size: don't set
	w.U32(0)
	w.U32(0)
	w.U32(0) // atime, mtime: don't change
	w.U32(0)
	r, err := c.Call(ctx, oncrpc.ProgNFS, 3, nfsProcCreate, w.Bytes())
	if err != nil {
		return 0, err
	}
	st := r.U32()
	return st, r.Err()
}

func nfsRemove(ctx context.Context, c *oncrpc.Conn, dir []byte, name string) (uint32, error) {
	var w oncrpc.Writer
	w.Opaque(dir)
	w.String(name)
	r, err := c.Call(ctx, oncrpc.ProgNFS, 3, nfsProcRemove, w.Bytes())
	if err != nil {
		return 0, err
	}
	st := r.U32()
	return st, r.Err()
}

func xdrStr(s string) []byte {
	var w oncrpc.Writer
	w.String(s)
	return w.Bytes()
}

func exportNames(e []NFSExport) string {
	if len(e) == 0 {
		return "none"
	}
	names := make([]string, len(e))
	for i, x := range e {
		names[i] = x.Path
	}
	return strings.Join(names, ", ")
}

func localAddr(c *oncrpc.Conn) string {
	if a, ok := c.LocalAddr().(*net.TCPAddr); ok {
		return "this host connects as " + a.IP.String()
	}
	return "this host"
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// NFSCheck wraps ProbeNFS as a precheck: pass only on NFSOK; NFSv4-only
// is a warning (reachable, export not verified); everything else fails.
func NFSCheck(o NFSProbeOptions) check.Check {
	return check.Check{Name: "nfs export", Run: func(ctx context.Context) (check.Status, string) {
		r := ProbeNFS(ctx, o)
		switch r.Verdict {
		case NFSOK:
			return check.Pass, r.Detail
		case NFSv4Only:
			return check.Warn, r.Detail
		}
		return check.Fail, string(r.Verdict) + ": " + r.Detail
	}}
}
