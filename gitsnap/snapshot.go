// Package gitsnap turns a local work tree into a deterministic, single-commit
// git snapshot and serves it read-only over git smart HTTP, so Flux can pull
// the homelab repository (uncommitted edits included) without a remote.
// It also manages a detached `bootstrap gitsnap serve` process that outlives
// `bootstrap run`.
package gitsnap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/gitignore"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/memory"
)

// DefaultBranch is the branch a snapshot is published under when none is set.
const DefaultBranch = "main"

// The commit identity and time are fixed so identical content always gives
// the identical commit hash, and Flux sees no new revision when nothing changed.
var (
	snapshotSignature = object.Signature{
		Name:  "bootstrap gitsnap",
		Email: "gitsnap@bootstrap.invalid",
		When:  time.Unix(946684800, 0).UTC(), // 2000-01-01T00:00:00Z
	}
)

const snapshotMessage = "bootstrap snapshot of the local work tree\n"

// BuildOptions says which work tree to snapshot and how.
type BuildOptions struct {
	// Dir is the work tree (or any directory inside it).
	Dir string
	// Branch the commit is published under (refs/heads/<Branch>); DefaultBranch if empty.
	Branch string
	// Excludes are extra gitignore-style patterns, applied on top of the
	// built-in exclusions (which cannot be turned off).
	Excludes []string
	// Protect are paths (absolute, or relative to the work tree's root)
	// never served, with everything under them and their "<path>.bak-*"
	// backups: the cluster's state and Talos directories, its kubeconfig
	// and backup copies, and the credential files its config names, when
	// they sit inside the work tree (config.Config.Protected).
	Protect []string
	// FluxPath is the path Flux builds (flux.path): a withheld file the
	// build reads from there refuses the snapshot (Refusal). Empty: the
	// tree's root.
	FluxPath string
	// ServePlaintext are gitignore-style patterns of files served as git
	// holds them although they hold a plaintext Secret value (a Secret,
	// a secretGenerator input, secrets.yaml or .env* kept in plaintext on
	// purpose). Credentials, keys, kubeconfigs, Talos files and bootstrap's
	// own files are never served, whatever they say.
	ServePlaintext []string
	// ServeWholeTree serves every file git lists (less what the guard
	// withholds) instead of only what the cluster's build reads from
	// FluxPath: for a cluster that builds paths of the snapshot the tree
	// does not declare (a Kustomization made by hand).
	ServeWholeTree bool
}

// Snapshot is one immutable commit built from a work tree, held in memory.
// It is safe for concurrent readers.
type Snapshot struct {
	// Hash is the commit hash; the same content always yields the same hash.
	Hash plumbing.Hash
	// Tree is the root tree hash.
	Tree plumbing.Hash
	// Branch is the branch the commit is published under.
	Branch string
	// Files is the number of files (blobs and symlinks) in the commit.
	Files int
	// Excluded counts the files left out, by rule; it never holds names or content.
	Excluded Exclusions
	// Withheld names every file left out by a rule, sorted by path; never
	// their content.
	Withheld []Withheld
	// Skipped counts candidate paths that could not be represented
	// (submodules, nested repositories, sockets, files that vanished).
	Skipped int
	// Unread counts the files left out because the cluster's build does
	// not read them (need-to-know serving); never names.
	Unread int
	// WholeTree says why every file is served rather than what the build
	// reads ("" when only that is): BuildOptions.ServeWholeTree, or a
	// path the cluster fills in.
	WholeTree string
	// Missed are files kustomize read when proving the build that the
	// snapshot does not serve: Refusal refuses them.
	Missed []Missed
	// Unproven says which builds kustomize could not prove ("" when it
	// proved every one).
	Unproven string

	storage *memory.Storage
}

// Ref is the full reference name of the snapshot's branch.
func (s *Snapshot) Ref() plumbing.ReferenceName {
	return plumbing.NewBranchReferenceName(s.Branch)
}

// Revision is the snapshot in the form Flux reports applied revisions:
// "<branch>@sha1:<hash>".
func (s *Snapshot) Revision() string {
	return fmt.Sprintf("%s@sha1:%s", s.Branch, s.Hash)
}

func (s *Snapshot) has(h plumbing.Hash) bool {
	return s.storage.HasEncodedObject(h) == nil
}

