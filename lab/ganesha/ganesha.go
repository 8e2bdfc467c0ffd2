// Package ganesha runs Debian's nfs-ganesha (with rpcbind) on loopback as a
// real NFS server for tests and the lab: a real export list, MOUNT and NFSv3
// on fixed ports registered with the portmapper, and root squashing. Only
// one instance can run per machine (the portmapper registrations are
// global), so Start takes a machine-wide lock until Stop.
package ganesha

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/lab/kube"
)

// ErrNotInstalled is returned when ganesha.nfsd or rpcbind is missing.
var ErrNotInstalled = errors.New("nfs-ganesha and rpcbind are not installed (apt-get install nfs-ganesha nfs-ganesha-vfs rpcbind)")

// Export is one exported directory.
type Export struct {
	// Pseudo is the path clients mount, e.g. /export/k8s.
	Pseudo string
	// Dir is the directory on this machine.
	Dir string
	// RootSquash maps root to nobody.
	RootSquash bool
	// Clients restricts the export to these clients ("" = everyone).
	Clients string
}

// Server is a running ganesha.
type Server struct {
	MountPort int
	NFSPort   int
	dir       string
	cmd       *exec.Cmd
	rpcbind   *exec.Cmd
	lock      *os.File
}

// Available reports whether the binaries are installed.
func Available() bool {
	_, e1 := exec.LookPath("ganesha.nfsd")
	_, e2 := lookRpcbind()
	return e1 == nil && e2 == nil
}

func lookRpcbind() (string, error) {
	if p, err := exec.LookPath("rpcbind"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/rpcbind"); err == nil {
		return "/usr/sbin/rpcbind", nil
	}
	return "", exec.ErrNotFound
}

// Start runs ganesha exporting exports on 127.0.0.1, with a workdir under
// dir. It needs root (rpcbind and the VFS layer).
func Start(ctx context.Context, dir string, exports []Export) (*Server, error) {
	if !Available() {
		return nil, ErrNotInstalled
	}
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "bootstrap-ganesha.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	// Wait for another test binary's instance to stop.
	if err := flockWait(ctx, lock); err != nil {
		lock.Close()
		return nil, err
	}
	s := &Server{dir: dir, lock: lock}
	if err := s.start(ctx, exports); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func flockWait(ctx context.Context, f *os.File) error {
	return wait.Until(ctx, wait.Spec{What: "the machine-wide ganesha lock", Timeout: 5 * time.Minute, Interval: 200 * time.Millisecond},
		func(context.Context) (bool, string, error) {
			err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if errors.Is(err, unix.EWOULDBLOCK) {
				return false, "held by another process", nil
			}
			return err == nil, "", err
		})
}

func (s *Server) start(ctx context.Context, exports []Export) error {
	if !portOpen("127.0.0.1:111") {
		rb, _ := lookRpcbind()
		s.rpcbind = exec.Command(rb, "-f", "-w")
		s.rpcbind.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
		if err := s.rpcbind.Start(); err != nil {
			return fmt.Errorf("starting rpcbind: %w", err)
		}
		if err := wait.Until(ctx, wait.Spec{What: "rpcbind on :111", Timeout: 10 * time.Second, Interval: 50 * time.Millisecond},
			func(context.Context) (bool, string, error) { return portOpen("127.0.0.1:111"), "", nil }); err != nil {
			return err
		}
	}
	var err error
	if s.MountPort, err = kube.FreePort("127.0.0.1"); err != nil {
		return err
	}
	if s.NFSPort, err = kube.FreePort("127.0.0.1"); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "NFS_CORE_PARAM { Bind_addr = 127.0.0.1; NFS_Port = %d; MNT_Port = %d; Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false; Mount_Path_Pseudo = true; Protocols = 3, 4; }\n", s.NFSPort, s.MountPort)
	b.WriteString("NFSV4 { Graceless = true; RecoveryBackend = fs; }\n")
	fmt.Fprintf(&b, "NFS_KRB5 { Active_krb5 = false; }\n")
	for i, e := range exports {
		squash := "No_Root_Squash"
		if e.RootSquash {
			squash = "Root_Squash"
		}
		access := "RW"
		client := ""
		if e.Clients != "" {
			access = "None"
			client = fmt.Sprintf(" CLIENT { Clients = %s; Access_Type = RW; }", e.Clients)
		}
		fmt.Fprintf(&b, "EXPORT { Export_Id = %d; Path = %q; Pseudo = %q; Squash = %s; SecType = sys, none; Access_Type = %s; Protocols = 3, 4; Transports = TCP; FSAL { Name = VFS; }%s }\n",
			i+1, e.Dir, e.Pseudo, squash, access, client)
	}
	conf := filepath.Join(s.dir, "ganesha.conf")
	if err := os.WriteFile(conf, []byte(b.String()), 0o600); err != nil {
		return err
	}
	s.cmd = exec.Command("ganesha.nfsd", "-F", "-f", conf, "-L", filepath.Join(s.dir, "ganesha.log"), "-p", filepath.Join(s.dir, "ganesha.pid"))
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("starting ganesha: %w", err)
	}
	return wait.Until(ctx, wait.Spec{What: "ganesha MOUNT and NFS ports", Timeout: 30 * time.Second, Interval: 100 * time.Millisecond},
		func(context.Context) (bool, string, error) {
			if s.cmd.ProcessState != nil {
				return false, "", fmt.Errorf("ganesha exited: %s", s.Log())
			}
			return portOpen(fmt.Sprintf("127.0.0.1:%d", s.MountPort)) && portOpen(fmt.Sprintf("127.0.0.1:%d", s.NFSPort)), "", nil
		})
}

// Log returns ganesha's log, for test failure output.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "ganesha.log"))
	return string(b)
}

// Stop ends ganesha (and rpcbind when Start started it) and frees the lock.
func (s *Server) Stop() {
	for _, c := range []*exec.Cmd{s.cmd, s.rpcbind} {
		if c == nil || c.Process == nil {
			continue
		}
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
	if s.lock != nil {
		_ = unix.Flock(int(s.lock.Fd()), unix.LOCK_UN)
		s.lock.Close()
		s.lock = nil
	}
}

func portOpen(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
