package infra

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"syscall"
	"time"
)

// A minimal ONC RPC (RFC 5531) client over TCP for the NFS probe: record
// marking, AUTH_NULL/AUTH_UNIX, and every read and write under the caller's
// deadline. It is small on purpose: the probe must end within its deadline
// whatever the server does, which general NFS client libraries (retrying
// calls for minutes) do not promise.

type xdrWriter struct{ bytes.Buffer }

func (w *xdrWriter) u32(v uint32) { _ = binary.Write(&w.Buffer, binary.BigEndian, v) }

func (w *xdrWriter) opaque(b []byte) {
	w.u32(uint32(len(b)))
	w.Write(b)
	if pad := (4 - len(b)%4) % 4; pad > 0 {
		w.Write(make([]byte, pad))
	}
}

func (w *xdrWriter) str(s string) { w.opaque([]byte(s)) }

type xdrReader struct {
	r   *bytes.Reader
	err error
}

func (r *xdrReader) u32() uint32 {
	if r.err != nil {
		return 0
	}
	var v uint32
	r.err = binary.Read(r.r, binary.BigEndian, &v)
	return v
}

func (r *xdrReader) opaque() []byte {
	n := r.u32()
	if r.err != nil {
		return nil
	}
	if n > 1<<20 {
		r.err = fmt.Errorf("xdr: opaque of %d bytes", n)
		return nil
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r.r, b); err != nil {
		r.err = err
		return nil
	}
	if pad := (4 - int(n)%4) % 4; pad > 0 {
		_, r.err = r.r.Seek(int64(pad), io.SeekCurrent)
	}
	return b
}

func (r *xdrReader) str() string { return string(r.opaque()) }

// RPC program numbers.
const (
	progPortmap = 100000
	progNFS     = 100003
	progMount   = 100005
)

// rpcError is an RPC-level refusal (program not offered, version mismatch).
type rpcError struct {
	msg  string
	prog uint32
}

func (e *rpcError) Error() string { return e.msg }

type rpcConn struct {
	conn net.Conn
	xid  uint32
	auth []byte // AUTH_UNIX body; nil means AUTH_NULL
}

// dialRPC connects to addr. As root it binds a reserved source port first:
// many servers (Linux nfsd's default "secure" option) refuse MOUNT requests
// from other ports.
func dialRPC(ctx context.Context, addr string) (*rpcConn, error) {
	var conn net.Conn
	var err error
	if os.Geteuid() == 0 {
		for i := 0; i < 8 && conn == nil; i++ {
			p, _ := rand.Int(rand.Reader, big.NewInt(400))
			d := net.Dialer{LocalAddr: &net.TCPAddr{Port: 600 + int(p.Int64())}}
			conn, err = d.DialContext(ctx, "tcp", addr)
			if err != nil && !errors.Is(err, syscall.EADDRINUSE) && !errors.Is(err, syscall.EADDRNOTAVAIL) {
				break
			}
		}
	}
	if conn == nil {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	x, _ := rand.Int(rand.Reader, big.NewInt(1<<31))
	return &rpcConn{conn: conn, xid: uint32(x.Int64())}, nil
}

func (c *rpcConn) Close() error { return c.conn.Close() }

// authUnix sets AUTH_UNIX credentials for later calls.
func (c *rpcConn) authUnix(machine string, uid, gid uint32) {
	var w xdrWriter
	w.u32(uint32(time.Now().Unix()))
	w.str(machine)
	w.u32(uid)
	w.u32(gid)
	w.u32(1)
	w.u32(gid)
	c.auth = w.Bytes()
}

// call sends one request and returns a reader positioned at the results.
func (c *rpcConn) call(prog, vers, proc uint32, args []byte) (*xdrReader, error) {
	c.xid++
	var w xdrWriter
	w.u32(c.xid)
	w.u32(0) // CALL
	w.u32(2) // RPC version
	w.u32(prog)
	w.u32(vers)
	w.u32(proc)
	if c.auth != nil {
		w.u32(1) // AUTH_UNIX
		w.opaque(c.auth)
	} else {
		w.u32(0)
		w.opaque(nil)
	}
	w.u32(0) // verifier AUTH_NULL
	w.opaque(nil)
	w.Write(args)

	msg := w.Bytes()
	hdr := make([]byte, 4)
	binary.BigEndian.PutUint32(hdr, 0x80000000|uint32(len(msg)))
	if _, err := c.conn.Write(append(hdr, msg...)); err != nil {
		return nil, err
	}
	reply, err := c.readRecord()
	if err != nil {
		return nil, err
	}
	r := &xdrReader{r: bytes.NewReader(reply)}
	if xid := r.u32(); r.err == nil && xid != c.xid {
		return nil, fmt.Errorf("rpc: reply for xid %d, expected %d", xid, c.xid)
	}
	if typ := r.u32(); r.err == nil && typ != 1 {
		return nil, fmt.Errorf("rpc: not a reply")
	}
	switch stat := r.u32(); {
	case r.err != nil:
		return nil, r.err
	case stat == 1: // MSG_DENIED
		if rej := r.u32(); rej == 1 {
			return nil, &rpcError{msg: fmt.Sprintf("rpc: authentication refused (auth_stat %d)", r.u32()), prog: prog}
		}
		return nil, &rpcError{msg: "rpc: RPC version mismatch", prog: prog}
	}
	r.u32() // verifier flavor
	r.opaque()
	switch acc := r.u32(); acc {
	case 0:
		return r, r.err
	case 1:
		return nil, &rpcError{msg: fmt.Sprintf("rpc: program %d not available", prog), prog: prog}
	case 2:
		lo, hi := r.u32(), r.u32()
		return nil, &rpcError{msg: fmt.Sprintf("rpc: program %d version %d not offered (server has %d-%d)", prog, vers, lo, hi), prog: prog}
	case 3:
		return nil, &rpcError{msg: fmt.Sprintf("rpc: procedure %d unavailable", proc), prog: prog}
	default:
		return nil, &rpcError{msg: fmt.Sprintf("rpc: call refused (accept_stat %d)", acc), prog: prog}
	}
}

func (c *rpcConn) readRecord() ([]byte, error) {
	var out []byte
	for {
		hdr := make([]byte, 4)
		if _, err := io.ReadFull(c.conn, hdr); err != nil {
			return nil, err
		}
		n := binary.BigEndian.Uint32(hdr)
		size := n & 0x7fffffff
		if size > 1<<22 {
			return nil, fmt.Errorf("rpc: record of %d bytes", size)
		}
		frag := make([]byte, size)
		if _, err := io.ReadFull(c.conn, frag); err != nil {
			return nil, err
		}
		out = append(out, frag...)
		if n&0x80000000 != 0 {
			return out, nil
		}
	}
}