// Build snapshots the work tree at opts.Dir: every tracked file plus every
// untracked file git would not ignore, with its current content on disk,
// minus the built-in and configured exclusions. Nothing in the repository
// is modified.
func Build(ctx context.Context, opts BuildOptions) (*Snapshot, error) {
	branch := opts.Branch
	if branch == "" {
		branch = DefaultBranch
	}
	ref := plumbing.NewBranchReferenceName(branch)
	if err := ref.Validate(); err != nil {
		return nil, fmt.Errorf("snapshot branch %q: %w", branch, err)
	}
	repo, err := gogit.PlainOpenWithOptions(opts.Dir, &gogit.PlainOpenOptions{DetectDotGit: true, EnableDotGitCommonDir: true})
	if err != nil {
		return nil, fmt.Errorf("opening git repository at %s: %w", opts.Dir, err)
	}
	wt, err := repo.Worktree()
	if err != nil {
		return nil, fmt.Errorf("opening work tree of %s: %w", opts.Dir, err)
	}
	root := wt.Filesystem.Root()
	ex, err := newExcluder(root, opts.Excludes, opts.Protect)
	if err != nil {
		return nil, err
	}

	idx, err := repo.Storer.Index()
	if err != nil {
		return nil, fmt.Errorf("reading the git index of %s: %w", root, err)
	}
	candidates, skipped, err := listCandidates(ctx, root)
	if err != nil {
		return nil, err
	}
	held, err := newGitView(ctx, repo, idx, root, candidates)
	if err != nil {
		return nil, err
	}
	generated := secretGeneratorInputs(root, candidates)
	charts := chartDirs(candidates)
	var plain gitignore.Matcher
	if len(opts.ServePlaintext) > 0 {
		var ps []gitignore.Pattern
		for _, p := range opts.ServePlaintext {
			if strings.TrimSpace(p) == "" {
				return nil, errors.New("snapshot servePlaintext patterns: empty pattern")
			}
			ps = append(ps, gitignore.ParsePattern(p, nil))
		}
		plain = gitignore.NewMatcher(ps)
	}

	snap := &Snapshot{Branch: branch, Excluded: Exclusions{}, Skipped: skipped, storage: memory.NewStorage()}
	reads := neededFiles(root, candidates, fluxStarts(opts.FluxPath))
	switch {
	case opts.ServeWholeTree:
		snap.WholeTree = "flux.localSnapshot.serve is tree"
	case len(reads.unknown) > 0:
		snap.WholeTree = "what the cluster builds is not known from the tree: " + strings.Join(reads.unknown, "; ")
	}
	withhold := func(p, rule string) {
		snap.Excluded[rule]++
		snap.Withheld = append(snap.Withheld, Withheld{Path: p, Rule: rule})
	}
	files := map[string]treeFile{}
	for _, p := range candidates {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("building snapshot of %s: %w", root, err)
		}
		full := filepath.Join(root, filepath.FromSlash(p))
		fi, err := os.Lstat(full)
		if errors.Is(err, fs.ErrNotExist) {
			// Deleted on disk but still in the index: the snapshot follows the disk.
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", p, err)
		}
		if fi.IsDir() {
			// A tracked path that became a directory: its files are candidates of their own.
			continue
		}
		if rule := ex.byPath(p); rule != "" {
			withhold(p, rule)
			continue
		}
		if snap.WholeTree == "" && reads.why[p] == "" {
			// Need-to-know: the cluster's build does not read it.
			snap.Unread++
			continue
		}
		var (
			data []byte
			mode filemode.FileMode
		)
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(full)
			if err != nil {
				return nil, fmt.Errorf("reading symlink %s: %w", p, err)
			}
			data, mode = []byte(filepath.ToSlash(target)), filemode.Symlink
		case fi.Mode().IsRegular():
			var ok bool
			data, ok, err = held.content(p, full, fi)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", p, err)
			}
			if !ok {
				withhold(p, RuleFiltered)
				continue
			}
			rule := byEncryptedName(p, data)
			if rule == "" {
				rule = generated.judge(p, data)
			}
			if rule == "" {
				rule = dotenvNamedSecret(p, data)
			}
			if rule == "" {
				rule = ex.byContent(data, kindOf(p, charts))
			}
			if plaintextRule[rule] && plain != nil && plain.Match(strings.Split(p, "/"), false) {
				rule = ""
			}
			if rule != "" {
				withhold(p, rule)
				continue
			}
			mode = filemode.Regular
			if fi.Mode().Perm()&0o100 != 0 {
				mode = filemode.Executable
			}
		default:
			snap.Skipped++
			continue
		}
		h, err := storeObject(snap.storage, plumbing.BlobObject, data)
		if err != nil {
			return nil, fmt.Errorf("storing %s: %w", p, err)
		}
		files[p] = treeFile{mode: mode, hash: h}
	}
	snap.Files = len(files)
	for i := range snap.Withheld {
		snap.Withheld[i].NeededBy = reads.why[snap.Withheld[i].Path]
	}
	snap.Missed, snap.Unproven = proveReads(root, reads, files)
	// A withheld file kustomize reads is refused as such, with its rule's
	// advice.
	snap.Missed = slices.DeleteFunc(snap.Missed, func(m Missed) bool {
		i := slices.IndexFunc(snap.Withheld, func(w Withheld) bool { return w.Path == m.Path })
		if i >= 0 && snap.Withheld[i].NeededBy == "" {
			snap.Withheld[i].NeededBy = fmt.Sprintf("read by kustomize building %s/", m.ReadBy)
		}
		return i >= 0
	})

	tree, err := writeTrees(snap.storage, files)
	if err != nil {
		return nil, err
	}
	commit := &object.Commit{
		Author:    snapshotSignature,
		Committer: snapshotSignature,
		Message:   snapshotMessage,
		TreeHash:  tree,
	}
	obj := snap.storage.NewEncodedObject()
	if err := commit.Encode(obj); err != nil {
		return nil, fmt.Errorf("encoding snapshot commit: %w", err)
	}
	h, err := snap.storage.SetEncodedObject(obj)
	if err != nil {
		return nil, fmt.Errorf("storing snapshot commit: %w", err)
	}
	snap.Hash, snap.Tree = h, tree
	if err := snap.storage.SetReference(plumbing.NewHashReference(ref, h)); err != nil {
		return nil, err
	}
	if err := snap.storage.SetReference(plumbing.NewSymbolicReference(plumbing.HEAD, ref)); err != nil {
		return nil, err
	}
	return snap, nil
}

