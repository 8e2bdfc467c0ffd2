package gitssh

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// gitRepo makes a work tree with one commit on main.
func gitRepo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "."}, {"-c", "user.name=lab", "-c", "user.email=lab@example.invalid", "commit", "-q", "-m", "first"}} {
		if out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	return dir
}

// TestCloneWithOpenSSH clones through the server with the real git and
// OpenSSH clients: the deploy key and known_hosts it hands out are what
// OpenSSH accepts, another key is refused, and pushing is refused.
func TestCloneWithOpenSSH(t *testing.T) {
	if _, err := exec.LookPath("ssh"); err != nil {
		if os.Getenv("BOOTSTRAP_REQUIRE_LAB") == "1" {
			t.Fatal("the OpenSSH client (ssh) is needed: apt-get install openssh-client")
		}
		t.Skip("no ssh client")
	}
	repo := gitRepo(t)
	s, err := Start(Options{Repos: map[string]string{"/homelab.git": repo}, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dir := t.TempDir()
	key, err := s.DeployKey()
	if err != nil {
		t.Fatal(err)
	}
	keyFile, khFile := filepath.Join(dir, "id"), filepath.Join(dir, "known_hosts")
	os.WriteFile(keyFile, key, 0o600)
	os.WriteFile(khFile, s.KnownHosts(), 0o600)
	sshCmd := "ssh -F /dev/null -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile=" + khFile + " -i "
	git := func(identity string, args ...string) (string, error) {
		cmd := exec.Command("git", args...)
		cmd.Env = append(os.Environ(), "GIT_SSH_COMMAND="+sshCmd+identity)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	clone := filepath.Join(dir, "clone")
	if out, err := git(keyFile, "clone", "-q", s.URL("/homelab.git"), clone); err != nil {
		t.Fatalf("clone: %v %s", err, out)
	}
	if b, err := os.ReadFile(filepath.Join(clone, "README.md")); err != nil || string(b) != "hello\n" {
		t.Fatalf("cloned content: %q %v", b, err)
	}
	if out, err := git(keyFile, "-C", clone, "push", "-q", "origin", "HEAD:refs/heads/other"); err == nil || !strings.Contains(out, "only git-upload-pack") {
		t.Fatalf("push through a read-only deploy key: %v %s", err, out)
	}
	if out, err := git(keyFile, "ls-remote", s.URL("/missing.git")); err == nil || !strings.Contains(out, "does not appear to be a git repository") {
		t.Fatalf("unknown repository: %v %s", err, out)
	}
	other := filepath.Join(dir, "other")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", other).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v %s", err, out)
	}
	if out, err := git(other, "ls-remote", s.URL("/homelab.git")); err == nil || !strings.Contains(out, "Permission denied") {
		t.Fatalf("another key: %v %s", err, out)
	}
}
