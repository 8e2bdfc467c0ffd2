package factory

import "testing"

// The factory's own test vectors (pkg/schematic/schematic_test.go TestID,
// TestUnmarshalID at image-factory v1.5.0), and the qemu-guest-agent
// schematic factory.talos.dev answers POST /schematics with.
func TestIDMatchesTheFactory(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Schematic
		want string
	}{
		{"empty", New(nil, nil), "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba"},
		{"kernel args", New(nil, []string{"noapic", "nolapic"}), "9cba8e32753f91a16c1837ab8abf356af021706ef284aef07380780177d9a06c"},
		{"qemu-guest-agent", New([]string{"siderolabs/qemu-guest-agent"}, nil), "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515"},
	} {
		if got := tc.s.MustID(); got != tc.want {
			data, _ := tc.s.Marshal()
			t.Errorf("%s: ID %s, the factory says %s (YAML %q)", tc.name, got, tc.want, data)
		}
	}
}

func TestUnmarshalIDMatchesTheFactory(t *testing.T) {
	for in, want := range map[string]string{
		`{}`:                                     "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba",
		`customization: {}`:                      "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba",
		`customization: {"extraKernelArgs": []}`: "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba",
		`{"customization": {"extraKernelArgs": ["noapic", "nolapic"], "systemExtensions": {}}}`: "9cba8e32753f91a16c1837ab8abf356af021706ef284aef07380780177d9a06c",
	} {
		s, err := Unmarshal([]byte(in))
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if got := s.MustID(); got != want {
			t.Errorf("%s: ID %s, want %s", in, got, want)
		}
	}
	if _, err := Unmarshal([]byte(`{"customization": {"kernelArgs": ["x"]}}`)); err == nil {
		t.Error("an unknown field was accepted")
	}
}

func TestOrderMatters(t *testing.T) {
	a := New([]string{"siderolabs/i915", "siderolabs/intel-ucode"}, nil).MustID()
	b := New([]string{"siderolabs/intel-ucode", "siderolabs/i915"}, nil).MustID()
	if a == b {
		t.Error("reordered extensions gave the same ID; the factory hashes them as written")
	}
}

func TestSameImage(t *testing.T) {
	base := New([]string{"siderolabs/i915", "siderolabs/intel-ucode"}, []string{"a=1", "b=2"})
	for _, tc := range []struct {
		name string
		o    Schematic
		want bool
	}{
		{"same", New([]string{"siderolabs/i915", "siderolabs/intel-ucode"}, []string{"a=1", "b=2"}), true},
		{"extensions reordered", New([]string{"siderolabs/intel-ucode", "siderolabs/i915"}, []string{"a=1", "b=2"}), true},
		{"one extension more", New([]string{"siderolabs/intel-ucode", "siderolabs/i915", "siderolabs/qemu-guest-agent"}, []string{"a=1", "b=2"}), false},
		{"kernel args reordered", New([]string{"siderolabs/i915", "siderolabs/intel-ucode"}, []string{"b=2", "a=1"}), false},
		{"no kernel args", New([]string{"siderolabs/i915", "siderolabs/intel-ucode"}, nil), false},
	} {
		if got := base.SameImage(tc.o); got != tc.want {
			t.Errorf("%s: SameImage = %v, want %v", tc.name, got, tc.want)
		}
	}
}
