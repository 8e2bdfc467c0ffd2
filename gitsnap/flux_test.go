package gitsnap

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	fluxgit "github.com/fluxcd/pkg/git"
	"github.com/fluxcd/pkg/git/gogit"
	"github.com/fluxcd/pkg/git/repository"
)

// TestFluxShallowClone clones the way source-controller does: fluxcd/pkg/git's
// go-git client, depth 1, single branch, anonymous HTTP.
func TestFluxShallowClone(t *testing.T) {
	fx, srv, _ := serveFixture(t)
	snap := srv.Snapshot()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	clone := func(t *testing.T, lastObserved string) (*fluxgit.Commit, string) {
		dir := t.TempDir()
		c, err := gogit.NewClient(dir, &fluxgit.AuthOptions{Transport: fluxgit.HTTP}, gogit.WithDiskStorage(), gogit.WithSingleBranch(true))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		commit, err := c.Clone(ctx, srv.URL(), repository.CloneConfig{
			CheckoutStrategy:   repository.CheckoutStrategy{Branch: testRepoBranch},
			ShallowClone:       true,
			LastObservedCommit: lastObserved,
		})
		if err != nil {
			t.Fatalf("flux go-git shallow clone of %s: %v", srv.URL(), err)
		}
		return commit, dir
	}

	commit, dir := clone(t, "")
	if !fluxgit.IsConcreteCommit(*commit) {
		t.Fatalf("clone returned a non-concrete commit %v", commit)
	}
	if commit.Hash.String() != snap.Hash.String() {
		t.Errorf("cloned commit %s, want %s", commit.Hash, snap.Hash)
	}
	if got := commit.String(); got != snap.Revision() {
		t.Errorf("revision %q, want %q (what Flux reports as applied)", got, snap.Revision())
	}
	for p, want := range fx.included {
		if fx.modes[p] != 0 {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(p)))
		if err != nil || string(b) != want {
			t.Errorf("%s in the flux clone = %q (%v), want %q", p, b, err, want)
		}
	}
	for p := range fx.excluded {
		if _, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(p))); err == nil {
			t.Errorf("excluded %s is in the flux clone", p)
		}
	}
	if target, err := os.Readlink(filepath.Join(dir, "link")); err != nil || target != "infra/app.yaml" {
		t.Errorf("symlink in the flux clone: %q %v", target, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "scripts", "run.sh")); err != nil || fi.Mode().Perm()&0o100 == 0 {
		t.Errorf("exec bit in the flux clone: %v %v", fi, err)
	}

	// Flux first asks whether the revision moved; an unchanged snapshot is not re-cloned.
	again, _ := clone(t, snap.Revision())
	if fluxgit.IsConcreteCommit(*again) || again.Hash.String() != snap.Hash.String() {
		t.Errorf("unchanged revision: got %v (concrete %v), want a non-concrete %s", again.Hash, fluxgit.IsConcreteCommit(*again), snap.Hash)
	}
	writeFile(t, fx.dir, "infra/app.yaml", "kind: Edited\n", 0o644)
	next, _, err := srv.Refresh(ctx)
	if err != nil {
		t.Fatal(err)
	}
	moved, dir2 := clone(t, snap.Revision())
	if !fluxgit.IsConcreteCommit(*moved) || moved.Hash.String() != next.Hash.String() {
		t.Errorf("after an edit: got %v, want a fresh clone of %s", moved.Hash, next.Hash)
	}
	if b, _ := os.ReadFile(filepath.Join(dir2, "infra", "app.yaml")); string(b) != "kind: Edited\n" {
		t.Errorf("edited file in the flux clone = %q", b)
	}
}
