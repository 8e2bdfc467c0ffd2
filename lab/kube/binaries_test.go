package kube

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A bin dir built by `build.sh --demo` (make demo) has no previous-minor
// servers: a lab starts from it, and only a server asked for the previous
// minor fails, naming the binary and how to build it.
func TestLoadBinariesWithoutThePreviousMinor(t *testing.T) {
	dir := t.TempDir()
	manifest := `{"modules": {
  "k8s.io/kubernetes": {"version": "v1.36.1"},
  "k8s.io/kubernetes@previous": {"version": "v1.35.4"},
  "k8s.io/kubernetes@1.30": {"version": "v1.30.14"},
  "go.etcd.io/etcd/server/v3": {"version": "v3.6.5"},
  "sigs.k8s.io/kwok": {"version": "v0.8.0"},
  "github.com/fluxcd/source-controller": {"version": "v1.9.5"},
  "github.com/fluxcd/kustomize-controller": {"version": "v1.9.5"},
  "github.com/fluxcd/helm-controller": {"version": "v1.6.4"},
  "github.com/cilium/cilium": {"version": "v1.20.2"}}}`
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, n := range binaryNames {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/true\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := LoadBinaries(dir)
	if err != nil {
		t.Fatalf("a demo build must load: %v", err)
	}
	if path, runs, err := b.ServerBinary("kube-apiserver", "1.36.0"); err != nil || runs != "v1.36.1" || path != filepath.Join(dir, "kube-apiserver") {
		t.Fatalf("pinned minor: %s %s %v", path, runs, err)
	}
	_, _, err = b.ServerBinary("kube-apiserver", "1.35.0")
	if !errors.Is(err, ErrNoBinaries) || !strings.Contains(err.Error(), "previous-kube-apiserver") || !strings.Contains(err.Error(), "make lab-bins") {
		t.Fatalf("want the missing previous-minor build named, got %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "previous-kube-apiserver"), []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, runs, err := b.ServerBinary("kube-apiserver", "1.35.0"); err != nil || runs != "v1.35.4" {
		t.Fatalf("previous minor once built: %s %v", runs, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "1.30-kube-apiserver"), []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if path, runs, err := b.ServerBinary("kube-apiserver", "v1.30.2"); err != nil || runs != "v1.30.14" || path != filepath.Join(dir, "1.30-kube-apiserver") {
		t.Fatalf("an older minor named in the manifest: %s %s %v", path, runs, err)
	}
	if _, _, err := b.ServerBinary("kube-apiserver", "1.29.0"); err == nil || !strings.Contains(err.Error(), "v1.36.1, v1.30.14, v1.35.4") {
		t.Fatalf("a minor not built must name the built ones, got %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "kwok")); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadBinaries(dir); !errors.Is(err, ErrNoBinaries) {
		t.Fatalf("a bin dir without kwok must not load: %v", err)
	}
}
