package stages

import (
	"context"
	"net"
	"time"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/flux"
	"github.com/homelab/bootstrap/gitsnap"
)

// gitChecks prove the git source Flux will pull from: a local snapshot
// builds and its address can be served, or the remote lists the branch.
func gitChecks(env *Env) []check.Check {
	f := env.Config.Flux
	if f.LocalSnapshot.Enabled {
		ls := f.LocalSnapshot
		return []check.Check{
			{Name: "git snapshot", Run: func(ctx context.Context) (check.Status, string) {
				snap, err := gitsnap.Build(ctx, gitsnap.BuildOptions{Dir: env.Config.Resolve(ls.Source), Branch: f.Branch, Excludes: ls.Exclude})
				if err != nil {
					return check.Failf("snapshot of %s: %v", ls.Source, err)
				}
				return check.Passf("%s: %d files, commit %s, %d excluded (never served: .talos/, ai/state/, kubeconfigs, secrets)", ls.Source, snap.Files, short(snap.Hash.String()), snap.Excluded.Total())
			}},
			{Name: "git snapshot address", Run: func(ctx context.Context) (check.Status, string) {
				if st, err := gitsnap.Check(ctx, env.Paths.StateDir); err == nil && st.State != nil && st.Alive && st.ProbeError == nil {
					return check.Passf("already served by bootstrap's snapshot server (pid %d) at %s", st.State.PID, st.State.URL)
				}
				l, err := net.Listen("tcp", ls.Listen)
				if err != nil {
					return check.Failf("cannot listen on %s: %v (another process holds it, or the address is not on this host)", ls.Listen, err)
				}
				l.Close()
				return check.Passf("%s free; the cluster will clone %s", ls.Listen, ls.URL)
			}},
		}
	}
	return []check.Check{{Name: "git remote", Run: func(ctx context.Context) (check.Status, string) {
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		cr, _, err := fluxCredentials(env)
		if err != nil {
			return check.Failf("%v", err)
		}
		head, err := flux.RemoteBranchHead(ctx, f.Repo, f.Branch, cr, env.Config.Resolve(f.Auth.KnownHostsFile))
		if err != nil {
			return check.Failf("%v", err)
		}
		return check.Passf("%s branch %s at %s", f.Repo, f.Branch, short(head))
	}}}
}
