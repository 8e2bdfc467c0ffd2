package talos

import (
	"context"
	"slices"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"

	"github.com/homelab/bootstrap/factory"
)

// Extension is a system extension a node runs, by its manifest's name and
// version (ExtensionStatus, `talosctl get extensions`).
type Extension struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// Extensions lists the system extensions the node runs: its
// ExtensionStatus resources, which machined writes once at boot from the
// installed image's extensions
// (internal/app/machined/pkg/controllers/runtime/extension_status.go at
// v1.13.3).
//
// A connection refused or cut (a node's API restarting, a flaky link) is
// retried with backoff: one drop must not fail a stage.
func (o *Ops) Extensions(ctx context.Context, ip string) ([]Extension, error) {
	var out []Extension
	err := o.callRetrying(ctx, ip, "reading the extensions of "+ip, func(ctx context.Context, c *client.Client) error {
		list, err := safe.StateListAll[*runtime.ExtensionStatus](ctx, c.COSI)
		if err != nil {
			return err
		}
		out = out[:0]
		for r := range list.All() {
			m := r.TypedSpec().Metadata
			out = append(out, Extension{Name: m.Name, Version: m.Version})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b Extension) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out, nil
}

// SchematicOf is the schematic ID a node was installed from, read from
// the factory's virtual extension; "" for an image the factory did not
// build (ghcr.io/siderolabs/installer).
func SchematicOf(exts []Extension) string {
	for _, e := range exts {
		if e.Name == factory.SchematicExtension {
			return e.Version
		}
	}
	return ""
}

// Schematic reads the schematic ID the node runs (see SchematicOf).
func (o *Ops) Schematic(ctx context.Context, ip string) (string, error) {
	exts, err := o.Extensions(ctx, ip)
	if err != nil {
		return "", err
	}
	return SchematicOf(exts), nil
}
