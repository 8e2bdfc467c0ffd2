package talos

import (
	"context"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
)

// Security is what a node says of its boot and its system volumes.
type Security struct {
	// SecureBoot is SecurityState's secureBoot: the firmware enforces
	// Secure Boot and is not in setup mode (machined's
	// SecurityStateController, internal/app/machined/pkg/controllers/
	// runtime/security_state.go at v1.13.3).
	SecureBoot bool
	// Volumes is the encryption provider of STATE and EPHEMERAL as their
	// VolumeStatus gives it ("luks2", "none"; "" when the volume has no
	// status), and Errors a volume's error message, by volume name.
	Volumes, Errors map[string]string
}

// Security reads the node's SecurityState (runtime namespace, ID
// securitystate) and the VolumeStatus of STATE and EPHEMERAL (block
// namespace "runtime"), as talosctl get securitystate and get
// volumestatus do.
func (o *Ops) Security(ctx context.Context, ip string) (Security, error) {
	out := Security{Volumes: map[string]string{}, Errors: map[string]string{}}
	err := o.callRetrying(ctx, ip, "reading the security state of "+ip, func(ctx context.Context, c *client.Client) error {
		ss, err := safe.StateGetByID[*runtime.SecurityState](ctx, c.COSI, runtime.SecurityStateID)
		if err != nil {
			return err
		}
		out.SecureBoot = ss.TypedSpec().SecureBoot
		for _, name := range []string{"STATE", "EPHEMERAL"} {
			vs, err := safe.StateGetByID[*block.VolumeStatus](ctx, c.COSI, name)
			switch {
			case state.IsNotFoundError(err):
				out.Volumes[name] = ""
			case err != nil:
				return err
			default:
				out.Volumes[name] = vs.TypedSpec().EncryptionProvider.String()
				out.Errors[name] = vs.TypedSpec().ErrorMessage
			}
		}
		return nil
	})
	return out, err
}
