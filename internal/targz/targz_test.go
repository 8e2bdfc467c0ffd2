package targz

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"testing"
	"time"
)

func TestPackIsDeterministicAndSorted(t *testing.T) {
	files := map[string][]byte{"b.yaml": []byte("b"), "a/x.yaml": []byte("ax")}
	one, err := Pack(files, 0o600, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	two, _ := Pack(files, 0o600, time.Unix(0, 0))
	if !bytes.Equal(one, two) {
		t.Fatal("same files, different bytes")
	}
	gz, _ := gzip.NewReader(bytes.NewReader(one))
	tr := tar.NewReader(gz)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Mode != 0o600 {
			t.Fatalf("mode %o", h.Mode)
		}
		names = append(names, h.Name)
	}
	if len(names) != 2 || names[0] != "a/x.yaml" {
		t.Fatalf("entries %v", names)
	}
}

func TestUnpackReadsWhatPackWrote(t *testing.T) {
	files := map[string][]byte{"b.yaml": []byte("b"), "a/x.yaml": []byte("ax"), "empty": {}}
	data, err := Pack(files, 0o600, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Unpack(data)
	if err != nil || len(got) != 3 || string(got["a/x.yaml"]) != "ax" || string(got["b.yaml"]) != "b" {
		t.Fatalf("unpacked %v %v", got, err)
	}
	if _, err := Unpack([]byte("not gzip")); err == nil {
		t.Fatal("unpacked garbage")
	}
}
