package redact

import (
	"bytes"
	"testing"
)

func TestWriterMasks(t *testing.T) {
	var s Set
	s.Add("s3cr3t-token-value")
	s.Add("ab") // too short to mask
	var buf bytes.Buffer
	w := s.Writer(&buf)
	n, err := w.Write([]byte(`{"msg":"auth PVEAPIToken=root@pam!ci=s3cr3t-token-value ab"}`))
	if err != nil || n == 0 {
		t.Fatal(err)
	}
	want := `{"msg":"auth PVEAPIToken=root@pam!ci=[REDACTED] ab"}`
	if buf.String() != want {
		t.Fatalf("got %s", buf.String())
	}
}
