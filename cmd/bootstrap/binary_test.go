package main

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// linkedImports lists every package the release binary links (built with
// the Makefile's TAGS) with the packages each imports.
func linkedImports(t *testing.T) (tags string, imports map[string][]string) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs go list over the whole dependency graph")
	}
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^TAGS := (.+)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("the Makefile sets no TAGS")
	}
	tags = strings.TrimSpace(string(m[1]))
	out, err := exec.Command("go", "list", "-tags", tags, "-deps", "-f", "{{.ImportPath}}:{{join .Imports \" \"}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports = map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imp, _ := strings.Cut(line, ":")
		imports[pkg] = strings.Fields(imp)
	}
	return tags, imports
}

// The release binary links no Go plugin support: a binary importing the
// plugin package exports every symbol dynamically (36 MiB more on disk,
// 39 MiB more resident at start, measured with `make binsize`). kustomize
// imports it unless the Makefile's TAGS say otherwise; this fails when a
// dependency brings plugin in some other way, naming the importer.
func TestNoGoPluginSupport(t *testing.T) {
	tags, imports := linkedImports(t)
	var importers []string
	for pkg, imp := range imports {
		if slices.Contains(imp, "plugin") {
			importers = append(importers, pkg)
		}
	}
	if len(importers) > 0 {
		slices.Sort(importers)
		t.Errorf("built with -tags %s, bootstrap links Go plugin support, imported by %s", tags, strings.Join(importers, ", "))
	}
}

// The release binary links none of the sops library's key services (AWS,
// Google Cloud and Azure KMS, Vault, with their SDKs and gRPC's xDS):
// package sops writes the format itself and wraps keys with age alone.
// Linking them cost 23 MB of binary and 22 MiB resident at start.
func TestNoSOPSKeyServices(t *testing.T) {
	_, imports := linkedImports(t)
	for _, p := range []string{"github.com/getsops/sops/v3", "github.com/getsops/sops/v3/keyservice", "github.com/getsops/sops/v3/config", "github.com/getsops/sops/v3/kms"} {
		if _, linked := imports[p]; linked {
			var by []string
			for pkg, imp := range imports {
				if slices.Contains(imp, p) {
					by = append(by, pkg)
				}
			}
			slices.Sort(by)
			t.Errorf("bootstrap links %s, imported by %s", p, strings.Join(by, ", "))
		}
	}
}
