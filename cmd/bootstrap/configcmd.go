package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/internal/fsutil"
)

// ConfigCmd groups the config file commands.
type ConfigCmd struct {
	Init     ConfigInitCmd     `cmd:"" help:"Write a complete, commented example config."`
	Validate ConfigValidateCmd `cmd:"" help:"Check the config file; exit 2 with every problem listed."`
	Schema   ConfigSchemaCmd   `cmd:"" help:"Print a JSON Schema of the config (for editor completion)."`
	Render   ConfigRenderCmd   `cmd:"" help:"Print the config as the tool reads it: every base it extends merged in (extends:), before defaults and environment overrides."`
}

// ConfigInitCmd is `bootstrap config init`.
type ConfigInitCmd struct {
	Output string `short:"o" help:"Where to write the example (default: the --config path)." placeholder:"FILE"`
	Force  bool   `help:"Overwrite an existing file (a backup is kept)."`
}

// Run writes the example config.
func (c *ConfigInitCmd) Run(a *App) error {
	path := c.Output
	if path == "" {
		path = a.cli.Config
	}
	if c.Force {
		bak, err := fsutil.Backup(path, a.now())
		if err != nil {
			return err
		}
		if bak != "" {
			fmt.Fprintf(a.Stderr, "backed up %s to %s\n", path, bak)
		}
		if err := fsutil.WriteAtomic(path, config.Example, 0o644); err != nil {
			return err
		}
	} else if err := fsutil.WriteNew(path, config.Example, 0o644); err != nil {
		return config.Userf("%s already exists: keep it, pass --output elsewhere, or --force to replace it (a backup is kept)", path)
	}
	fmt.Fprintf(a.Stdout, "wrote %s: edit the cluster, proxmox, nodes, storage and flux sections, then run `bootstrap config validate --config %s`\n", path, path)
	return nil
}

// ConfigValidateCmd is `bootstrap config validate`.
type ConfigValidateCmd struct{}

// Run validates the config and lists warnings.
func (c *ConfigValidateCmd) Run(ctx context.Context, a *App) error {
	cfg, err := a.loadConfig()
	if err != nil {
		return err
	}
	for _, w := range cfg.Warnings() {
		fmt.Fprintln(a.Stderr, w.Error())
	}
	from := ""
	if files := cfg.Files(); len(files) > 1 {
		from = " (merged from " + strings.Join(files, " ← ") + ")"
	}
	with := ""
	if n := len(cfg.Warnings()); n > 0 {
		with = fmt.Sprintf(", with %d warning(s) above", n)
	}
	fmt.Fprintf(a.Stdout, "%s is valid%s%s: cluster %s, %d control plane(s), %d worker(s)\n", cfg.File(), from, with, cfg.Cluster.Name, len(cfg.ControlPlanes()), len(cfg.Workers()))
	return nil
}

// ConfigRenderCmd is `bootstrap config render`.
type ConfigRenderCmd struct{}

// Run validates the config (a merged config that does not validate is
// not printed as if it were usable) and prints the merged document.
func (c *ConfigRenderCmd) Run(ctx context.Context, a *App) error {
	cfg, err := a.loadConfig()
	if err != nil {
		return err
	}
	b, err := cfg.Render()
	if err != nil {
		return err
	}
	_, err = a.Stdout.Write(b)
	return err
}

// ConfigSchemaCmd is `bootstrap config schema`.
type ConfigSchemaCmd struct{}

// Run prints the JSON Schema.
func (c *ConfigSchemaCmd) Run(a *App) error {
	b, err := config.Schema()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(a.Stdout, string(b))
	return err
}
