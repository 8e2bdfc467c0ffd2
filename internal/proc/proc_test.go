package proc

import (
	"runtime"
	"testing"
)

// PeakRSSKiB follows this process's own memory: touching 64 MiB raises
// it by about that much.
func TestPeakRSSKiB(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	before := PeakRSSKiB()
	if before <= 0 {
		t.Fatalf("peak RSS %d KiB", before)
	}
	b := make([]byte, 64<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	after := PeakRSSKiB()
	runtime.KeepAlive(b)
	if after-before < 60<<10 {
		t.Errorf("peak RSS went from %d to %d KiB after touching 64 MiB", before, after)
	}
}
