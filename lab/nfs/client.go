package nfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	nfsc "github.com/willscott/go-nfs-client/nfs"
	"github.com/willscott/go-nfs-client/nfs/rpc"
)

// dialTimeout bounds connecting; the client library itself has no connect
// timeout and retries a silent server for minutes.
const dialTimeout = 3 * time.Second

// Mount is an NFSv3 mount made over the protocol (no kernel mount): a client
// connection to host:port with one export path mounted.
type Mount struct {
	client *rpc.Client
	target *nfsc.Target
	path   string
}

// Dial connects to an NFS server that serves MOUNT and NFS on port (no
// portmapper, as the lab server) and mounts exportPath as root (AUTH_UNIX
// uid 0), as a provisioner pod would.
func Dial(ctx context.Context, host string, port int, exportPath string) (*Mount, error) {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	// Fail fast on an unreachable server before handing over to the library.
	d := net.Dialer{Timeout: dialTimeout}
	probe, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("connecting to NFS server %s: %w", addr, err)
	}
	probe.Close()
	m := &Mount{path: exportPath}
	err = bounded(ctx, func() error {
		c, err := nfsc.DialServiceAtPort(host, port)
		if err != nil {
			return err
		}
		m.client = c
		t, err := (&nfsc.Mount{Client: c}).Mount(exportPath, rpc.NewAuthUnix("bootstrap-lab", 0, 0).Auth())
		if err != nil {
			return err
		}
		m.target = t
		return nil
	}, func() {
		if m.client != nil {
			m.client.Close()
		}
	})
	if err != nil {
		if m.client != nil {
			m.client.Close()
		}
		return nil, fmt.Errorf("mounting %s:%s: %w", addr, exportPath, err)
	}
	return m, nil
}

// bounded runs op until it returns or ctx ends; on ctx end abort is called
// (closing the connection makes the library give up) and ctx's error is
// returned.
func bounded(ctx context.Context, op func() error, abort func()) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	done := make(chan error, 1)
	go func() { done <- op() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		abort()
		return ctx.Err()
	}
}

func (m *Mount) do(ctx context.Context, op func() error) error {
	return bounded(ctx, op, func() { m.client.Close() })
}

// Close closes the connection.
func (m *Mount) Close() {
	m.client.Close()
}

// MkdirAll creates dir (relative to the export) and its parents with perm,
// then sets perm explicitly, as the NFS provisioner does (its umask must not
// narrow it).
func (m *Mount) MkdirAll(ctx context.Context, dir string, perm os.FileMode) error {
	return m.do(ctx, func() error {
		cur := ""
		for _, part := range strings.Split(strings.Trim(path.Clean("/"+dir), "/"), "/") {
			if part == "" {
				continue
			}
			cur = path.Join(cur, part)
			if _, _, err := m.target.Lookup(cur); err == nil {
				continue
			}
			if _, err := m.target.Mkdir(cur, perm); err != nil && !os.IsExist(err) {
				return fmt.Errorf("mkdir %s: %w", cur, err)
			}
		}
		mode := uint32(perm.Perm())
		return m.target.Setattr(cur, nfsc.Sattr3{Mode: nfsc.SetMode{SetIt: true, Mode: mode}})
	})
}

// Exists reports whether p (relative to the export) exists.
func (m *Mount) Exists(ctx context.Context, p string) (bool, error) {
	var found bool
	err := m.do(ctx, func() error {
		_, _, err := m.target.Lookup(p)
		if err == nil {
			found = true
			return nil
		}
		if isNotExist(err) {
			return nil
		}
		return err
	})
	return found, err
}

// WriteFile creates or truncates p and writes data.
func (m *Mount) WriteFile(ctx context.Context, p string, data []byte, perm os.FileMode) error {
	return m.do(ctx, func() error {
		f, err := m.target.OpenFile(p, perm)
		if err != nil {
			return fmt.Errorf("opening %s: %w", p, err)
		}
		if _, err := f.Write(data); err != nil {
			f.Close()
			return fmt.Errorf("writing %s: %w", p, err)
		}
		return f.Close()
	})
}

// ReadFile reads all of p.
func (m *Mount) ReadFile(ctx context.Context, p string) ([]byte, error) {
	var out []byte
	err := m.do(ctx, func() error {
		f, err := m.target.Open(p)
		if err != nil {
			return fmt.Errorf("opening %s: %w", p, err)
		}
		defer f.Close()
		out, err = io.ReadAll(f)
		return err
	})
	return out, err
}

// RemoveAll removes p and everything below it; a missing p is not an error.
func (m *Mount) RemoveAll(ctx context.Context, p string) error {
	return m.do(ctx, func() error {
		err := m.target.RemoveAll(p)
		switch {
		case err == nil || isNotExist(err):
			return nil
		case nfsc.IsNotDirError(err):
			return m.target.Remove(p)
		default:
			return fmt.Errorf("removing %s: %w", p, err)
		}
	})
}

// Rename moves from to to, both relative to the export.
func (m *Mount) Rename(ctx context.Context, from, to string) error {
	return m.do(ctx, func() error { return m.target.Rename(from, to) })
}

func isNotExist(err error) bool {
	return errors.Is(err, os.ErrNotExist) || os.IsNotExist(err)
}
