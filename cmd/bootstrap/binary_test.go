package main

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The release binary links no Go plugin support: a binary importing the
// plugin package exports every symbol dynamically (36 MiB more on disk,
// 39 MiB more resident at start, measured with `make binsize`). kustomize
// imports it unless the Makefile's TAGS say otherwise; this fails when a
// dependency brings plugin in some other way, naming the importer.
func TestNoGoPluginSupport(t *testing.T) {
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
	tags := strings.TrimSpace(string(m[1]))
	out, err := exec.Command("go", "list", "-tags", tags, "-deps", "-f", "{{.ImportPath}}:{{join .Imports \" \"}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var importers []string
	for _, line := range strings.Split(string(out), "\n") {
		pkg, imports, _ := strings.Cut(line, ":")
		if slices.Contains(strings.Fields(imports), "plugin") {
			importers = append(importers, pkg)
		}
	}
	if len(importers) > 0 {
		t.Errorf("built with -tags %s, bootstrap links Go plugin support, imported by %s", tags, strings.Join(importers, ", "))
	}
}
