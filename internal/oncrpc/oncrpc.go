// Package oncrpc is a minimal ONC RPC (RFC 5531) client over TCP: record
// marking, AUTH_NULL/AUTH_UNIX, XDR (RFC 4506) encoding, and every call
// bounded by its context. The product's NFS export probe and the lab's NFS
// client both speak it. It is small on purpose: a call must end within its
// deadline whatever the server does, which general NFS client libraries
// (retrying calls for minutes) do not promise, and the source port is chosen
// here, not at random by a library (see Dial).
package oncrpc

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
	"sync"
	"syscall"
	"time"
)

// RPC program numbers.
const (
	ProgPortmap = 100000
	ProgNFS     = 100003
	ProgMount   = 100005
)

// Writer encodes XDR.
type Writer struct{ bytes.Buffer }

// U32 writes an unsigned int (also enums and bools).
func (w *Writer) U32(v uint32) { _ = binary.Write(&w.Buffer, binary.BigEndian, v) }

// U64 writes an unsigned hyper.
func (w *Writer) U64(v uint64) { _ = binary.Write(&w.Buffer, binary.BigEndian, v) }

// Bool writes an XDR bool.
func (w *Writer) Bool(b bool) {
	if b {
		w.U32(1)
		return
	}
	w.U32(0)
}

// Opaque writes variable-length opaque data, padded to four bytes.
func (w *Writer) Opaque(b []byte) {
	w.U32(uint32(len(b)))
	w.Fixed(b)
}

// Fixed writes fixed-length opaque data (its length is known to both
// sides), padded to four bytes.
func (w *Writer) Fixed(b []byte) {
	w.Write(b)
	if pad := (4 - len(b)%4) % 4; pad > 0 {
		w.Write(make([]byte, pad))
	}
}

// String writes an XDR string.
func (w *Writer) String(s string) { w.Opaque([]byte(s)) }

// Reader decodes XDR; the first error sticks and every later read returns
// zero values, so a decoder checks Err once at the end.
type Reader struct {
	r   *bytes.Reader
	err error
}

// NewReader decodes b.
func NewReader(b []byte) *Reader { return &Reader{r: bytes.NewReader(b)} }

// Err is the first decoding error.
func (r *Reader) Err() error { return r.err }

// U32 reads an unsigned int.
func (r *Reader) U32() uint32 {
	if r.err != nil {
		return 0
	}
	var v uint32
	r.err = binary.Read(r.r, binary.BigEndian, &v)
	return v
}

// U64 reads an unsigned hyper.
func (r *Reader) U64() uint64 {
	if r.err != nil {
		return 0
	}
	var v uint64
	r.err = binary.Read(r.r, binary.BigEndian, &v)
	return v
}

// Bool reads an XDR bool.
func (r *Reader) Bool() bool { return r.U32() != 0 }

// Opaque reads variable-length opaque data (at most 4 MiB).
func (r *Reader) Opaque() []byte {
	n := r.U32()
	if r.err != nil {
		return nil
	}
	if n > 4<<20 {
		r.err = fmt.Errorf("xdr: opaque of %d bytes", n)
		return nil
	}
	return r.Fixed(int(n))
}

// Fixed reads n bytes of fixed-length opaque data and its padding.
func (r *Reader) Fixed(n int) []byte {
	if r.err != nil {
		return nil
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r.r, b); err != nil {
		r.err = err
		return nil
	}
	if pad := (4 - n%4) % 4; pad > 0 {
		_, r.err = r.r.Seek(int64(pad), io.SeekCurrent)
	}
	return b
}

// String reads an XDR string.
func (r *Reader) String() string { return string(r.Opaque()) }

// Skip discards n bytes.
func (r *Reader) Skip(n int) {
	if r.err == nil {
		_, r.err = r.r.Seek(int64(n), io.SeekCurrent)
	}
}

// Error is an RPC-level refusal: the server answered but did not run the
// procedure (authentication refused, program or version not offered).
type Error struct {
	Msg  string
	Prog uint32
}

func (e *Error) Error() string { return e.Msg }

// Conn is one TCP connection carrying RPC calls, one at a time.
type Conn struct {
	mu   sync.Mutex
	conn net.Conn
	xid  uint32
	auth []byte // AUTH_UNIX body; nil means AUTH_NULL
}

