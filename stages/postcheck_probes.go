package stages

import (
	"context"

	"github.com/homelab/bootstrap/postcheck"
)

// postcheckTalosProbe returns what the Talos checks call, or nil when this
// build has no Talos client wired (the checks then warn "not checked").
func (e *Env) postcheckTalosProbe(ctx context.Context) postcheck.TalosProbe { return nil }

// postcheckVMProbe returns what the Proxmox VM check calls, or nil when no
// Proxmox client is available (the check then warns "not checked").
func (e *Env) postcheckVMProbe(ctx context.Context) postcheck.VMProbe { return nil }
