// Command bootstrap-lab runs a homelab without hardware for rehearsals and
// tests: simulated Proxmox and Talos, a real Kubernetes control plane, the
// real Flux controllers, an NFS server and a Helm repository, with a
// bootstrap.yaml that points the bootstrap command at them. It is a separate
// binary so that the bootstrap command users install carries none of it.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kong"
	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/ui"
)

// CLI is the command line of bootstrap-lab.
type CLI struct {
	LogFormat string `default:"auto" enum:"auto,console,json" help:"Log format on stderr: auto (console on a terminal, JSON otherwise), console, json."`
	LogLevel  string `default:"info" enum:"debug,info,warn,error" help:"Minimum level on stderr."`

	Up     LabUpCmd     `cmd:"" help:"Start a lab: simulated Proxmox and Talos, a real Kubernetes control plane, Flux, NFS and Helm, and write its config."`
	Down   LabDownCmd   `cmd:"" help:"Stop a lab started with --detach (and the git snapshot server of its cluster)."`
	Status LabStatusCmd `cmd:"" help:"Show whether a lab runs and where its services are."`
}

// App holds what the commands need from the process.
type App struct {
	Stdout, Stderr io.Writer
	cli            CLI
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a := &App{Stdout: os.Stdout, Stderr: os.Stderr}
	parser := kong.Must(&a.cli,
		kong.Name("bootstrap-lab"),
		kong.Description("A homelab without hardware: rehearse the whole bootstrap pipeline on this machine."),
		kong.UsageOnError(),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		kong.Writers(a.Stdout, a.Stderr),
		kong.Vars{"labdir": defaultDir},
	)
	kctx, err := parser.Parse(os.Args[1:])
	if err != nil {
		fmt.Fprintln(a.Stderr, "bootstrap-lab:", err)
		os.Exit(2)
	}
	kctx.BindTo(ctx, (*context.Context)(nil))
	if err := kctx.Run(a); err != nil {
		fmt.Fprintln(a.Stderr, "bootstrap-lab:", err)
		if config.IsUserError(err) || errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

// logger builds the process logger from the global flags.
func (a *App) logger() (zerolog.Logger, error) {
	log, err := ui.NewLogger(ui.Options{Format: a.cli.LogFormat, Level: a.cli.LogLevel, Out: a.Stderr, Redact: &redact.Set{}})
	if err != nil {
		return log, config.Userf("%v", err)
	}
	return log, nil
}