// listCandidates returns the sorted slash-separated paths of tracked files
// and of untracked files that git would not ignore, and how many paths were
// skipped because a snapshot cannot carry them (submodules, nested
// repositories). git itself lists them (`git ls-files`), so every source
// git reads decides what exists: .gitignore files, $GIT_DIR/info/exclude
// (the common one for a linked work tree), core.excludesFile wherever it
// is set (system, ~/.gitconfig, $XDG_CONFIG_HOME/git/config or
// ~/.config/git/config, .git/config, include and includeIf files) and
// git's default $XDG_CONFIG_HOME/git/ignore. A reimplementation of those
// rules missed every config source but ~/.gitconfig.
func listCandidates(ctx context.Context, root string) ([]string, int, error) {
	set := map[string]bool{}
	skipped := 0
	// --stage gives each tracked entry's mode: a gitlink (160000) is a
	// submodule, its own project.
	staged, err := gitLsFiles(ctx, root, "--cached", "--stage")
	if err != nil {
		return nil, 0, err
	}
	for _, rec := range staged {
		meta, name, ok := strings.Cut(rec, "\t")
		if !ok {
			return nil, 0, fmt.Errorf("git ls-files --stage in %s: unexpected record %q", root, rec)
		}
		if strings.HasPrefix(meta, "160000 ") {
			skipped++
			continue
		}
		set[name] = true
	}
	others, err := gitLsFiles(ctx, root, "--others", "--exclude-standard")
	if err != nil {
		return nil, 0, err
	}
	for _, name := range others {
		// An untracked nested repository is listed as its directory
		// ("vendor/other/"): its own project, not part of this tree.
		if strings.HasSuffix(name, "/") {
			skipped++
			continue
		}
		set[name] = true
	}
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, skipped, nil
}

