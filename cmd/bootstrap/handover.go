package main

import (
	"context"
	"time"

	"github.com/homelab/bootstrap/stages"
	"github.com/homelab/bootstrap/ui"
)

// HandoverCmd is `bootstrap handover`: print the Flux objects that take
// over the Helm releases the infra stage installed.
type HandoverCmd struct {
	Namespace string        `default:"flux-system" help:"Namespace of the HelmRepository and HelmRelease objects."`
	Interval  time.Duration `help:"Their reconcile interval (default: flux.interval)."`
}

// Run renders the objects to stdout; it changes nothing.
func (h *HandoverCmd) Run(ctx context.Context, a *App) error {
	cfg, log, err := a.configAndLog()
	if err != nil {
		return err
	}
	interval := h.Interval
	if interval <= 0 {
		interval = cfg.Flux.Interval.D()
	}
	env := &stages.Env{Config: cfg, Paths: cfg.Paths(), Out: a.Stdout, Now: a.Now, Log: log, UI: ui.NewReporter(log)}
	out, err := stages.HandoverManifest(ctx, env, h.Namespace, interval)
	if err != nil {
		return err
	}
	_, err = a.Stdout.Write(out)
	return err
}
