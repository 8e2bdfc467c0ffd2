package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/proxmox"
	"github.com/homelab/bootstrap/stages"
)

// DestroyCmd is `bootstrap destroy`.
type DestroyCmd struct {
	Yes          bool `help:"Do not ask for confirmation."`
	PurgeSecrets bool `help:"Also delete the cluster's Talos directory (secrets bundle, talosconfig)."`
	DryRun       bool `help:"List what would be deleted; change nothing."`
}

// Run deletes the cluster's VMs under the cluster lock, logging to a run log.
func (d *DestroyCmd) Run(ctx context.Context, a *App) error {
	cfg, err := a.loadConfig()
	if err != nil {
		return err
	}
	env, sess, err := a.commandEnv(cfg, d.DryRun)
	if err != nil {
		return err
	}
	opts := destroyOptions{Yes: d.Yes, PurgeSecrets: d.PurgeSecrets, In: a.Stdin}
	if sess == nil {
		return destroy(ctx, env, opts)
	}
	defer sess.Close()
	log, logPath := sess.Log, sess.LogPath
	log.Info().Str("version", version).Str("config", cfg.File()).Str("log", logPath).Msg("destroy started")
	if err := destroy(ctx, env, opts); err != nil {
		log.Error().Err(err).Str("log", logPath).Msg("destroy stopped; full log in " + logPath)
		return err
	}
	log.Info().Int("changes", len(env.Changes())).Msg("destroy finished")
	return nil
}

// destroyOptions are the switches of `bootstrap destroy`.
type destroyOptions struct {
	// Yes skips the confirmation prompt.
	Yes bool
	// PurgeSecrets also deletes the cluster's Talos directory (secrets
	// bundle, talosconfig, generated configs); by default it is kept so a
	// recreated cluster keeps its identity.
	PurgeSecrets bool
	// In answers the confirmation prompt (the terminal).
	In io.Reader
}

// errAborted means the user did not confirm a destroy or a removal.
var errAborted = errors.New("aborted: nothing was changed")

// destroy stops and deletes the VMs tagged as this cluster's (and only
// those: each VM's tag is checked again right before it is deleted), after
// the user confirms by typing the cluster name unless o.Yes. In a dry run it
// lists what it would delete. The node facts of deleted VMs are removed
// from the state.
func destroy(ctx context.Context, env *stages.Env, o destroyOptions) error {
	cluster := env.Config.Cluster.Name
	c, err := stages.ProxmoxClient(ctx, env)
	if err != nil {
		return err
	}
	vms, err := c.FindClusterVMs(ctx, cluster)
	if err != nil {
		return err
	}
	if specs, err := stages.VMSpecs(env.Config); err == nil {
		all, err := c.ListVMs(ctx)
		if err != nil {
			return err
		}
		for _, s := range specs {
			for _, v := range all {
				if v.VMID == s.VMID && (v.Type != "qemu" || !v.HasTag(proxmox.ClusterTag(cluster))) {
					kind := "VM"
					if v.Type == "lxc" {
						kind = "CT"
					}
					env.UI.Warn("%s %d (%s) has node %s's VMID but no tag %s: left alone", kind, v.VMID, v.Name, s.Name, proxmox.ClusterTag(cluster))
				}
			}
		}
	}

	// The HA rule that keeps the control planes apart (PVE 9) goes first,
	// so the VMs leaving HA one by one never leave it below two resources.
	ruleID, rule, err := c.FindSeparationRule(ctx, cluster)
	if proxmox.IsForbidden(err) {
		env.UI.Warn("cannot read the HA rules (it needs Sys.Audit on /): HA rule %s, if there is one, is left; delete it under Datacenter → HA → Affinity Rules", ruleID)
	} else if err != nil {
		return err
	}

	var b strings.Builder
	if len(vms) == 0 {
		fmt.Fprintf(&b, "No VMs on %s carry the tag %s.\n", env.Config.Proxmox.Node, proxmox.ClusterTag(cluster))
	} else {
		fmt.Fprintf(&b, "These VMs of cluster %s will be stopped and deleted with their disks:\n", cluster)
		for _, v := range vms {
			fmt.Fprintf(&b, "  %d  %-20s %-8s tags %s\n", v.VMID, v.Name, v.Status, strings.Join(v.Tags, ";"))
		}
	}
	if rule {
		fmt.Fprintf(&b, "The HA rule %s, which keeps the control planes on separate members, will be deleted.\n", ruleID)
	}
	if o.PurgeSecrets {
		fmt.Fprintf(&b, "The Talos directory %s (secrets bundle, talosconfig) will be deleted.\n", env.Paths.TalosDir)
	} else {
		fmt.Fprintf(&b, "The Talos directory %s (secrets) is kept; --purge-secrets deletes it.\n", env.Paths.TalosDir)
	}
	fmt.Fprint(env.Out, b.String())
	if len(vms) == 0 && !o.PurgeSecrets && !rule {
		return nil
	}

	if !env.DryRun && !o.Yes {
		ok, err := confirm(env.Out, o.In, fmt.Sprintf("Type the cluster name (%s) to confirm: ", cluster), cluster)
		if err != nil {
			return err
		}
		if !ok {
			return errAborted
		}
	}

	if rule {
		if err := env.Wet("delete HA rule "+ruleID, func() error { return c.DeleteHARule(ctx, ruleID) }); err != nil {
			return err
		}
	}
	par := env.Config.Proxmox.Parallelism
	if par < 1 {
		par = 1
	}
	sem := make(chan struct{}, par)
	errs := make([]error, len(vms))
	var wg sync.WaitGroup
	for i, v := range vms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = env.Wet(fmt.Sprintf("stop and delete VM %d %s", v.VMID, v.Name), func() error {
				if err := c.DestroyClusterVM(ctx, cluster, v); err != nil {
					return err
				}
				env.ForgetVM(v.VMID)
				return nil
			})
		}()
	}
	wg.Wait()
	if err := env.SaveState(); err != nil {
		errs = append(errs, fmt.Errorf("writing state: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if o.PurgeSecrets {
		return env.Wet("delete "+env.Paths.TalosDir, func() error { return os.RemoveAll(env.Paths.TalosDir) })
	}
	return nil
}

// confirm asks question on out and reads one line from in.
func confirm(out io.Writer, in io.Reader, question, want string) (bool, error) {
	if in == nil {
		return false, config.Userf("this needs confirmation: run it on a terminal or pass --yes")
	}
	fmt.Fprint(out, question)
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	if line == "" && errors.Is(err, io.EOF) {
		return false, config.Userf("this needs confirmation: no answer on standard input (pass --yes to skip it)")
	}
	return strings.TrimSpace(line) == want, nil
}
