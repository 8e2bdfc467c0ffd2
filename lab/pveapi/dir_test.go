package pveapi

import (
	"errors"
	"testing"
)

// Without the schema files, BOOTSTRAP_REQUIRE_LAB=1 makes the missing
// directory an error no test may skip over (pvesim's New and DirForTest
// fail on it); without it, the judge is off and the schema tests skip.
func TestRequireLabRequiresTheSchema(t *testing.T) {
	t.Setenv(DirEnv, "")
	t.Chdir(t.TempDir()) // no repository above: no ../shared/pve-api
	old := sharedDir
	sharedDir = t.TempDir()
	t.Cleanup(func() { sharedDir = old })

	t.Setenv(requireLabEnv, "")
	if _, explicit, err := Dir(); !errors.Is(err, ErrNoSchema) || explicit {
		t.Fatalf("without %s: explicit %v, %v", requireLabEnv, explicit, err)
	}
	t.Setenv(requireLabEnv, "1")
	if _, explicit, err := Dir(); !errors.Is(err, ErrNoSchema) || !explicit {
		t.Fatalf("with %s=1: explicit %v, %v", requireLabEnv, explicit, err)
	}
}
