package talos

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/homelab/bootstrap/internal/fsutil"
	"github.com/homelab/bootstrap/kube"
)

// KubeconfigFile is the kubeconfig's name inside the cluster directory.
const KubeconfigFile = "kubeconfig"

// CheckAPIServer connects to the API server named in kubeconfig with its
// credentials and returns the server's version: it proves the kubeconfig's
// CA, client certificate and address all work.
func CheckAPIServer(ctx context.Context, kubeconfig []byte, timeout time.Duration) (string, error) {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return "", fmt.Errorf("reading kubeconfig: %w", err)
	}
	cfg.Timeout = timeout
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return "", fmt.Errorf("building Kubernetes client: %w", err)
	}
	type result struct {
		v   string
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := dc.ServerVersion()
		if err != nil {
			ch <- result{err: err}
			return
		}
		ch <- result{v: v.GitVersion}
	}()
	select {
	case <-ctx.Done():
		return "", fmt.Errorf("reaching the Kubernetes API at %s: %w", cfg.Host, ctx.Err())
	case r := <-ch:
		if r.err != nil {
			return "", fmt.Errorf("reaching the Kubernetes API at %s: %w", cfg.Host, r.err)
		}
		return r.v, nil
	}
}

// KubeconfigCertExpiry is when the client certificate of kubeconfig's
// current context expires.
func KubeconfigCertExpiry(kubeconfig []byte) (time.Time, error) {
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return time.Time{}, fmt.Errorf("reading kubeconfig: %w", err)
	}
	kctx, ok := cfg.Contexts[cfg.CurrentContext]
	if !ok {
		return time.Time{}, errors.New("no current context")
	}
	ai, ok := cfg.AuthInfos[kctx.AuthInfo]
	if !ok || len(ai.ClientCertificateData) == 0 {
		return time.Time{}, fmt.Errorf("no client certificate in context %s", cfg.CurrentContext)
	}
	return CertExpiry(ai.ClientCertificateData)
}

// CertExpiry is when the PEM certificate expires.
func CertExpiry(pemBytes []byte) (time.Time, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		return time.Time{}, errors.New("client cert is not PEM")
	}
	crt, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return time.Time{}, err
	}
	return crt.NotAfter, nil
}

// MergeResult reports a merge into a user's config file.
type MergeResult struct {
	Path string
	// Backup is the copy made before changing Path ("" when unchanged or new).
	Backup  string
	Changed bool
}

// kubeClient is a Kubernetes client for the admin kubeconfig, with the
// product's request timeout and rate limits (kube.RESTConfigFrom). With
// client-go's defaults (5 requests a second, bursts of 10) the health
// wait's eight calls a poll queued behind the limiter once its burst was
// spent: about a second a poll, so a node that turned Ready was seen up
// to two polls late.
func kubeClient(kubeconfig []byte) (kubernetes.Interface, error) {
	cs, _, err := kube.ClientsetFrom(kubeconfig, "the fetched kubeconfig")
	return cs, err
}

// MergeTalosconfig merges the cluster's talosconfig into the file at path
// (usually ~/.talos/config): contexts of the same name are replaced, others
// kept, and the current context becomes the cluster's. The old file is
// backed up before it changes.
func MergeTalosconfig(path string, talosconfig []byte, now time.Time) (MergeResult, error) {
	return mergeTalosconfig(path, talosconfig, now, true)
}

// TalosconfigMergeNeeded reports whether MergeTalosconfig would change path.
func TalosconfigMergeNeeded(path string, talosconfig []byte) (bool, error) {
	r, err := mergeTalosconfig(path, talosconfig, time.Time{}, false)
	return r.Changed, err
}

func mergeTalosconfig(path string, talosconfig []byte, now time.Time, write bool) (MergeResult, error) {
	in, err := clientconfig.FromBytes(talosconfig)
	if err != nil {
		return MergeResult{}, fmt.Errorf("reading cluster talosconfig: %w", err)
	}
	existing, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return MergeResult{}, fmt.Errorf("reading %s: %w", path, err)
	}
	merged := &clientconfig.Config{Contexts: map[string]*clientconfig.Context{}}
	if len(existing) > 0 {
		if merged, err = clientconfig.FromBytes(existing); err != nil {
			return MergeResult{}, fmt.Errorf("reading %s: %w (fix or move it; nothing was changed)", path, err)
		}
		if merged.Contexts == nil {
			merged.Contexts = map[string]*clientconfig.Context{}
		}
	}
	for name, c := range in.Contexts {
		merged.Contexts[name] = c
	}
	if in.Context != "" {
		merged.Context = in.Context
	}
	out, err := merged.Bytes()
	if err != nil {
		return MergeResult{}, fmt.Errorf("encoding %s: %w", path, err)
	}
	return writeMerged(path, existing, out, now, write)
}

// MergeKubeconfig merges the cluster's kubeconfig into the file at path
// (usually ~/.kube/config): clusters, users and contexts of the same name
// are replaced, others kept, and the current context becomes the
// cluster's. The old file is backed up before it changes.
func MergeKubeconfig(path string, kubeconfig []byte, now time.Time) (MergeResult, error) {
	return mergeKubeconfig(path, kubeconfig, now, true)
}

// KubeconfigMergeNeeded reports whether MergeKubeconfig would change path.
func KubeconfigMergeNeeded(path string, kubeconfig []byte) (bool, error) {
	r, err := mergeKubeconfig(path, kubeconfig, time.Time{}, false)
	return r.Changed, err
}

func mergeKubeconfig(path string, kubeconfig []byte, now time.Time, write bool) (MergeResult, error) {
	in, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return MergeResult{}, fmt.Errorf("reading cluster kubeconfig: %w", err)
	}
	existing, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return MergeResult{}, fmt.Errorf("reading %s: %w", path, err)
	}
	merged := clientcmdapi.NewConfig()
	if len(existing) > 0 {
		if merged, err = clientcmd.Load(existing); err != nil {
			return MergeResult{}, fmt.Errorf("reading %s: %w (fix or move it; nothing was changed)", path, err)
		}
	}
	for k, v := range in.Clusters {
		merged.Clusters[k] = v
	}
	for k, v := range in.AuthInfos {
		merged.AuthInfos[k] = v
	}
	for k, v := range in.Contexts {
		merged.Contexts[k] = v
	}
	if in.CurrentContext != "" {
		merged.CurrentContext = in.CurrentContext
	}
	out, err := clientcmd.Write(*merged)
	if err != nil {
		return MergeResult{}, fmt.Errorf("encoding %s: %w", path, err)
	}
	return writeMerged(path, existing, out, now, write)
}

func writeMerged(path string, existing, out []byte, now time.Time, write bool) (MergeResult, error) {
	res := MergeResult{Path: path}
	if existing != nil && string(existing) == string(out) {
		return res, nil
	}
	if !write {
		res.Changed = true
		return res, nil
	}
	if existing != nil {
		b, err := fsutil.Backup(path, now)
		if err != nil {
			return res, fmt.Errorf("backing up %s: %w", path, err)
		}
		res.Backup = b
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return res, fmt.Errorf("creating %s: %w", filepath.Dir(path), err)
	}
	if err := fsutil.WriteAtomic(path, out, 0o600); err != nil {
		return res, fmt.Errorf("writing %s: %w", path, err)
	}
	res.Changed = true
	return res, nil
}
