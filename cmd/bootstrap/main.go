// Command bootstrap takes a bare Proxmox host to a healthy Talos Kubernetes
// cluster managed by Flux, in resumable stages, and proves it nightly.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// A second Ctrl-C exits at once; the stage is already recorded as
		// running, so `run --resume` still finds it.
		<-ctx.Done()
		stop()
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		<-sig
		os.Exit(130)
	}()
	app := &App{Stdout: os.Stdout, Stderr: os.Stderr, Stdin: os.Stdin, LookupEnv: os.LookupEnv, Stages: registeredStages}
	os.Exit(app.Main(ctx, os.Args[1:]))
}
