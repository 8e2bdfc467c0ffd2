package pveapi

import "testing"

// DirForTest is the schema directory for a test that needs it: the test
// is skipped, naming where the files come from, when there is none, and
// fails when BOOTSTRAP_PVE_API_DIR names a directory without them (CI sets
// it: .ci/run).
func DirForTest(t testing.TB) string {
	t.Helper()
	dir, explicit, err := Dir()
	if err != nil {
		if explicit {
			t.Fatal(err)
		}
		t.Skipf("skipped: %v", err)
	}
	return dir
}

// LoadForTest loads every published release for a test (see DirForTest).
func LoadForTest(t testing.TB) []*API {
	t.Helper()
	dir := DirForTest(t)
	out := make([]*API, 0, len(Releases))
	for _, r := range Releases {
		a, err := Load(dir, r)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}