// gitLsFiles runs `git ls-files -z` with args in the work tree root and
// returns its NUL-separated records. The variables that would point git
// at another repository or index are dropped: the work tree is root.
func gitLsFiles(ctx context.Context, root string, args ...string) ([]string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", root, "-c", "core.fsmonitor=false", "ls-files", "-z"}, args...)...)
	cmd.Env = gitEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("listing the work tree of %s with git ls-files %s: %w: %s", root, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	var recs []string
	for _, r := range strings.Split(string(out), "\x00") {
		if r != "" {
			recs = append(recs, r)
		}
	}
	return recs, nil
}

// gitEnv is the environment without the variables that redirect git to
// another repository, index or work tree.
func gitEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR", "GIT_NAMESPACE", "GIT_PREFIX":
			continue
		}
		env = append(env, kv)
	}
	return env
}

type treeFile struct {
	mode filemode.FileMode
	hash plumbing.Hash
}

// writeTrees stores the tree objects for files bottom-up and returns the root tree hash.
func writeTrees(sto *memory.Storage, files map[string]treeFile) (plumbing.Hash, error) {
	type dir struct {
		files map[string]treeFile
		dirs  map[string]bool
	}
	dirs := map[string]*dir{"": {files: map[string]treeFile{}, dirs: map[string]bool{}}}
	var ensure func(d string) *dir
	ensure = func(d string) *dir {
		if x, ok := dirs[d]; ok {
			return x
		}
		x := &dir{files: map[string]treeFile{}, dirs: map[string]bool{}}
		dirs[d] = x
		parent, name := path.Split(d)
		parent = strings.TrimSuffix(parent, "/")
		ensure(parent).dirs[name] = true
		return x
	}
	for p, f := range files {
		parent, name := path.Split(p)
		ensure(strings.TrimSuffix(parent, "/")).files[name] = f
	}

	// Deepest directories first, so every subtree hash exists before its parent needs it.
	names := make([]string, 0, len(dirs))
	for d := range dirs {
		names = append(names, d)
	}
	depth := func(d string) int {
		if d == "" {
			return 0
		}
		return strings.Count(d, "/") + 1
	}
	sort.Slice(names, func(i, j int) bool {
		if di, dj := depth(names[i]), depth(names[j]); di != dj {
			return di > dj
		}
		return names[i] < names[j]
	})
	hashes := map[string]plumbing.Hash{}
	for _, d := range names {
		x := dirs[d]
		var entries []object.TreeEntry
		for name, f := range x.files {
			entries = append(entries, object.TreeEntry{Name: name, Mode: f.mode, Hash: f.hash})
		}
		for name := range x.dirs {
			entries = append(entries, object.TreeEntry{Name: name, Mode: filemode.Dir, Hash: hashes[path.Join(d, name)]})
		}
		sortTreeEntries(entries)
		obj := sto.NewEncodedObject()
		if err := (&object.Tree{Entries: entries}).Encode(obj); err != nil {
			return plumbing.ZeroHash, fmt.Errorf("encoding tree %q: %w", d, err)
		}
		h, err := sto.SetEncodedObject(obj)
		if err != nil {
			return plumbing.ZeroHash, fmt.Errorf("storing tree %q: %w", d, err)
		}
		hashes[d] = h
	}
	return hashes[""], nil
}

// sortTreeEntries orders entries the way git does: by name, with directory
// names compared as if they ended in "/".
func sortTreeEntries(entries []object.TreeEntry) {
	key := func(e object.TreeEntry) string {
		if e.Mode == filemode.Dir {
			return e.Name + "/"
		}
		return e.Name
	}
	sort.Slice(entries, func(i, j int) bool { return key(entries[i]) < key(entries[j]) })
}

func storeObject(sto *memory.Storage, t plumbing.ObjectType, data []byte) (plumbing.Hash, error) {
	obj := sto.NewEncodedObject()
	obj.SetType(t)
	obj.SetSize(int64(len(data)))
	w, err := obj.Writer()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if _, err := w.Write(data); err != nil {
		return plumbing.ZeroHash, err
	}
	if err := w.Close(); err != nil {
		return plumbing.ZeroHash, err
	}
	return sto.SetEncodedObject(obj)
}

// fluxStarts are the paths the cluster's build starts from.
func fluxStarts(fluxPath string) []string {
	if fluxPath == "" {
		return nil
	}
	return []string{fluxPath}
}

// chartDirs are the directories holding a Helm chart (a Chart.yaml).
func chartDirs(candidates []string) map[string]bool {
	charts := map[string]bool{}
	for _, p := range candidates {
		if path.Base(p) == "Chart.yaml" {
			charts[path.Dir(p)] = true
		}
	}
	return charts
}
