package e2e_test

import (
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2"

	"github.com/homelab/bootstrap/lab/pvesim"
	"github.com/homelab/bootstrap/proxmox"
)

// TestMain keeps the in-process lab's client-go and NFS server loggers out
// of the test output: the lab logs to a file per test (printed on failure).
// After the runs, every Proxmox call the built binary made (pvesim records
// them by the schema's path template) must be in proxmox.APICalls, whose
// entries the proxmox package's schema tests hold to every supported PVE
// release.
func TestMain(m *testing.M) {
	flag.Parse()
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	log.SetOutput(io.Discard)
	code := m.Run()
	if code == 0 {
		var missing []string
		for _, c := range pvesim.ProcessCalls() {
			if !slices.ContainsFunc(proxmox.APICalls, func(a proxmox.APICall) bool { return a.Method+" "+a.Path == c }) {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: the runs made Proxmox calls that are not in proxmox.APICalls: %s\n", strings.Join(missing, ", "))
			code = 1
		}
	}
	os.Exit(code)
}
