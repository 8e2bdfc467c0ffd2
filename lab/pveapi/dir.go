// Package pveapi reads Proxmox VE's own published API schema (the dump
// pve-docs builds for its API viewer, api-viewer/apidata.js, one per
// release) and judges requests and answers by it the way PVE's REST layer
// does: find the method for a path (pve-common src/PVE/RESTHandler.pm
// find_handler), check the declared permissions (pve-access-control
// src/PVE/RPCEnvironment.pm check_api2_permissions), validate the
// parameters (pve-common src/PVE/JSONSchema.pm validate, check_prop,
// parse_property_string and the named formats) and the result (the same,
// with "Result verification failed").
//
// The schema files are test data that stay outside the project: they are
// read from the directory BOOTSTRAP_PVE_API_DIR names, else from
// ../shared/pve-api beside the repository, else /work/shared/pve-api. They
// are never copied into the project.
package pveapi

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// DirEnv names the directory holding pve-<major>.<minor>.json.
const DirEnv = "BOOTSTRAP_PVE_API_DIR"

// Provenance says where the schema files come from, for skip and error
// messages.
const Provenance = "Proxmox VE's API schema per release (pve-docs' api-viewer/apidata.js at the commits listed in that directory's README, " +
	"the \"const apiSchema = \" wrapper removed), as pve-8.2.json … pve-9.1.json in ../shared/pve-api beside the repository or in $" + DirEnv

// ErrNoSchema is returned when no schema directory is found.
var ErrNoSchema = errors.New("no Proxmox VE API schema directory")

// Dir finds the schema directory. explicit says the environment named it
// or requires it: then a missing directory is an error the caller must not
// skip over. BOOTSTRAP_REQUIRE_LAB=1 (make test) asks for it as well: a suite that
// must run against the whole lab does not run its Proxmox requests
// unjudged and its schema tests skipped.
func Dir() (dir string, explicit bool, err error) {
	if d := os.Getenv(DirEnv); d != "" {
		if !hasSchemas(d) {
			return "", true, fmt.Errorf("%s=%s holds no pve-*.json: %w (%s)", DirEnv, d, ErrNoSchema, Provenance)
		}
		return d, true, nil
	}
	for _, d := range candidates() {
		if hasSchemas(d) {
			return d, false, nil
		}
	}
	err = fmt.Errorf("%w: looked in %s (%s)", ErrNoSchema, strings.Join(candidates(), ", "), Provenance)
	if os.Getenv(requireLabEnv) == "1" {
		return "", true, fmt.Errorf("%s=1 needs the API schema to judge every request pvesim answers: %w", requireLabEnv, err)
	}
	return "", false, err
}

// requireLabEnv is set to 1 by make test: every lab component, the
// schema files among them, must be there.
const requireLabEnv = "BOOTSTRAP_REQUIRE_LAB"

// sharedDir is where this setup keeps the schema files for every
// worktree (a variable so a test can point it elsewhere).
var sharedDir = "/work/shared/pve-api"

// candidates are <repo>/../shared/pve-api for the repository holding the
// working directory, then /work/shared/pve-api (where this setup keeps it
// for every worktree).
func candidates() []string {
	var out []string
	if root := repoRoot(); root != "" {
		out = append(out, filepath.Join(filepath.Dir(root), "shared", "pve-api"))
	}
	return append(out, sharedDir)
}

// repoRoot walks up from the working directory to this module's go.mod.
func repoRoot() string {
	d, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/homelab/bootstrap\n") {
			return d
		}
		parent := filepath.Dir(d)
		if parent == d {
			return ""
		}
		d = parent
	}
}

func hasSchemas(d string) bool {
	m, _ := filepath.Glob(filepath.Join(d, "pve-*.json"))
	return len(m) > 0
}
