package stages

import (
	"context"
	"errors"
	"fmt"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/proxmox"
)

// bootInput is what proxmox.boot asks, with the factory's disk image of
// the schematic for cluster.talosVersion.
func bootInput(cfg *config.Config) proxmox.BootInput {
	im := cfg.Images()
	return proxmox.BootInput{
		Want:       cfg.Proxmox.Boot,
		Image:      proxmox.ISOSource{Filename: im.DiskImageFile, URL: im.DiskImageURL},
		Unknown:    "proxmox.iso.url names an ISO of its own, whose disk image is not known",
		ISOStorage: cfg.Proxmox.ISOStorage,
	}
}

// bootDecision is the run's boot choice, once made.
type bootDecision struct {
	choice  proxmox.BootChoice
	refusal error
}

// setBoot keeps the boot choice the precheck's boot row made, for the
// provision stage of the same run.
func (e *Env) setBoot(choice proxmox.BootChoice, refusal error) {
	r := e.shared()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.boot = &bootDecision{choice: choice, refusal: refusal}
}

// chooseBoot is the run's boot choice for VMs created on hosts: the
// precheck's when it made one, else made now. refusal is a
// *proxmox.BootRefusedError (proxmox.boot image on a host that cannot).
func chooseBoot(ctx context.Context, env *Env, c *proxmox.Client, hosts []string) (choice proxmox.BootChoice, refusal, err error) {
	r := env.shared()
	r.mu.Lock()
	d := r.boot
	r.mu.Unlock()
	if d == nil {
		choice, err = c.ChooseBoot(ctx, bootInput(env.Config), hosts)
		var refused *proxmox.BootRefusedError
		if errors.As(err, &refused) {
			refusal, err = err, nil
		}
		if err != nil {
			return choice, nil, fmt.Errorf("choosing how new VMs boot: %w", err)
		}
		env.setBoot(choice, refusal)
		d = &bootDecision{choice: choice, refusal: refusal}
	}
	if d.refusal == nil && d.choice.Mode != proxmox.BootNone {
		env.UI.OK("new VMs boot %s", d.choice.Reason)
	}
	return d.choice, d.refusal, nil
}

// ensureBootFile makes the file the choice boots new VMs from present:
// the disk image on the members that create a VM (creating), the ISO on
// every member in hosts, where VMs installed from it keep it in their
// cdrom drive; nothing when no VM is created.
func ensureBootFile(ctx context.Context, env *Env, c *proxmox.Client, hosts, creating []string, choice proxmox.BootChoice) error {
	switch choice.Mode {
	case proxmox.BootNone:
		return nil
	case proxmox.BootImage:
		return ensureFiles(ctx, env, c, creating, imageFile(choice.Image))
	}
	return ensureFiles(ctx, env, c, hosts, isoFile(env.Config))
}

// bootWhat names what the VMs boot: "disk image" or "ISO".
func bootWhat(choice proxmox.BootChoice) string {
	if choice.Mode == proxmox.BootImage {
		return "disk image"
	}
	return "ISO"
}
