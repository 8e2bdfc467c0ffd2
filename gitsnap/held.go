package gitsnap

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/go-git/go-billy/v5/osfs"
	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/gitattributes"
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
	repo    *gogit.Repository
	attrs   gitattributes.Matcher
	entries map[string]*index.Entry
}

// newGitView indexes idx by path and reads the attributes git applies to
// the work tree: the system and global attributes files, every .gitattributes among
// the candidates (outer directories first, as deeper files take
// precedence), then $GIT_DIR/info/attributes, which wins over all.
func newGitView(repo *gogit.Repository, idx *index.Index, root string, candidates []string) (*gitView, error) {
	v := &gitView{repo: repo, entries: make(map[string]*index.Entry, len(idx.Entries))}
	for _, e := range idx.Entries {
		v.entries[e.Name] = e
	}
	var stack []gitattributes.MatchAttribute
	rootfs := osfs.New("/")
	if sys, err := gitattributes.LoadSystemPatterns(rootfs); err == nil {
		stack = append(stack, sys...)
	}
	if global, err := gitattributes.LoadGlobalPatterns(rootfs); err == nil {
		stack = append(stack, global...)
	}
	var files []string
	for _, p := range candidates {
		if path.Base(p) == ".gitattributes" {
			files = append(files, p)
		}
	}
	sort.SliceStable(files, func(i, j int) bool { return strings.Count(files[i], "/") < strings.Count(files[j], "/") })
	for _, p := range files {
		var domain []string
		if d := path.Dir(p); d != "." {
			domain = strings.Split(d, "/")
		}
		attrs, err := readAttributes(filepath.Join(root, filepath.FromSlash(p)), domain, len(domain) == 0)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", p, err)
		}
		stack = append(stack, attrs...)
	}
	infoDir := filepath.Join(root, ".git", "info")
	if common := linkedCommonDir(root); common != "" {
		infoDir = filepath.Join(common, "info")
	}
	attrs, err := readAttributes(filepath.Join(infoDir, "attributes"), nil, true)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", filepath.Join(infoDir, "attributes"), err)
	}
	v.attrs = gitattributes.NewMatcher(append(stack, attrs...))
	return v, nil
}

func readAttributes(file string, domain []string, allowMacro bool) ([]gitattributes.MatchAttribute, error) {
	f, err := os.Open(file)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return gitattributes.ReadAttributes(f, domain, allowMacro)
}

// filtered reports whether git runs a filter driver on p.
func (v *gitView) filtered(p string) bool {
	got, _ := v.attrs.Match(strings.Split(p, "/"), []string{"filter"})
	a, ok := got["filter"]
	return ok && a.IsValueSet() && a.Value() != ""
}

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
