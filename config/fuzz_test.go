package config

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzConfig feeds arbitrary bytes through decode and validate, seeded
// with every corpus case and the example: whatever the input, the result
// is a config or a user error, never a panic, and a config that decodes
// validates without one (`make fuzz` runs it; the seeds run in make test).
func FuzzConfig(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*/*.yaml")
	seeds = append(seeds, "example.yaml")
	for _, s := range seeds {
		b, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	// Paths in a fuzzed config resolve in an empty directory: files it
	// names are then missing (reported, quickly) instead of patches that
	// would make every execution generate a Talos secrets bundle.
	path := filepath.Join(f.TempDir(), "fuzz.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(path, data, noEnv)
		if err != nil {
			if !IsUserError(err) {
				t.Fatalf("decode error is not a user error: %T %v", err, err)
			}
			return
		}
		if err := cfg.Validate(); err != nil && !IsUserError(err) {
			t.Fatalf("validate error is not a user error: %T %v", err, err)
		}
	})
}
