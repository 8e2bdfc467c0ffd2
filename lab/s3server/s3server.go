// Package s3server runs the lab's S3 server: versitygw (its posix backend
// serving a directory), built from its pinned module by lab/tools/build.sh
// like the other lab binaries, so backup.s3 is tested against a real S3
// implementation (signatures, error codes, multipart) and not one of ours.
// docs/lab.md lists how it differs from the servers homelabs run.
package s3server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/lab/kube"
)

// Binary is the server's file name in the lab's bin directory.
const Binary = "versitygw"

// Options configure a server.
type Options struct {
	// Dir holds the served root (<Dir>/root: one directory per bucket)
	// and the server's log.
	Dir string
	// BinDir is the lab's bin directory (default: kube.DefaultBinDir).
	BinDir string
	Log    zerolog.Logger
}

// Server is a running S3 server with one root account.
type Server struct {
	// Endpoint is http://127.0.0.1:<port>.
	Endpoint string
	// AccessKey and SecretKey are the root account's keys.
	AccessKey, SecretKey string
	// Region is the one it signs for.
	Region string
	root   string
	cmd    *exec.Cmd
	done   chan struct{}
	waitE  error
}

// ErrNoBinary says the server is not built (make lab-bins).
var ErrNoBinary = errors.New("versitygw is not built (make lab-bins)")

// Start starts a server on a free loopback port and waits until it answers.
func Start(ctx context.Context, o Options) (*Server, error) {
	bin := o.BinDir
	if bin == "" {
		d, err := kube.DefaultBinDir()
		if err != nil {
			return nil, err
		}
		bin = d
	}
	bin = filepath.Join(bin, Binary)
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoBinary, err)
	}
	root := filepath.Join(o.Dir, "root")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(o.Dir, "versitygw.log"))
	if err != nil {
		return nil, err
	}
	s := &Server{Endpoint: "http://" + addr, AccessKey: "lab" + token(6), SecretKey: token(20), Region: "us-east-1", root: root, done: make(chan struct{})}
	// The keys go through the environment, not the command line (ps).
	cmd := exec.Command(bin, "--port", addr, "--region", s.Region, "--quiet", "posix", root)
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+s.AccessKey, "ROOT_SECRET_KEY="+s.SecretKey)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	s.cmd = cmd
	go func() { s.waitE = cmd.Wait(); logf.Close(); close(s.done) }()
	err = wait.Until(ctx, wait.Spec{What: "the lab's S3 server at " + addr, Timeout: 20 * time.Second, Interval: 20 * time.Millisecond, Log: o.Log},
		func(context.Context) (bool, string, error) {
			select {
			case <-s.done:
				return false, "", fmt.Errorf("versitygw exited: %v (see %s)", s.waitE, logf.Name())
			default:
			}
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return false, err.Error(), nil
			}
			c.Close()
			return true, "", nil
		})
	if err != nil {
		s.Stop()
		return nil, err
	}
	o.Log.Info().Str("endpoint", s.Endpoint).Msg("S3 server serving")
	return s, nil
}

// MakeBucket creates a bucket as the posix backend stores one: a
// directory under the root.
func (s *Server) MakeBucket(name string) error { return os.Mkdir(filepath.Join(s.root, name), 0o700) }

// Stop stops the server (SIGTERM, then SIGKILL after 5 s).
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func token(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
