// Package reporttest checks a postcheck report.json against the JSON
// Schema the project ships (docs/report.schema.json), with the validator
// Helm uses for values schemas (santhosh-tekuri/jsonschema), formats
// asserted: what a user's own validator would say of the file.
package reporttest

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// SchemaPath is docs/report.schema.json in this checkout.
func SchemaPath(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the repository")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "docs", "report.schema.json")
}

// Validate returns the validator's verdict on report (nil: valid).
func Validate(t testing.TB, report []byte) error {
	t.Helper()
	raw, err := os.ReadFile(SchemaPath(t))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("the schema is not JSON: %v", err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("report.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("report.schema.json")
	if err != nil {
		t.Fatalf("the schema does not compile: %v", err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(report))
	if err != nil {
		return err
	}
	return s.Validate(inst)
}
