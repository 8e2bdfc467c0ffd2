// Package s3test starts the lab's S3 server for a package's tests.
package s3test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/homelab/bootstrap/lab/s3server"
	"github.com/rs/zerolog"
)

// Start runs the lab's S3 server (versitygw) for the test with one bucket,
// stopped at its end. Without the lab's binary the test is skipped, unless
// BOOTSTRAP_REQUIRE_LAB=1 (make test) makes that a failure.
func Start(t testing.TB, bucket string) *s3server.Server {
	t.Helper()
	srv, err := s3server.Start(context.Background(), s3server.Options{Dir: t.TempDir(), Log: zerolog.New(zerolog.NewTestWriter(t))})
	if errors.Is(err, s3server.ErrNoBinary) && os.Getenv("BOOTSTRAP_REQUIRE_LAB") != "1" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	if err := srv.MakeBucket(bucket); err != nil {
		t.Fatal(err)
	}
	return srv
}
