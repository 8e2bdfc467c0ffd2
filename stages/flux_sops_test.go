package stages

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/homelab/bootstrap/config"
)

// TestRepositorySOPSFollowsTheBuild: the recipients sops-age must open are
// those of the SOPS files the cluster's build reads from flux.path,
// wherever they lie (a Flux Kustomization for ./apps beside the cluster's
// directory, decrypting with the same Secret), dotenv generator inputs
// included; a SOPS file nothing builds does not count.
func TestRepositorySOPSFollowsTheBuild(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("the git CLI is not installed")
	}
	dir := t.TempDir()
	if out, err := exec.Command("git", "-C", dir, "init", "-q").CombinedOutput(); err != nil {
		t.Fatalf("git init: %v\n%s", err, out)
	}
	sealed := func(recipient string) string {
		return "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData:\n  v: ENC[AES256_GCM,data:abc,iv:def,tag:ghi,type:str]\n" +
			"sops:\n  age:\n  - recipient: " + recipient + "\n    enc: x\n  mac: ENC[AES256_GCM,data:m,iv:i,tag:t,type:str]\n  version: 3.13.2\n"
	}
	const (
		recA = "age1aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		recB = "age1bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
		recC = "age1cccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
		recD = "age1dddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
	)
	for p, c := range map[string]string{
		"clusters/home/vars.sops.yaml": sealed(recA),
		"clusters/home/apps.yaml": "apiVersion: kustomize.toolkit.fluxcd.io/v1\nkind: Kustomization\nmetadata: {name: apps, namespace: flux-system}\n" +
			"spec:\n  path: ./apps\n  sourceRef: {kind: GitRepository, name: flux-system}\n  decryption: {provider: sops, secretRef: {name: sops-age}}\n",
		"apps/kustomization.yaml":   "resources: [db.sops.yaml]\nsecretGenerator:\n- name: env\n  envs: [secret.sops.env]\n",
		"apps/db.sops.yaml":         sealed(recB),
		"apps/secret.sops.env":      "PASSWORD=ENC[AES256_GCM,data:abc,iv:def,tag:ghi,type:str]\nsops_age__list_0__map_recipient=" + recC + "\nsops_mac=ENC[AES256_GCM,data:m,iv:i,tag:t,type:str]\nsops_version=3.13.2\n",
		"other-cluster/x.sops.yaml": sealed(recD),
	} {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := config.Parse(filepath.Join(dir, "bootstrap.yaml"), []byte("flux:\n  path: ./clusters/home\n  localSnapshot: {enabled: true, source: .}\n"), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	file, _, recipients, err := repositorySOPS(context.Background(), &Env{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(recipients)
	if want := []string{recA, recB, recC}; !slices.Equal(recipients, want) {
		t.Errorf("recipients = %v, want %v (flux.path's, the apps Kustomization's, its dotenv generator input's; not other-cluster's)", recipients, want)
	}
	if file == "" {
		t.Error("no SOPS file returned for the precheck")
	}
}
