package proxmox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/lab/pvesim"
)

// A run killed during the ISO download leaves its download-url task
// running on the host. The resumed run does not see the file yet and
// starts its own; without a checksum Proxmox refuses to let the later one
// replace the file the first one stored ("refusing to override existing
// file"). The ISO is there: EnsureISO must not fail.
func TestDownloadRacingAKilledRunsTask(t *testing.T) {
	prof, _ := pvesim.ProfileByName("instant")
	prof.DownloadPerMiB = 5 * time.Millisecond
	const url = "https://factory.example/image/big/v1.13.3/nocloud-amd64.iso"
	e := newEnv(t, pvesim.Options{Profile: prof, RemoteFiles: map[string]pvesim.RemoteFile{url: {Size: 100 << 20, SHA256: strings.Repeat("ab", 32)}}})
	ctx := ctxT(t)
	src := ISOSource{Storage: "local", Filename: "talos-big.iso", URL: url}

	killed, kill := context.WithCancel(ctx)
	go func() { _, _ = e.c.EnsureISO(killed, src) }()
	deadline := time.Now().Add(10 * time.Second)
	for e.sim.TaskCount("download") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first download never started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	kill() // the client is gone; its task is not

	if _, err := e.c.EnsureISO(ctx, src); err != nil {
		t.Fatalf("the resumed run's download: %v", err)
	}
	if _, ok, err := e.c.FindISO(ctx, "local", "talos-big.iso"); !ok || err != nil {
		t.Fatalf("ISO not on storage: %v %v", ok, err)
	}
	if n := e.sim.TaskCount("download"); n != 2 {
		t.Errorf("%d download tasks, want 2 (the killed run's and ours)", n)
	}
}
