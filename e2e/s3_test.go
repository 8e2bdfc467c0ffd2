package e2e_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/backup"
	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/lab/s3server"
	"github.com/homelab/bootstrap/sops"
)

// TestRestoreOnANewMachineFromS3: backups go to a real S3 server (the
// lab's versitygw) age-encrypted, with the secrets bundle beside each
// snapshot; the user's own tools (age, etcdutl) open what was uploaded.
// Then the cluster and this machine's .talos/ and ai/state/ are lost: with
// only the config, the age identity and the S3 copies, `bootstrap restore
// --from s3://… --secrets s3://…` brings the cluster back, data included,
// to a green postcheck that reports the newest verified remote copy.
func TestRestoreOnANewMachineFromS3(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 6*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1})
	dir := t.TempDir()
	srv, err := s3server.Start(ctx, s3server.Options{Dir: filepath.Join(dir, "s3"), Log: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	if err := srv.MakeBucket("backups"); err != nil {
		t.Fatal(err)
	}
	identity, recipient, err := sops.GenerateIdentity()
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "age.agekey")
	writeSecretFile(t, keyFile, identity+"\n")
	creds := filepath.Join(dir, "s3-credentials")
	writeSecretFile(t, creds, "[default]\naws_access_key_id = "+srv.AccessKey+"\naws_secret_access_key = "+srv.SecretKey+"\n")
	if err := h.EditConfig(func(s string) (string, error) {
		return s + "secrets:\n  age:\n    recipients: [" + recipient + "]\n    keyFile: " + keyFile + "\n" +
			"backup:\n  ageRecipients: [" + recipient + "]\n  s3:\n    endpoint: " + srv.Endpoint + "\n    bucket: backups\n    pathStyle: true\n    credentialsFile: " + creds + "\n", nil
	}); err != nil {
		t.Fatal(err)
	}
	if r := run(t, ctx, h, "run", "--stage", "all"); r.ExitCode != 0 {
		t.Fatalf("pipeline:\n%s", r.Tail(40))
	}
	drillObjects(t, ctx, h)
	if r := run(t, ctx, h, "backup"); r.ExitCode != 0 {
		t.Fatalf("backup:\n%s", r.Tail(20))
	}
	createConfigMap(t, ctx, h, "drill", "after-backup", nil) // not in the snapshot

	// What landed in the bucket: encrypted copies only, which age and
	// etcdutl open.
	mc, err := minio.New(strings.TrimPrefix(srv.Endpoint, "http://"), &minio.Options{Creds: credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, ""), BucketLookup: minio.BucketLookupPath})
	if err != nil {
		t.Fatal(err)
	}
	var snapKey, bundleKey string
	for obj := range mc.ListObjects(ctx, "backups", minio.ListObjectsOptions{Recursive: true}) {
		if obj.Err != nil {
			t.Fatal(obj.Err)
		}
		switch {
		case strings.HasSuffix(obj.Key, backup.Suffix+backup.AgeSuffix):
			snapKey = obj.Key
		case strings.HasSuffix(obj.Key, ".secrets.yaml"+backup.AgeSuffix):
			bundleKey = obj.Key
		default:
			t.Errorf("unencrypted object in the bucket: %s", obj.Key)
		}
	}
	if !strings.HasPrefix(snapKey, "lab/etcd/") || bundleKey == "" {
		t.Fatalf("bucket holds snapshot %q and bundle %q", snapKey, bundleKey)
	}
	enc := filepath.Join(dir, "copy.snapshot.age")
	if err := mc.FGetObject(ctx, "backups", snapKey, enc, minio.GetObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "copy.snapshot")
	if out, err := exec.CommandContext(ctx, toolBin(t, "age"), "-d", "-i", keyFile, "-o", plain, enc).CombinedOutput(); err != nil {
		t.Fatalf("age -d: %v\n%s", err, out)
	}
	if out, err := exec.CommandContext(ctx, toolBin(t, "etcdutl"), "snapshot", "status", plain, "-w", "json").CombinedOutput(); err != nil {
		t.Fatalf("etcdutl snapshot status on the S3 copy: %v\n%s", err, out)
	}

	// The machine is lost with the cluster: only the config, the
	// identity and the bucket remain (the old machine's snapshot server
	// goes with it).
	if r := run(t, ctx, h, "gitsnap", "stop"); r.ExitCode != 0 {
		t.Fatalf("gitsnap stop:\n%s", r.Tail(10))
	}
	loseTheCluster(t, ctx, h)
	paths := h.Paths()
	for _, d := range []string{paths.TalosDir, paths.StateDir} {
		if err := os.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
	}
	if r := run(t, ctx, h, "run", "--stage", "provision"); r.ExitCode != 0 {
		t.Fatalf("provision on the new machine:\n%s", r.Tail(20))
	}
	noBundle := run(t, ctx, h, "restore", "--from", "s3://backups/"+snapKey, "--age-identity", keyFile)
	if noBundle.ExitCode != 2 || !strings.Contains(noBundle.Stdout+noBundle.Stderr, "pass --secrets") {
		t.Fatalf("restore without the bundle: exit %d\n%s", noBundle.ExitCode, noBundle.Tail(10))
	}
	r := run(t, ctx, h, "restore", "--from", "s3://backups/"+snapKey, "--secrets", "s3://backups/"+bundleKey, "--age-identity", keyFile)
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, "restored etcd from s3://backups/"+snapKey) {
		t.Fatalf("restore on the new machine:\n%s", r.Tail(40))
	}
	checkDrillObjects(t, ctx, h)
	b, err := os.ReadFile(paths.Secrets)
	if err != nil || !sops.IsEncrypted(b) {
		t.Fatalf("the restored bundle is not the SOPS-encrypted one the old machine kept (%v)", err)
	}
	// The configs made again on the new machine are kept as the old one
	// kept them: no key in plaintext beside the encrypted bundle.
	sealedAtRest(t, ctx, h, keyFile)
	// The restore ran the postcheck (it must pass for the restore to
	// succeed); the nightly one reads the remote copies too.
	pc := run(t, ctx, h, "run", "--stage", "postcheck")
	if pc.ExitCode != 0 || !strings.Contains(pc.Stdout+pc.Stderr, "newest verified remote copy s3://backups/lab/etcd/") {
		t.Fatalf("postcheck:\n%s", pc.Tail(30))
	}
}