// Dial connects to addr. With reservedPort it binds a source port below
// 1024 first, as libtirpc's bindresvport does (600-1023, never the
// well-known ports below 600 such as the portmapper's 111): servers such as
// Linux nfsd with its default "secure" option refuse MOUNT requests from
// other ports. It needs root; without root, or when every try is taken, the
// kernel picks the port. Without reservedPort the kernel always picks it.
// A deadline on ctx bounds the dial and, when the conn is used without a
// context of its own, every call (see Call).
func Dial(ctx context.Context, addr string, reservedPort bool) (*Conn, error) {
	var conn net.Conn
	var err error
	if reservedPort {
		for i := 0; i < 8 && conn == nil; i++ {
			p, _ := rand.Int(rand.Reader, big.NewInt(1024-600))
			d := net.Dialer{LocalAddr: &net.TCPAddr{Port: 600 + int(p.Int64())}}
			conn, err = d.DialContext(ctx, "tcp", addr)
			if err != nil && !errors.Is(err, syscall.EADDRINUSE) && !errors.Is(err, syscall.EADDRNOTAVAIL) && !errors.Is(err, syscall.EACCES) {
				return nil, err
			}
		}
	}
	if conn == nil {
		var d net.Dialer
		if conn, err = d.DialContext(ctx, "tcp", addr); err != nil {
			return nil, err
		}
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	x, _ := rand.Int(rand.Reader, big.NewInt(1<<31))
	return &Conn{conn: conn, xid: uint32(x.Int64())}, nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.conn.Close() }

// LocalAddr is the connection's source address.
func (c *Conn) LocalAddr() net.Addr { return c.conn.LocalAddr() }

// AuthUnix sets AUTH_UNIX credentials for later calls.
func (c *Conn) AuthUnix(machine string, uid, gid uint32) {
	var w Writer
	w.U32(uint32(time.Now().Unix()))
	w.String(machine)
	w.U32(uid)
	w.U32(gid)
	w.U32(1)
	w.U32(gid)
	c.mu.Lock()
	c.auth = w.Bytes()
	c.mu.Unlock()
}

// Call sends one request and returns a reader positioned at the results.
// The call ends when ctx does: its deadline bounds the round trip and its
// cancellation interrupts it (the connection is then unusable: close it).
// A ctx without a deadline keeps the one Dial set, if any.
func (c *Conn) Call(ctx context.Context, prog, vers, proc uint32, args []byte) (*Reader, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.conn.SetDeadline(time.Now()) })
	defer stop()
	r, err := c.call(prog, vers, proc, args)
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("rpc: %w (%v)", ctx.Err(), err)
	}
	return r, err
}

func (c *Conn) call(prog, vers, proc uint32, args []byte) (*Reader, error) {
	c.xid++
	var w Writer
	w.U32(c.xid)
	w.U32(0) // CALL
	w.U32(2) // RPC version
	w.U32(prog)
	w.U32(vers)
	w.U32(proc)
	if c.auth != nil {
		w.U32(1) // AUTH_UNIX
		w.Opaque(c.auth)
	} else {
		w.U32(0)
		w.Opaque(nil)
	}
	w.U32(0) // verifier AUTH_NULL
	w.Opaque(nil)
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
	r := NewReader(reply)
	if xid := r.U32(); r.err == nil && xid != c.xid {
		return nil, fmt.Errorf("rpc: reply for xid %d, expected %d", xid, c.xid)
	}
	if typ := r.U32(); r.err == nil && typ != 1 {
		return nil, fmt.Errorf("rpc: not a reply")
	}
	switch stat := r.U32(); {
	case r.err != nil:
		return nil, r.err
	case stat == 1: // MSG_DENIED
		if rej := r.U32(); rej == 1 {
			return nil, &Error{Msg: fmt.Sprintf("rpc: authentication refused (auth_stat %d)", r.U32()), Prog: prog}
		}
		return nil, &Error{Msg: "rpc: RPC version mismatch", Prog: prog}
	}
	r.U32() // verifier flavor
	r.Opaque()
	switch acc := r.U32(); acc {
	case 0:
		return r, r.err
	case 1:
		return nil, &Error{Msg: fmt.Sprintf("rpc: program %d not available", prog), Prog: prog}
	case 2:
		lo, hi := r.U32(), r.U32()
		return nil, &Error{Msg: fmt.Sprintf("rpc: program %d version %d not offered (server has %d-%d)", prog, vers, lo, hi), Prog: prog}
	case 3:
		return nil, &Error{Msg: fmt.Sprintf("rpc: procedure %d unavailable", proc), Prog: prog}
	default:
		return nil, &Error{Msg: fmt.Sprintf("rpc: call refused (accept_stat %d)", acc), Prog: prog}
	}
}

func (c *Conn) readRecord() ([]byte, error) {
	var out []byte
	for {
		hdr := make([]byte, 4)
		if _, err := io.ReadFull(c.conn, hdr); err != nil {
			return nil, err
		}
		n := binary.BigEndian.Uint32(hdr)
		size := n & 0x7fffffff
		if size > 1<<22 {
			// RFC 5531 record marking: a length this large means what
			// answered does not speak ONC RPC; its first bytes, shown as
			// text when they are, usually say what it is ("HTTP").
			if printable(hdr) {
				return nil, fmt.Errorf("rpc: the answer is not ONC RPC: it starts with %q (another service listens on this port)", hdr)
			}
			return nil, fmt.Errorf("rpc: the answer is not ONC RPC (a record of %d bytes)", size)
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

// printable reports whether b is printable ASCII.
func printable(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}
