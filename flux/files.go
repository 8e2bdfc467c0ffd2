package flux

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/go-git/go-billy/v5"
	"github.com/go-git/go-billy/v5/memfs"
	"github.com/go-git/go-billy/v5/util"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/storage/memory"

	"github.com/homelab/bootstrap/internal/redact"
)

// manifestLimit bounds the files read while looking for manifests: a
// Kubernetes manifest is far smaller.
const manifestLimit = 1 << 20

// errStop ends a walk early.
var errStop = errors.New("stop")

// Visit is called with each YAML or JSON file's slash-separated path
// (relative to the repository root) and content; returning true stops the
// walk.
type Visit func(rel string, data []byte) (stop bool)

// WalkRemote clones the branch's head into memory (depth 1) and walks its
// YAML and JSON files under sub: what source-controller will fetch.
func WalkRemote(ctx context.Context, url, branch string, cr Credentials, knownHostsFile, sub string, visit Visit) error {
	auth, err := remoteAuth(url, cr, knownHostsFile)
	if err != nil {
		return err
	}
	wt := memfs.New()
	if _, err := git.CloneContext(ctx, memory.NewStorage(), wt, &git.CloneOptions{
		URL: url, Auth: auth, ReferenceName: plumbing.NewBranchReferenceName(branch), SingleBranch: true, Depth: 1,
	}); err != nil {
		return fmt.Errorf("cloning %s@%s: %w", redact.URL(url), branch, err)
	}
	root := path.Clean("/" + strings.TrimPrefix(sub, "./"))
	err = util.Walk(wt, root, func(p string, fi fs.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.IsDir() || !isManifest(p) {
			return nil
		}
		data, err := readBilly(wt, p)
		if err != nil {
			return err
		}
		if visit(strings.TrimPrefix(p, "/"), data) {
			return errStop
		}
		return nil
	})
	if errors.Is(err, errStop) {
		return nil
	}
	return err
}

func isManifest(p string) bool {
	switch strings.ToLower(path.Ext(filepath.ToSlash(p))) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

func readLimited(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, manifestLimit))
}

func readBilly(fsys billy.Filesystem, p string) ([]byte, error) {
	f, err := fsys.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, manifestLimit))
}
