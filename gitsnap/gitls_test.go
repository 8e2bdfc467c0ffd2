package gitsnap

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildListsWhatGitLists: the snapshot holds exactly what git lists,
// whichever config source names the excludes file: core.excludesFile in
// $XDG_CONFIG_HOME/git/config (~/.config/git/config), and in a file the
// repository's .git/config includes. go-git's own matcher read neither.
func TestBuildListsWhatGitLists(t *testing.T) {
	requireGit(t)
	xdg := os.Getenv("XDG_CONFIG_HOME")
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir, excludes string)
	}{
		{"~/.config/git/config", func(t *testing.T, dir, excludes string) {
			writeFile(t, xdg, "git/config", "[core]\n\texcludesFile = "+excludes+"\n", 0o644)
			t.Cleanup(func() { os.Remove(filepath.Join(xdg, "git", "config")) })
		}},
		{".git/config include", func(t *testing.T, dir, excludes string) {
			writeFile(t, dir, ".git/extra.inc", "[core]\n\texcludesFile = "+excludes+"\n", 0o644)
			git(t, dir, "config", "include.path", "extra.inc")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			git(t, dir, "init", "-q", "-b", testRepoBranch)
			writeFile(t, dir, "infra/kustomization.yaml", "resources: [app.yaml]\n", 0o644)
			writeFile(t, dir, "infra/app.yaml", configMap, 0o644)
			writeFile(t, dir, "infra/local-notes.yaml", "scratch: not for git\n", 0o644)
			writeFile(t, dir, "scratch/todo.txt", "ignored\n", 0o644)
			excludes := filepath.Join(t.TempDir(), "my-excludes")
			writeFile(t, filepath.Dir(excludes), "my-excludes", "local-*.yaml\nscratch/\n", 0o644)
			tc.setup(t, dir, excludes)

			status := git(t, dir, "status", "--porcelain", "--untracked-files=all")
			if strings.Contains(status, "local-notes") || strings.Contains(status, "scratch/") {
				t.Fatalf("git itself lists the ignored files:\n%s", status)
			}
			snap, err := Build(context.Background(), BuildOptions{Dir: dir, Branch: testRepoBranch, ServeWholeTree: true})
			if err != nil {
				t.Fatal(err)
			}
			files, _, _ := snapshotFiles(t, snap)
			for _, p := range []string{"infra/local-notes.yaml", "scratch/todo.txt"} {
				if _, ok := files[p]; ok {
					t.Errorf("%s served although git ignores it", p)
				}
			}
			if _, ok := files["infra/app.yaml"]; !ok {
				t.Errorf("infra/app.yaml missing: %v", sortedKeys(files))
			}
		})
	}
}
