package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
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
			noMarker(t, err.Error())
			return
		}
		err = cfg.Validate()
		if err != nil && !IsUserError(err) {
			t.Fatalf("validate error is not a user error: %T %v", err, err)
		}
		// A secret typed where none belongs is never quoted back: every
		// misplaced secret, and the corpus's seeded markers, stay masked.
		out := ""
		if err != nil {
			out = err.Error()
		}
		for _, w := range cfg.Warnings() {
			out += "\n" + w.Error()
		}
		noMarker(t, out)
		for _, s := range cfg.MisplacedSecrets() {
			if len(s) >= 4 && strings.Contains(out, s) {
				t.Fatalf("validate's output quotes the misplaced secret %q:\n%s", s, out)
			}
		}
	})
}

// secretMarker is how the corpus writes a secret typed where none belongs
// (marker-<where>-0x5eed): no output may hold one.
var secretMarker = regexp.MustCompile(`marker-[a-z0-9]+-0x5eed|Marker0x5eed`)

func noMarker(t *testing.T, out string) {
	t.Helper()
	if m := secretMarker.FindString(out); m != "" {
		t.Fatalf("the output holds the seeded secret %q:\n%s", m, out)
	}
}
