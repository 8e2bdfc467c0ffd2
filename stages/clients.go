package stages

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/homelab/bootstrap/kube"
	"github.com/homelab/bootstrap/proxmox"
	"github.com/homelab/bootstrap/talos"
)

// The run's clients are built lazily, on first use, and shared by every
// stage of the run (and by commands such as destroy): a stage that needs no
// Proxmox never asks for its token.

// client returns the memoised client under key, building it on first use.
// Stage files wrap it in typed accessors (see provision.go, talos.go).
func client[T any](e *Env, key string, build func() (T, error)) (T, error) {
	r := e.shared()
	r.clientsMu.Lock()
	defer r.clientsMu.Unlock()
	if r.clients == nil {
		r.clients = map[string]any{}
	}
	if c, ok := r.clients[key]; ok {
		return c.(T), nil
	}
	c, err := build()
	if err != nil {
		var zero T
		return zero, fmt.Errorf("connecting to %s: %w", key, err)
	}
	r.clients[key] = c
	return c, nil
}

// ProxmoxClient returns the run's Proxmox client, built on first use.
func ProxmoxClient(ctx context.Context, env *Env) (*proxmox.Client, error) {
	return client(env, "Proxmox", func() (*proxmox.Client, error) {
		p := env.Config.Proxmox
		secret, err := env.Config.ProxmoxTokenSecret()
		if err != nil {
			return nil, err
		}
		env.Secrets.Add(secret)
		return proxmox.New(ctx, proxmox.Options{
			URL: p.URL, Node: p.Node, TokenID: p.TokenID, TokenSecret: secret,
			Fingerprint: p.TLSFingerprint, CAFile: env.Config.Resolve(p.CAFile), Insecure: p.Insecure,
			Log: env.Log, TaskTimeout: p.TaskTimeout.D(), DownloadTimeout: max(p.TaskTimeout.D(), 30*time.Minute),
		})
	})
}

// talosOps is the run's Talos API client, built once per run from the
// cluster's talosconfig, with the config's timeouts.
func talosOps(env *Env, talosconfig []byte) (*talos.Ops, error) {
	return client(env, "the Talos API", func() (*talos.Ops, error) {
		t := env.Config.Cluster.Timeouts
		return talos.NewOps(talos.OpsOptions{
			Talosconfig: talosconfig,
			Context:     env.Config.Cluster.Name,
			SecretsPath: env.Paths.Secrets,
			Log:         env.Log,
			CallTimeout: t.Call.D(), InstallTimeout: t.Install.D(), RebootTimeout: t.Reboot.D(),
			BootstrapTimeout: t.Bootstrap.D(), HealthTimeout: t.Health.D(),
		})
	})
}

// savedTalosOps is the run's Talos API client from the talosconfig the
// talos stage wrote, for what runs after it (postcheck, backup).
func savedTalosOps(env *Env) (*talos.Ops, error) {
	tc, err := keptFiles(env).Read(env.Paths.Talosconfig)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no talosconfig at %s (run the talos stage first): %w", env.Paths.Talosconfig, fs.ErrNotExist)
	}
	if err != nil {
		return nil, err
	}
	return talosOps(env, tc)
}

// kubeconfig reads the cluster's admin kubeconfig as kept (opened in
// memory when it is age-encrypted); fs.ErrNotExist (wrapped) before the
// talos stage wrote one.
func kubeconfig(env *Env) ([]byte, error) {
	files := keptFiles(env)
	data, err := files.Read(env.Paths.Kubeconfig)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("kubeconfig %s: %w (run the talos stage first)", files.Path(env.Paths.Kubeconfig), fs.ErrNotExist)
	}
	return data, err
}

// kubeRESTConfig is the client configuration from the cluster's kubeconfig.
func kubeRESTConfig(env *Env) (*rest.Config, error) {
	data, err := kubeconfig(env)
	if err != nil {
		return nil, err
	}
	return kube.RESTConfigFrom(data, env.Paths.Kubeconfig)
}

// kubeClient is a typed client from the cluster's kubeconfig.
func kubeClient(env *Env) (*kubernetes.Clientset, *rest.Config, error) {
	data, err := kubeconfig(env)
	if err != nil {
		return nil, nil, err
	}
	return kube.ClientsetFrom(data, env.Paths.Kubeconfig)
}
