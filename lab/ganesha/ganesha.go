// Package ganesha runs Debian's nfs-ganesha (with rpcbind) on loopback as a
// real NFS server for tests and the lab: a real export list, MOUNT and NFSv3
// on fixed ports registered with the portmapper, and root squashing. Only
// one instance can run per machine (the portmapper registrations are
// global), so Start takes a machine-wide lock until Stop.
package ganesha

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
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
	cmd       *child
	rpcbind   *child
	lock      *os.File
}

// child is a daemon run in the foreground with its output kept, so a start
// that fails says why instead of timing out on a port nobody opens.
type child struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan struct{}
	err  error
}

// startChild starts cmd from a goroutine locked to its own OS thread until
// the child exits. Pdeathsig is delivered when the *thread* that forked the
// child ends, not the process (prctl(2) PR_SET_PDEATHSIG), and the Go
// runtime may retire threads at any time; pinning the thread keeps the
// signal for what it is meant for: the test binary dying.
func startChild(ctx context.Context, sig syscall.Signal, name string, args ...string) (*child, error) {
	c := &child{cmd: exec.Command(name, args...), done: make(chan struct{})}
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: sig}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread ends with this goroutine, after the
		// child has exited.
		if err := c.cmd.Start(); err != nil {
			started <- err
			close(c.done)
			return
		}
		started <- nil
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return c, nil
}

// exited reports whether the child has ended, with its exit and output.
func (c *child) exited() (bool, string) {
	select {
	case <-c.done:
		return true, fmt.Sprintf("%s exited (%v): %s", filepath.Base(c.cmd.Path), c.err, strings.TrimSpace(c.out.String()))
	default:
		return false, ""
	}
}

// stop ends the child's process group: TERM, then KILL after 10 s.
func (c *child) stop() {
	if c == nil || c.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.done
	}
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
	if err := s.startRpcbind(ctx); err != nil {
		return err
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
	s.cmd, err = startChild(ctx, syscall.SIGKILL, "ganesha.nfsd", "-F", "-f", conf, "-L", filepath.Join(s.dir, "ganesha.log"), "-p", filepath.Join(s.dir, "ganesha.pid"))
	if err != nil {
		return err
	}
	// Open ports are not enough: ganesha registers MOUNT with the
	// portmapper after it listens, and a client that asks the portmapper
	// first would find NFSv4 only.
	return wait.Until(ctx, wait.Spec{What: "ganesha MOUNT and NFS ports, MOUNT registered with the portmapper", Timeout: 30 * time.Second, Interval: 100 * time.Millisecond},
		func(ctx context.Context) (bool, string, error) {
			if gone, why := s.cmd.exited(); gone {
				return false, "", fmt.Errorf("%s\n%s", why, s.Log())
			}
			if !portOpen(fmt.Sprintf("127.0.0.1:%d", s.MountPort)) || !portOpen(fmt.Sprintf("127.0.0.1:%d", s.NFSPort)) {
				return false, "ports not open yet", nil
			}
			return s.mountRegistered(ctx), "MOUNT not registered yet", nil
		})
}

// mountRegistered reports whether the portmapper lists MOUNT (program
// 100005) on MountPort, read with rpcbind's own rpcinfo; true when rpcinfo
// is not installed (the ports are then all there is to wait for).
func (s *Server) mountRegistered(ctx context.Context) bool {
	rpcinfo, err := exec.LookPath("rpcinfo")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/rpcinfo"); serr != nil {
			return true
		}
		rpcinfo = "/usr/sbin/rpcinfo"
	}
	out, err := exec.CommandContext(ctx, rpcinfo, "-p", "127.0.0.1").Output()
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[0] == "100005" && f[3] == strconv.Itoa(s.MountPort) {
			return true
		}
	}
	return false
}

// Log returns ganesha's log, for test failure output.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "ganesha.log"))
	return string(b)
}

// Stop ends ganesha (and rpcbind when Start started it) and frees the lock.
func (s *Server) Stop() {
	s.cmd.stop()
	s.rpcbind.stop()
	if s.lock != nil {
		_ = unix.Flock(int(s.lock.Fd()), unix.LOCK_UN)
		s.lock.Close()
		s.lock = nil
	}
}

