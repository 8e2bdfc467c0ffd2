package kubetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The lab slots go out in the order the tests asked: a ticket waits while
// an older one of a live process is queued; a gone process's ticket is
// dropped.
func TestSlotTicketsInOrder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "queue")
	a, err := takeTicket(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := takeTicket(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !a.first() || b.first() {
		t.Fatalf("first: a %v, b %v; want only a", a.first(), b.first())
	}
	a.done()
	if !b.first() {
		t.Fatal("b is not first once a is done")
	}
	// A ticket older than b, left by a process that is gone.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, fmt.Sprintf("%020d-%d", 1, cmd.Process.Pid))
	if err := os.WriteFile(stale, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if !b.first() {
		t.Fatal("a gone process's ticket holds the queue")
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("the stale ticket is still there: %v", err)
	}
	// One of a live process (this one) does hold it.
	live := filepath.Join(dir, fmt.Sprintf("%020d-%d", 1, os.Getpid()))
	if err := os.WriteFile(live, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if b.first() {
		t.Fatal("b went before an older live ticket")
	}
}
