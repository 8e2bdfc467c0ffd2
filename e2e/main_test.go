package e2e_test

import (
	"flag"
	"io"
	"log"
	"os"
	"testing"

	"k8s.io/klog/v2"
)

// TestMain keeps the in-process lab's client-go and NFS server loggers out
// of the test output: the lab logs to a file per test (printed on failure).
func TestMain(m *testing.M) {
	flag.Parse()
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	log.SetOutput(io.Discard)
	os.Exit(m.Run())
}