// startRpcbind starts a portmapper unless one already answers on :111. A
// start that exits early is retried once without the warm-start state
// (-w reads /run/rpcbind), and a second failure reports rpcbind's own words.
//
// rpcbind binds each transport of /etc/netconfig on its own and only warns
// (to syslog, which a test machine lacks) when one fails: while any
// connection holds local TCP port 111 it runs without its TCP/IPv4
// listener, silently. Such a holder is looked for before the start and at
// every poll, and named, instead of waiting for a port that cannot open.
func (s *Server) startRpcbind(ctx context.Context) error {
	if portOpen("127.0.0.1:111") {
		return nil
	}
	if held := portHolders(111); len(held) > 0 {
		return fmt.Errorf("rpcbind cannot listen on TCP port 111: %s", strings.Join(held, "; "))
	}
	rb, err := lookRpcbind()
	if err != nil {
		return ErrNotInstalled
	}
	var why string
	for _, args := range [][]string{{"-f", "-w"}, {"-f"}} {
		c, err := startChild(ctx, syscall.SIGTERM, rb, args...)
		if err != nil {
			return err
		}
		err = wait.Until(ctx, wait.Spec{What: "rpcbind on :111", Timeout: 20 * time.Second, Interval: 50 * time.Millisecond},
			func(context.Context) (bool, string, error) {
				if gone, msg := c.exited(); gone {
					return false, "", errors.New(msg)
				}
				if portOpen("127.0.0.1:111") {
					return true, "", nil
				}
				if held := portHolders(111); len(held) > 0 {
					return false, "", fmt.Errorf("rpcbind runs but cannot listen on TCP port 111: %s", strings.Join(held, "; "))
				}
				return false, "", nil
			})
		if err == nil {
			s.rpcbind = c
			return nil
		}
		c.stop()
		why = err.Error()
		// Another process may have won the port meanwhile (it is machine-wide).
		if portOpen("127.0.0.1:111") {
			return nil
		}
		if strings.Contains(why, "cannot listen on TCP port 111") {
			break // a warm start changes nothing about that
		}
	}
	return fmt.Errorf("starting rpcbind: %s", why)
}

// portHolders describes the TCP sockets (IPv4 and IPv6) that hold local
// port port without listening on it, with the process owning each where
// /proc tells: "127.0.0.1:111 → 127.0.0.1:40123 ESTABLISHED (pid 42 nfsd)".
func portHolders(port int) []string {
	states := map[string]string{"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
		"06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0B": "CLOSING"}
	var out []string
	inodes := map[string]string{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fl := strings.Fields(line)
			if len(fl) < 10 {
				continue
			}
			local, remote, st, inode := fl[1], fl[2], fl[3], fl[9]
			lp, err := strconv.ParseUint(local[strings.LastIndexByte(local, ':')+1:], 16, 16)
			// TIME_WAIT does not keep a listener with SO_REUSEADDR (rpcbind's) out.
			if err != nil || int(lp) != port || st == "0A" || st == "06" {
				continue
			}
			desc := fmt.Sprintf("%s → %s %s", hexAddr(local), hexAddr(remote), states[st])
			out = append(out, desc)
			inodes[inode] = desc
		}
	}
	if len(out) == 0 {
		return nil
	}
	// Name the owners: /proc/<pid>/fd/* link to socket:[inode].
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			link, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if !strings.HasPrefix(link, "socket:[") {
				continue
			}
			inode := strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")
			if desc, ok := inodes[inode]; ok {
				comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
				for i := range out {
					if out[i] == desc {
						out[i] = fmt.Sprintf("%s (pid %d %s)", desc, pid, strings.TrimSpace(string(comm)))
					}
				}
			}
		}
	}
	return out
}

// hexAddr turns /proc/net/tcp's "0100007F:006F" into "127.0.0.1:111" (and
// the 32-digit IPv6 form into its address).
func hexAddr(s string) string {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return s
	}
	raw, err := hex.DecodeString(s[:i])
	port, perr := strconv.ParseUint(s[i+1:], 16, 16)
	if err != nil || perr != nil || (len(raw) != 4 && len(raw) != 16) {
		return s
	}
	// Each 32-bit word is in host (little-endian) order.
	for w := 0; w+4 <= len(raw); w += 4 {
		raw[w], raw[w+1], raw[w+2], raw[w+3] = raw[w+3], raw[w+2], raw[w+1], raw[w]
	}
	return net.JoinHostPort(net.IP(raw).String(), strconv.Itoa(int(port)))
}

func portOpen(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
