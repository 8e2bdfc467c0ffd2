package flux

import (
	"context"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/gitsnap"
)

func TestRemoteBranchHeadAgainstSnapshotServer(t *testing.T) {
	repo := t.TempDir()
	os.MkdirAll(filepath.Join(repo, "infra"), 0o755)
	os.WriteFile(filepath.Join(repo, "infra", "kustomization.yaml"), []byte("resources: []\n"), 0o644)
	if out, err := exec.Command("git", "-C", repo, "init", "-q", "-b", "main").CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	ctx := context.Background()
	srv, err := gitsnap.NewServer(ctx, gitsnap.ServerOptions{Build: gitsnap.BuildOptions{Dir: repo, Branch: "main"}, URL: "http://x/homelab.git", Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	url := hs.URL + "/homelab.git"
	head, err := RemoteBranchHead(ctx, url, "main", Credentials{}, "")
	if err != nil {
		t.Fatal(err)
	}
	if head != srv.Snapshot().Hash.String() {
		t.Fatalf("head %s, snapshot %s", head, srv.Snapshot().Hash)
	}
	if _, err := RemoteBranchHead(ctx, url, "release", Credentials{}, ""); err == nil || !strings.Contains(err.Error(), `no branch "release" (branches: main)`) {
		t.Fatalf("missing branch: %v", err)
	}
	if _, err := RemoteBranchHead(ctx, hs.URL+"/other.git", "main", Credentials{}, ""); err == nil {
		t.Fatal("a repository the server does not serve was listed")
	}
}
