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
// starts its own: both tasks succeed, each renaming its own temporary
// file over the destination (pve-common download_file_from_url checks for
// an existing file only as a task starts). A download that starts after
// the file appeared is refused without a checksum ("refusing to override
// existing file"), and FetchISO keeps the file. The ISO is there: neither
// must fail.
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
	// Both tasks end OK: the later rename wins.
	for len(e.sim.TaskExits("download")) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the killed run's download never ended")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, st := range e.sim.TaskExits("download") {
		if st != "OK" {
			t.Errorf("a download task ended %q", st)
		}
	}
	// A download started after the file is there: refused, and kept.
	if err := e.c.FetchISO(ctx, src); err != nil {
		t.Fatalf("FetchISO with the file already there: %v", err)
	}
	exits := e.sim.TaskExits("download")
	if len(exits) != 3 || !strings.Contains(exits[2], "refusing to override existing file") {
		t.Errorf("the third download: %v", exits)
	}
}
