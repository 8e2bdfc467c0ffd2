package gitsnap

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"

	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/index"
)

// gitView answers, for a work-tree file, whether its content on disk is
// what git would store. A file with a filter attribute (git-lfs,
// git-crypt, any clean/smudge driver) is smudged in the work tree: LFS
// holds the large object there and git-crypt the decrypted plaintext, while
// the repository holds the pointer or the ciphertext. The snapshot serves
// what the repository holds, so such a file is taken from the index blob
// when the work tree still matches the index (git's own stat check: size
// and mtime recorded at `git add`), and left out otherwise, since running
// the clean filter is the user's tool's business, not ours.
type gitView struct {
	repo *gogit.Repository
	// filters are the paths git runs a filter driver on.
	filters map[string]bool
	entries map[string]*index.Entry
}

// newGitView indexes idx by path and asks git which candidates it runs a
// filter driver on (`git check-attr filter`), so every attributes source
// git reads counts: .gitattributes files, $GIT_DIR/info/attributes,
// core.attributesFile wherever it is configured, and the system and
// $XDG_CONFIG_HOME/git/attributes defaults.
func newGitView(ctx context.Context, repo *gogit.Repository, idx *index.Index, root string, candidates []string) (*gitView, error) {
	v := &gitView{repo: repo, entries: make(map[string]*index.Entry, len(idx.Entries)), filters: map[string]bool{}}
	for _, e := range idx.Entries {
		v.entries[e.Name] = e
	}
	if len(candidates) == 0 {
		return v, nil
	}
	cmd := exec.CommandContext(ctx, "git", "-C", root, "check-attr", "-z", "--stdin", "filter")
	cmd.Env = gitEnv()
	cmd.Stdin = strings.NewReader(strings.Join(candidates, "\x00") + "\x00")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("reading git attributes of %s (git check-attr): %w: %s", root, err, strings.TrimSpace(stderr.String()))
	}
	// Records are <path> NUL <attribute> NUL <info> NUL; info is
	// "unspecified", "unset", "set" (no driver named) or the driver.
	f := strings.Split(string(out), "\x00")
	for i := 0; i+2 < len(f); i += 3 {
		switch f[i+2] {
		case "unspecified", "unset", "set", "":
		default:
			v.filters[f[i]] = true
		}
	}
	return v, nil
}

// filtered reports whether git runs a filter driver on p.
func (v *gitView) filtered(p string) bool { return v.filters[p] }

// content returns the bytes to serve for the regular file p (full on
// disk, fi its Lstat). ok is false when p is filtered and git holds no
// version matching the work tree.
func (v *gitView) content(p, full string, fi fs.FileInfo) (data []byte, ok bool, err error) {
	if !v.filtered(p) {
		data, err = os.ReadFile(full)
		return data, err == nil, err
	}
	e := v.entries[p]
	if e == nil || !statMatches(e, fi) {
		return nil, false, nil
	}
	obj, err := v.repo.Storer.EncodedObject(plumbing.BlobObject, e.Hash)
	if err != nil {
		return nil, false, fmt.Errorf("reading the index blob of %s: %w", p, err)
	}
	r, err := obj.Reader()
	if err != nil {
		return nil, false, err
	}
	defer r.Close()
	data, err = io.ReadAll(r)
	return data, err == nil, err
}

// statMatches is git's stat check of an index entry against the work tree
// (read-cache.c ce_match_stat_basic): size and mtime seconds, and the
// nanoseconds when the index recorded them (git built without USE_NSEC
// writes 0).
func statMatches(e *index.Entry, fi fs.FileInfo) bool {
	if e.Size != uint32(fi.Size()) || e.ModifiedAt.Unix() != fi.ModTime().Unix() {
		return false
	}
	return e.ModifiedAt.Nanosecond() == 0 || e.ModifiedAt.Nanosecond() == fi.ModTime().Nanosecond()
}
