package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/homelab/bootstrap/gitsnap"
	"github.com/homelab/bootstrap/internal/redact"
)

// GitsnapCmd groups the local git snapshot server commands.
type GitsnapCmd struct {
	Serve  GitsnapServeCmd  `cmd:"" help:"Serve a read-only git snapshot of a work tree over smart HTTP, in the foreground (for a systemd unit)."`
	Stop   GitsnapStopCmd   `cmd:"" help:"Stop the snapshot server the flux stage started for this cluster."`
	Status GitsnapStatusCmd `cmd:"" help:"Show the cluster's snapshot server: alive, answering, which snapshot it serves."`
}

// GitsnapServeCmd is `bootstrap gitsnap serve`. It needs no config file:
// every setting is a flag, so a systemd unit can run it on its own.
type GitsnapServeCmd struct {
	gitsnap.ServeFlags `embed:""`
}

// Run serves until SIGTERM/SIGINT; SIGHUP re-snapshots.
func (c *GitsnapServeCmd) Run(ctx context.Context, a *App) error {
	log, err := a.logger(nil, &redact.Set{}, nil)
	if err != nil {
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	return gitsnap.Serve(ctx, c.ServeFlags, log, hup)
}

// GitsnapStopCmd is `bootstrap gitsnap stop`.
type GitsnapStopCmd struct {
	Grace time.Duration `default:"10s" help:"How long to wait after SIGTERM before SIGKILL."`
}

// Run stops the recorded server.
func (c *GitsnapStopCmd) Run(ctx context.Context, a *App) error {
	cfg, log, err := a.configAndLog()
	if err != nil {
		return err
	}
	stopped, err := gitsnap.Stop(ctx, cfg.Paths().StateDir, c.Grace, log)
	if err != nil {
		return err
	}
	if stopped {
		fmt.Fprintln(a.Stdout, "snapshot server stopped")
	} else {
		fmt.Fprintln(a.Stdout, "no snapshot server was running for this cluster")
	}
	return nil
}

// standaloneNote says a recorded server was started outside bootstrap.
func standaloneNote(st *gitsnap.State) string {
	if st.Standalone {
		return " (standalone: started outside bootstrap with --state-dir)"
	}
	return ""
}

// GitsnapStatusCmd is `bootstrap gitsnap status`.
type GitsnapStatusCmd struct{}

// Run prints the recorded server's status.
func (c *GitsnapStatusCmd) Run(ctx context.Context, a *App) error {
	cfg, err := a.loadConfig()
	if err != nil {
		return err
	}
	st, err := gitsnap.Check(ctx, cfg.Paths().StateDir)
	if err != nil {
		return err
	}
	if st.State == nil {
		fmt.Fprintln(a.Stdout, "no snapshot server recorded for this cluster")
		return nil
	}
	fmt.Fprintf(a.Stdout, "pid %d alive=%v url %s listen %s%s\n", st.State.PID, st.Alive, st.State.URL, st.State.Listen, standaloneNote(st.State))
	if st.State.Hash != "" {
		fmt.Fprintf(a.Stdout, "recorded snapshot %s\n", st.State.Hash)
	} else {
		fmt.Fprintln(a.Stdout, "recorded snapshot: none yet (the server was starting)")
	}
	for _, w := range st.State.Withheld {
		fmt.Fprintf(a.Stdout, "withheld %s\n", w)
	}
	if st.ProbeError != nil {
		fmt.Fprintf(a.Stdout, "not answering: %v\n", st.ProbeError)
	} else {
		fmt.Fprintf(a.Stdout, "serving %s (pid %d)\n", st.ServedHash, st.ServedByPID)
	}
	return nil
}
