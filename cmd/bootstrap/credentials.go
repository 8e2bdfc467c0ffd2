package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/stages"
)

// TalosconfigCmd is `bootstrap talosconfig`.
type TalosconfigCmd struct{}

// Run prints the cluster's talosconfig.
func (TalosconfigCmd) Run(_ context.Context, a *App) error {
	return a.printKept("talosconfig", func(p config.Paths) string { return p.Talosconfig })
}

// KubeconfigCmd is `bootstrap kubeconfig`.
type KubeconfigCmd struct{}

// Run prints the cluster's admin kubeconfig.
func (KubeconfigCmd) Run(_ context.Context, a *App) error {
	return a.printKept("kubeconfig", func(p config.Paths) string { return p.Kubeconfig })
}

// printKept writes a file the talos stage keeps (path gives it) to
// stdout, opened in memory when it is kept age-encrypted
// (secrets.age.recipients): the plaintext goes only where the user sends
// it.
func (a *App) printKept(what string, path func(config.Paths) string) error {
	cfg, err := a.loadConfig()
	if err != nil {
		return err
	}
	data, err := stages.KeptFiles(cfg).Read(path(cfg.Paths()))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no %s for this cluster yet (%v): the talos stage writes it", what, err)
	}
	if err != nil {
		return err
	}
	_, err = a.Stdout.Write(data)
	return err
}
