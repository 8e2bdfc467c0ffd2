// Package gitsnaptest lets a test binary stand in for `bootstrap gitsnap
// serve`. Stages start the git snapshot server by re-running their own
// executable with `gitsnap serve …`; inside `go test` that executable is the
// test binary, whose TestMain calls ServeIfChild first.
package gitsnaptest

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kong"
	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/gitsnap"
)

// ServeIfChild serves and exits when the process was started as
// `<binary> gitsnap serve <flags>`; otherwise it returns at once.
func ServeIfChild() {
	if len(os.Args) < 3 || os.Args[1] != "gitsnap" || os.Args[2] != "serve" {
		return
	}
	os.Exit(serve(os.Args[1:]))
}

func serve(args []string) int {
	var cli struct {
		Gitsnap struct {
			Serve gitsnap.ServeFlags `cmd:""`
		} `cmd:""`
	}
	parser, err := kong.New(&cli, kong.Name("bootstrap"), kong.Exit(os.Exit))
	if err == nil {
		_, err = parser.Parse(args)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	log := zerolog.New(os.Stderr).With().Timestamp().Logger()
	if err := gitsnap.Serve(ctx, cli.Gitsnap.Serve, log, hup); err != nil {
		log.Error().Err(err).Msg("gitsnap serve failed")
		return 1
	}
	return 0
}
