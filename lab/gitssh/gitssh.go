// Package gitssh is the lab's SSH git server: a real SSH server
// (golang.org/x/crypto/ssh) that runs the real `git upload-pack` for a
// client holding the deploy key, as a git host does for a read-only deploy
// key. It lets the real source-controller clone over ssh:// in tests, with
// the host key checked against known_hosts as on a real network.
package gitssh

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// Options configure a server.
type Options struct {
	// Addr to listen on (default 127.0.0.1:0).
	Addr string
	// Repos maps a repository path in the URL ("/homelab.git") to a git
	// directory on this machine (a work tree or a bare repository).
	Repos map[string]string
	Log   zerolog.Logger
}

// Server is a running SSH git server.
type Server struct {
	l        net.Listener
	cfg      *ssh.ServerConfig
	hostKey  ssh.Signer
	client   ed25519.PrivateKey
	repos    map[string]string
	log      zerolog.Logger
	wg       sync.WaitGroup
	mu       sync.Mutex
	accepted int
}

// Start generates a host key and a deploy key and serves until Close.
func Start(o Options) (*Server, error) {
	_, hostPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	hostKey, err := ssh.NewSignerFromKey(hostPriv)
	if err != nil {
		return nil, err
	}
	clientPub, clientPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	deployKey, err := ssh.NewPublicKey(clientPub)
	if err != nil {
		return nil, err
	}
	s := &Server{hostKey: hostKey, client: clientPriv, repos: o.Repos, log: o.Log.With().Str("component", "lab-gitssh").Logger()}
	s.cfg = &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if string(key.Marshal()) == string(deployKey.Marshal()) {
				return nil, nil
			}
			return nil, errors.New("unknown key")
		},
	}
	s.cfg.AddHostKey(hostKey)
	addr := o.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	if s.l, err = net.Listen("tcp", addr); err != nil {
		return nil, err
	}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

// URL is the ssh:// URL of the repository at repoPath ("/homelab.git").
func (s *Server) URL(repoPath string) string {
	return "ssh://git@" + s.l.Addr().String() + repoPath
}

// KnownHosts is a known_hosts line for this server's host key, in the
// form OpenSSH writes for a non-default port ([127.0.0.1]:port).
func (s *Server) KnownHosts() []byte {
	return []byte(knownhosts.Line([]string{knownhosts.Normalize(s.l.Addr().String())}, s.hostKey.PublicKey()) + "\n")
}

// DeployKey is the client's private key in OpenSSH PEM form, as a user
// puts in flux.auth.sshKeyFile.
func (s *Server) DeployKey() ([]byte, error) {
	b, err := ssh.MarshalPrivateKey(s.client, "lab deploy key")
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(b), nil
}

// Accepted counts the authenticated connections so far.
func (s *Server) Accepted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted
}

// Close stops listening and waits for open sessions to end.
func (s *Server) Close() error {
	err := s.l.Close()
	s.wg.Wait()
	return err
}

func (s *Server) serve() {
	defer s.wg.Done()
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handle(c)
		}()
	}
}

func (s *Server) handle(c net.Conn) {
	defer c.Close()
	conn, chans, reqs, err := ssh.NewServerConn(c, s.cfg)
	if err != nil {
		s.log.Debug().Err(err).Msg("ssh handshake refused")
		return
	}
	defer conn.Close()
	s.mu.Lock()
	s.accepted++
	s.mu.Unlock()
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "only sessions")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			return
		}
		s.session(ch, creqs)
	}
}

// session serves one exec request: git-upload-pack '<path>'. Anything
// else (a shell, git-receive-pack: the deploy key is read-only) is refused.
func (s *Server) session(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	for req := range reqs {
		switch req.Type {
		case "env":
			_ = req.Reply(true, nil)
		case "exec":
			var p struct{ Command string }
			if err := ssh.Unmarshal(req.Payload, &p); err != nil {
				_ = req.Reply(false, nil)
				return
			}
			dir, err := s.repoFor(p.Command)
			if err != nil {
				_ = req.Reply(true, nil)
				fmt.Fprintf(ch.Stderr(), "%v\n", err)
				exit(ch, 128)
				return
			}
			_ = req.Reply(true, nil)
			s.log.Debug().Str("command", p.Command).Msg("ssh exec")
			cmd := exec.Command("git", "upload-pack", dir)
			cmd.Stdout, cmd.Stderr = ch, ch.Stderr()
			// Our own stdin copy: with Stdin set to the channel, Wait would
			// wait for a client EOF that need not come once upload-pack ends.
			stdin, err := cmd.StdinPipe()
			if err != nil {
				exit(ch, 1)
				return
			}
			go func() { _, _ = io.Copy(stdin, ch); stdin.Close() }()
			code := 0
			if err := cmd.Run(); err != nil {
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					code = ee.ExitCode()
				} else {
					code = 1
				}
			}
			exit(ch, code)
			return
		default:
			_ = req.Reply(false, nil)
		}
	}
}

// repoFor maps "git-upload-pack '/homelab.git'" to its directory.
func (s *Server) repoFor(command string) (string, error) {
	verb, arg, ok := strings.Cut(command, " ")
	if !ok || verb != "git-upload-pack" {
		return "", fmt.Errorf("fatal: only git-upload-pack is served here, not %q", verb)
	}
	p := path.Clean("/" + strings.Trim(arg, `'"`))
	dir, ok := s.repos[p]
	if !ok {
		return "", fmt.Errorf("fatal: '%s' does not appear to be a git repository", p)
	}
	return filepath.Clean(dir), nil
}

func exit(ch ssh.Channel, code int) {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(code))
	_, _ = ch.SendRequest("exit-status", false, b[:])
}
