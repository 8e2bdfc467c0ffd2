package gitsnap

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"sigs.k8s.io/kustomize/api/krusty"
	kustypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// The snapshot serves what the cluster's build reads (neededFiles), and
// proves it: kustomize, the library kustomize-controller builds with,
// builds every directory the cluster builds from a kustomization file,
// over the work tree as source-controller's artifact of it would hold it
// (readableFS), and every file it reads must be served. kustomize is
// deterministic over what it reads, so a build that reads only served
// files yields from the snapshot exactly what it yields from git. A file
// read but not served is a miss of neededFiles' reading of kustomize: the
// snapshot is refused, naming it (Missed), never served with a gap.
// Directories without a kustomization file are Flux's generator's, whose
// reads neededFiles lists in full (every manifest below them).

// Missed is a file the cluster's build reads that the snapshot would not
// serve: not withheld by a rule, but left out by the reading of what the
// build needs.
type Missed struct {
	// Path is slash-separated, relative to the work tree's root.
	Path string `json:"path"`
	// ReadBy is the directory whose kustomize build read it.
	ReadBy string `json:"readBy"`
}

// proveReads builds each kustomization directory of r over the readable
// files of root and returns the files a build read that served lacks,
// sorted, and why a directory could not be proven ("" when every one
// was).
func proveReads(root string, r *buildReads, served map[string]treeFile) (missed []Missed, unproven string) {
	if r.remote != "" {
		return nil, fmt.Sprintf("%s loads a remote base, which kustomize would fetch", r.remote)
	}
	fsys := newReadableFS(root, r.readable)
	opts := &krusty.Options{LoadRestrictions: kustypes.LoadRestrictionsNone, PluginConfig: kustypes.DisabledPluginConfig()}
	seen := map[string]bool{}
	var failed []string
	for _, dir := range r.kustomizations {
		fsys.reset()
		if _, err := krusty.MakeKustomizer(opts).Run(fsys, filepath.Join(root, filepath.FromSlash(dir))); err != nil {
			// kustomize-controller fails the same build and says so on
			// its Kustomization; what it read before is still checked.
			failed = append(failed, fmt.Sprintf("%s/ (%v)", dir, err))
		}
		for _, p := range fsys.reads() {
			if _, ok := served[p]; !ok && !seen[p] {
				seen[p] = true
				missed = append(missed, Missed{Path: p, ReadBy: dir})
			}
		}
	}
	sort.Slice(missed, func(i, j int) bool { return missed[i].Path < missed[j].Path })
	if len(failed) > 0 {
		unproven = "kustomize could not build " + strings.Join(failed, "; ")
	}
	return missed, unproven
}

// readableFS is the work tree as the artifact holds it: the readable
// files under root and their directories, nothing outside root, nothing
// written. It records the files read.
type readableFS struct {
	filesys.FileSystem // on disk, for reading
	root               string
	files, dirs        map[string]bool
	mu                 sync.Mutex
	read               map[string]bool
}

func newReadableFS(root string, readable map[string]bool) *readableFS {
	f := &readableFS{FileSystem: filesys.MakeFsOnDisk(), root: root, files: readable, dirs: map[string]bool{".": true}, read: map[string]bool{}}
	for p := range readable {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			f.dirs[d] = true
		}
	}
	return f
}

func (f *readableFS) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.read = map[string]bool{}
}

func (f *readableFS) reads() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.read))
}

// rel is p relative to the root, slash-separated; false outside it.
func (f *readableFS) rel(p string) (string, bool) {
	if !filepath.IsAbs(p) {
		p = filepath.Join(f.root, p)
	}
	r, err := filepath.Rel(f.root, filepath.Clean(p))
	if err != nil || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) {
		return "", false
	}
	return filepath.ToSlash(r), true
}

func (f *readableFS) notExist(p string) error {
	return &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
}

// readable records p as read and returns its path on disk, or says it
// does not exist when the artifact would not hold it.
func (f *readableFS) readable(p string) (string, error) {
	r, ok := f.rel(p)
	if !ok || !f.files[r] {
		return "", f.notExist(p)
	}
	f.mu.Lock()
	f.read[r] = true
	f.mu.Unlock()
	return filepath.Join(f.root, filepath.FromSlash(r)), nil
}

var errReadOnly = errors.New("the snapshot's proof build writes nothing")

func (f *readableFS) ReadFile(p string) ([]byte, error) {
	full, err := f.readable(p)
	if err != nil {
		return nil, err
	}
	return f.FileSystem.ReadFile(full)
}

func (f *readableFS) Open(p string) (filesys.File, error) {
	full, err := f.readable(p)
	if err != nil {
		return nil, err
	}
	return f.FileSystem.Open(full)
}

func (f *readableFS) Exists(p string) bool {
	r, ok := f.rel(p)
	return ok && (f.files[r] || f.dirs[r])
}

func (f *readableFS) IsDir(p string) bool {
	r, ok := f.rel(p)
	return ok && f.dirs[r]
}

func (f *readableFS) CleanedAbs(p string) (filesys.ConfirmedDir, string, error) {
	if !f.Exists(p) {
		return "", "", f.notExist(p)
	}
	return f.FileSystem.CleanedAbs(p)
}

func (f *readableFS) ReadDir(p string) ([]string, error) {
	r, ok := f.rel(p)
	if !ok || !f.dirs[r] {
		return nil, f.notExist(p)
	}
	names := map[string]bool{}
	for q := range f.files {
		if rest, ok := strings.CutPrefix(q, r+"/"); ok || r == "." {
			if r == "." {
				rest = q
			}
			names[strings.SplitN(rest, "/", 2)[0]] = true
		}
	}
	return slices.Sorted(maps.Keys(names)), nil
}

func (f *readableFS) Glob(pattern string) ([]string, error) {
	all, err := f.FileSystem.Glob(pattern)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range all {
		if f.Exists(p) {
			out = append(out, p)
		}
	}
	return out, nil
}

func (f *readableFS) Walk(p string, fn filepath.WalkFunc) error {
	return f.FileSystem.Walk(p, func(q string, info fs.FileInfo, err error) error {
		if err == nil && !f.Exists(q) {
			if info.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		return fn(q, info, err)
	})
}

func (f *readableFS) Create(p string) (filesys.File, error) { return nil, errReadOnly }
func (f *readableFS) Mkdir(p string) error                  { return errReadOnly }
func (f *readableFS) MkdirAll(p string) error               { return errReadOnly }
func (f *readableFS) RemoveAll(p string) error              { return errReadOnly }
func (f *readableFS) WriteFile(p string, _ []byte) error    { return errReadOnly }
