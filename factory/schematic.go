// Package factory speaks to a Talos Image Factory: the schematic (which
// system extensions and kernel arguments an image carries), its ID computed
// here exactly as the factory computes it, the images built from it (the
// nocloud ISO a VM boots, the installer a node installs and upgrades with),
// and the factory's HTTP API (register a schematic, list the extensions a
// Talos version offers, fetch an ISO's checksum).
package factory

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	// The factory marshals with go.yaml.in/yaml/v4 (image-factory v1.5.0
	// go.mod pins a pseudo-version after v4.0.0-rc.6, which the module
	// proxy does not serve); v4.0.0-rc.4 is the one Talos machinery v1.13.3
	// already brings. The IDs below are checked against the factory's own
	// test vectors (schematic_test.go), so a marshal difference that
	// matters would fail TestIDMatchesTheFactory.
	yaml "go.yaml.in/yaml/v4"
)

// Schematic is the part of an Image Factory schematic this tool declares.
// Field names, order and omitempty follow the factory's Schematic type
// (pkg/schematic/schematic.go at image-factory v1.5.0): the ID is the hash
// of its YAML, so an extra, reordered or non-omitempty field would change
// every ID. The factory's other customizations (overlay, meta, secure boot,
// bootloader, disk image) are not declared here; each is omitempty there,
// so a schematic without them marshals the same.
type Schematic struct {
	Customization Customization `yaml:"customization"`
}

// Customization is the schematic's customization block.
type Customization struct {
	ExtraKernelArgs  []string         `yaml:"extraKernelArgs,omitempty"`
	SystemExtensions SystemExtensions `yaml:"systemExtensions,omitempty"`
}

// SystemExtensions lists the official extensions an image carries, by the
// names the factory lists them under (e.g. siderolabs/qemu-guest-agent);
// the factory picks the build matching the Talos version.
type SystemExtensions struct {
	OfficialExtensions []string `yaml:"officialExtensions,omitempty"`
}

// New is the schematic with these extensions and kernel arguments, in the
// order given: the factory hashes them as written, so reordering them
// makes another schematic.
func New(extensions, kernelArgs []string) Schematic {
	var s Schematic
	if len(extensions) > 0 {
		s.Customization.SystemExtensions.OfficialExtensions = append([]string(nil), extensions...)
	}
	if len(kernelArgs) > 0 {
		s.Customization.ExtraKernelArgs = append([]string(nil), kernelArgs...)
	}
	return s
}

// Marshal is the schematic's canonical YAML, what the factory hashes and
// what POST /schematics takes.
func (s Schematic) Marshal() ([]byte, error) {
	return yaml.Marshal(s)
}

// ID is the schematic's identifier: the hex SHA-256 of its canonical YAML
// (Schematic.ID in the factory's pkg/schematic).
func (s Schematic) ID() (string, error) {
	data, err := s.Marshal()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

// MustID is ID for schematics built by New, whose marshal cannot fail.
func (s Schematic) MustID() string {
	id, err := s.ID()
	if err != nil {
		panic(err)
	}
	return id
}

// Unmarshal reads a schematic as the factory does: unknown fields are an
// error (the factory's Unmarshal sets KnownFields), so a customization this
// type does not declare is refused rather than silently dropped from the ID.
func Unmarshal(data []byte) (Schematic, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var s Schematic
	if err := dec.Decode(&s); err != nil {
		return Schematic{}, fmt.Errorf("schematic: %w", err)
	}
	return s, nil
}

// Extensions are the schematic's official extensions.
func (s Schematic) Extensions() []string { return s.Customization.SystemExtensions.OfficialExtensions }

// Summary names what the schematic adds for a message:
// "siderolabs/i915, siderolabs/qemu-guest-agent; kernel args i915.enable_guc=3",
// or "no extensions".
func (s Schematic) Summary() string {
	what := strings.Join(s.Extensions(), ", ")
	if args := s.Customization.ExtraKernelArgs; len(args) > 0 {
		what = strings.TrimPrefix(what+"; kernel args "+strings.Join(args, " "), "; ")
	}
	if what == "" {
		return "no extensions"
	}
	return what
}

// SameImage reports whether two schematics build the same image content:
// the same official extensions in any order, and the same kernel
// arguments in the same order (a later argument can override an earlier
// one). The factory hashes the extensions as written (image-factory v1.5.0
// pkg/schematic/schematic.go ID, no sort), so a schematic made elsewhere
// — the factory's UI lists extensions in catalogue order — can carry what
// the config declares under another ID; rolling every node to swap one ID
// for the other would reboot the cluster for nothing.
func (s Schematic) SameImage(o Schematic) bool {
	set := func(v []string) []string {
		out := slices.Clone(v)
		slices.Sort(out)
		return slices.Compact(out)
	}
	return slices.Equal(set(s.Extensions()), set(o.Extensions())) &&
		slices.Equal(s.Customization.ExtraKernelArgs, o.Customization.ExtraKernelArgs)
}
