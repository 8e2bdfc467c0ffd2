package flux

import (
	"context"
	"fmt"
	"strings"

	"github.com/go-git/go-git/v5"
	gitconfig "github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"
	"github.com/go-git/go-git/v5/storage/memory"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/homelab/bootstrap/internal/redact"
)

// RemoteBranchHead lists the remote's references the way a clone starts
// and returns the commit the branch points at. It proves the URL, the
// credentials and the branch before the cluster tries them.
func RemoteBranchHead(ctx context.Context, url, branch string, cr Credentials, knownHostsFile string) (string, error) {
	auth, err := remoteAuth(url, cr, knownHostsFile)
	if err != nil {
		return "", err
	}
	rem := git.NewRemote(memory.NewStorage(), &gitconfig.RemoteConfig{Name: "origin", URLs: []string{url}})
	refs, err := rem.ListContext(ctx, &git.ListOptions{Auth: auth})
	if err != nil {
		return "", fmt.Errorf("listing %s: %w", redact.URL(url), err)
	}
	var branches []string
	for _, r := range refs {
		if r.Name().IsBranch() {
			if r.Name().Short() == branch {
				return r.Hash().String(), nil
			}
			branches = append(branches, r.Name().Short())
		}
	}
	return "", fmt.Errorf("%s has no branch %q (branches: %s)", url, branch, strings.Join(branches, ", "))
}

func remoteAuth(url string, cr Credentials, knownHostsFile string) (transport.AuthMethod, error) {
	switch {
	case len(cr.SSHKey) > 0:
		// The user the URL names (ssh://user@host/...), "git" when it
		// names none, as source-controller connects (fluxcd/pkg/git
		// v0.52.0 options.go NewAuthOptions).
		user := "git"
		if ep, err := transport.NewEndpoint(url); err == nil && ep.User != "" {
			user = ep.User
		}
		keys, err := gitssh.NewPublicKeys(user, cr.SSHKey, "")
		if err != nil {
			return nil, fmt.Errorf("SSH deploy key: %w", err)
		}
		// config validate requires known_hosts for ssh:// (source-controller
		// refuses SSH without it), and the precheck verifies the host key
		// against the same file Flux will use.
		if knownHostsFile == "" {
			return nil, fmt.Errorf("an ssh:// repository needs flux.auth.knownHostsFile")
		}
		cb, err := knownhosts.New(knownHostsFile)
		if err != nil {
			return nil, fmt.Errorf("known_hosts: %w", err)
		}
		keys.HostKeyCallback = cb
		return keys, nil
	case cr.Token != "":
		user := cr.Username
		if user == "" {
			user = "git"
		}
		return &githttp.BasicAuth{Username: user, Password: cr.Token}, nil
	}
	return nil, nil
}
