package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/homelab/bootstrap/stages"
)

// TalosconfigCmd is `bootstrap talosconfig`.
type TalosconfigCmd struct{}

// Run prints the cluster's talosconfig.
func (TalosconfigCmd) Run(_ context.Context, a *App) error {
	cfg, err := a.loadConfig()
	if err != nil {
		return err
	}
	return a.printKept(stages.KeptFiles(cfg).Read, cfg.Paths().Talosconfig, "talosconfig")
}

// KubeconfigCmd is `bootstrap kubeconfig`.
type KubeconfigCmd struct{}

// Run prints the cluster's admin kubeconfig.
func (KubeconfigCmd) Run(_ context.Context, a *App) error {
	cfg, err := a.loadConfig()
	if err != nil {
		return err
	}
	return a.printKept(stages.KeptFiles(cfg).Read, cfg.Paths().Kubeconfig, "kubeconfig")
}

// printKept writes a file the talos stage keeps to stdout, opened in
// memory when it is kept age-encrypted (secrets.age.recipients): the
// plaintext goes only where the user sends it.
func (a *App) printKept(read func(string) ([]byte, error), path, what string) error {
	data, err := read(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no %s for this cluster yet (%v): the talos stage writes it", what, err)
	}
	if err != nil {
		return err
	}
	_, err = a.Stdout.Write(data)
	return err
}
