package kube

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/homelab/bootstrap/internal/wait"
)

// FluxNamespace is where the Flux controllers run.
const FluxNamespace = "flux-system"

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// FluxControllers are the Flux controllers the lab builds from pinned
// sources and runs as processes, in the order they start.
var FluxControllers = []string{"source-controller", "kustomize-controller", "helm-controller"}

// fluxModule maps a lab Flux controller to its module path.
func fluxModule(controller string) string { return "github.com/fluxcd/" + controller }

// FluxModuleDir returns the source directory of a pinned Flux controller's
// module, whose config/ directory holds its CRDs, RBAC and Deployment.
func (b *Binaries) FluxModuleDir(ctx context.Context, controller string) (string, error) {
	return b.ModuleDir(ctx, fluxModule(controller))
}

// FluxVersion returns the pinned version of a Flux controller.
func (b *Binaries) FluxVersion(controller string) string {
	return b.Modules[fluxModule(controller)].Version
}

// Binaries returns the lab binaries this cluster runs.
func (c *Cluster) Binaries() *Binaries { return c.bins }

// StartFlux applies the Flux CRDs of the pinned controllers (server-side,
// waiting until they are Established), creates the flux-system namespace and
// runs FluxControllers against the lab API server until Stop. Start calls it
// when Options.Flux is set.
func (c *Cluster) StartFlux(ctx context.Context) error {
	var crdFiles []string
	for _, ctrl := range FluxControllers {
		d, err := c.bins.FluxModuleDir(ctx, ctrl)
		if err != nil {
			return fmt.Errorf("starting Flux: %w", err)
		}
		m, err := filepath.Glob(filepath.Join(d, "config", "crd", "bases", "*.yaml"))
		if err != nil || len(m) == 0 {
			return fmt.Errorf("starting Flux: no CRDs under %s/config/crd/bases", d)
		}
		crdFiles = append(crdFiles, m...)
	}
	sort.Strings(crdFiles)
	if err := c.ApplyCRDFiles(ctx, crdFiles); err != nil {
		return fmt.Errorf("starting Flux: %w", err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: FluxNamespace}}
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("starting Flux: creating namespace %s: %w", FluxNamespace, err)
	}

	ports := map[string]int{}
	if c.opts.FluxStoragePort != 0 {
		ports["storage"], c.ports["flux-storage"] = c.opts.FluxStoragePort, c.opts.FluxStoragePort
	}
	for _, n := range []string{"storage", "sc-metrics", "sc-health", "kc-metrics", "kc-health", "hc-metrics", "hc-health"} {
		if _, kept := ports[n]; kept {
			continue
		}
		p, err := c.freePort("flux-"+n, "127.0.0.1")
		if err != nil {
			return err
		}
		ports[n] = p
	}
	// Each controller gets a /tmp of its own, as in its pod: at start,
	// kustomize-controller removes every kustomization-* directory in its
	// temp dir as a leftover of an earlier process of its own (v1.9.5
	// main.go purgeStaleTempDirs), and on a shared /tmp those are the work
	// dirs of the other labs' controllers, whose reconciles then fail
	// ("kustomize build failed: … no such file or directory") and wait out
	// their interval.
	env := func(controller string) ([]string, error) {
		tmp := c.path("flux", "tmp", controller)
		if err := os.MkdirAll(tmp, 0o700); err != nil {
			return nil, fmt.Errorf("starting Flux: %w", err)
		}
		return []string{"KUBECONFIG=" + c.AdminKubeconfigPath(), "RUNTIME_NAMESPACE=" + FluxNamespace, "TMPDIR=" + tmp}, nil
	}
	addr := func(n string) string { return "127.0.0.1:" + strconv.Itoa(ports[n]) }
	scEnv, err := env("source-controller")
	if err != nil {
		return err
	}
	scArgs := []string{
		"--watch-all-namespaces",
		"--storage-path=" + c.path("flux", "storage"),
		"--storage-addr=" + addr("storage"),
		"--storage-adv-addr=" + addr("storage"),
		"--metrics-addr=" + addr("sc-metrics"),
		"--health-addr=" + addr("sc-health"),
		"--log-encoding=console",
	}
	sc, err := c.run("source-controller", "source-controller", scArgs, scEnv...)
	if err != nil {
		return err
	}
	kcEnv, err := env("kustomize-controller")
	if err != nil {
		return err
	}
	kcArgs := []string{
		"--watch-all-namespaces",
		"--metrics-addr=" + addr("kc-metrics"),
		"--health-addr=" + addr("kc-health"),
		"--log-encoding=console",
	}
	kc, err := c.run("kustomize-controller", "kustomize-controller", kcArgs, kcEnv...)
	if err != nil {
		return err
	}
	hcEnv, err := env("helm-controller")
	if err != nil {
		return err
	}
	// helm-controller's flags: main.go at fluxcd/helm-controller v1.6.4
	// (the same --watch-all-namespaces, --metrics-addr and --health-addr
	// as the other two, from fluxcd/pkg/runtime).
	hcArgs := []string{
		"--watch-all-namespaces",
		"--metrics-addr=" + addr("hc-metrics"),
		"--health-addr=" + addr("hc-health"),
		"--log-encoding=console",
	}
	hc, err := c.run("helm-controller", "helm-controller", hcArgs, hcEnv...)
	if err != nil {
		return err
	}
	ok := func(string) bool { return true }
	for _, p := range []struct {
		proc   *process
		name   string
		health string
	}{{sc, "source-controller", "sc-health"}, {kc, "kustomize-controller", "kc-health"}, {hc, "helm-controller", "hc-health"}} {
		if err := c.waitHTTP(ctx, p.proc, p.name+" /readyz", "http://"+addr(p.health)+"/readyz", ok); err != nil {
			return err
		}
	}
	go c.superviseReconcilers([]fluxProcess{
		{proc: sc, args: scArgs, env: scEnv, metrics: "http://" + addr("sc-metrics") + "/metrics"},
		{proc: kc, args: kcArgs, env: kcEnv, metrics: "http://" + addr("kc-metrics") + "/metrics"},
		{proc: hc, args: hcArgs, env: hcEnv, metrics: "http://" + addr("hc-metrics") + "/metrics"},
	})
	return nil
}

// fluxProcess is a Flux controller the lab runs, with what it was started
// with and where it reports its metrics.
type fluxProcess struct {
	proc      *process
	args, env []string
	metrics   string
}

// superviseReconcilers says, in the lab's log, when each Flux controller
// started its reconcilers, and restarts once a controller that has not
// reconcilersStartBound after its /readyz answered. /readyz answers as soon as the manager
// serves it; the reconcilers start only once the manager's caches have
// synced (controller-runtime v0.24.1: a controller's Start sets
// controller_runtime_max_concurrent_reconciles). A make test run waited out
// its Flux timeout with source-controller's log ending at "starting
// server" and no reconciler ever started; the cause was not found (seen
// once, under load, with the lab's Flux CRDs applied again by the run while
// the controllers started). A kubelet would not restart it (its probes
// pass): docs/lab.md lists this as the lab's own.
func (c *Cluster) superviseReconcilers(procs []fluxProcess) {
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	started := func(url string) bool {
		resp, err := hc.Get(url)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		return bytes.Contains(body, []byte("controller_runtime_max_concurrent_reconciles{"))
	}
	start := time.Now()
	restarted := map[string]bool{}
	pending := slices.Clone(procs)
	for len(pending) > 0 && time.Since(start) < 2*time.Minute {
		c.mu.Lock()
		stopped := c.stopped
		c.mu.Unlock()
		if stopped {
			return // a lab stopped before its controllers started: nothing to say
		}
		pending = slices.DeleteFunc(pending, func(p fluxProcess) bool {
			if started(p.metrics) {
				c.log.Info().Str("process", p.proc.name).Dur("after", time.Since(start)).Msg("reconcilers started")
				return true
			}
			return false
		})
		for i, p := range pending {
			if restarted[p.proc.name] || time.Since(start) < reconcilersStartBound {
				continue
			}
			restarted[p.proc.name] = true
			c.log.Warn().Str("process", p.proc.name).Dur("after", time.Since(start)).Msg("reconcilers not started; restarting the controller")
			if np, err := c.restart(p); err != nil {
				c.log.Error().Err(err).Str("process", p.proc.name).Msg("restarting a Flux controller")
			} else {
				pending[i].proc = np
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	for _, p := range pending {
		c.log.Warn().Str("process", p.proc.name).Msg("reconcilers still not started two minutes after /readyz")
	}
}

// reconcilersStartBound is how long a Flux controller may take to start
// its reconcilers before the lab restarts it: about 1 s on an idle 2-core
// machine, a few under make test. At 30 s a restarted controller could not
// reconcile within a test's minute (seen once in a cold CI run, under the
// load of the other packages' tests).
const reconcilersStartBound = 15 * time.Second

// restart stops a lab process and starts it again with the same command,
// logging to <name>.restarted.log (the first log is kept for the reader),
// and puts the new process in the old one's place. It holds the lab's
// lock throughout, so Healthy never sees the old one exited and Stop
// never misses the new one; a lab being stopped is not started again.
func (c *Cluster) restart(p fluxProcess) (*process, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil, fmt.Errorf("the lab is stopping")
	}
	if err := p.proc.stop(5 * time.Second); err != nil {
		return nil, err
	}
	np, err := startProcess(c.sp, p.proc.name, p.proc.cmd.Path, p.args, p.env, c.path("logs", p.proc.name+".restarted.log"))
	if err != nil {
		return nil, err
	}
	if i := slices.Index(c.procs, p.proc); i >= 0 {
		c.procs[i] = np
	} else {
		c.procs = append(c.procs, np)
	}
	return np, nil
}

// ApplyCRDFiles applies the CustomResourceDefinitions in the given YAML
// files with server-side apply and waits until each is Established.
func (c *Cluster) ApplyCRDFiles(ctx context.Context, files []string) error {
	dyn, err := dynamic.NewForConfig(c.adminConfig)
	if err != nil {
		return fmt.Errorf("building a dynamic client: %w", err)
	}
	var names []string
	for _, f := range files {
		objs, err := readYAMLObjects(f)
		if err != nil {
			return err
		}
		for _, o := range objs {
			if o.GetKind() != "CustomResourceDefinition" {
				continue
			}
			o.SetManagedFields(nil)
			if _, err := dyn.Resource(crdGVR).Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: "bootstrap-lab", Force: true}); err != nil {
				return fmt.Errorf("applying CRD %s: %w", o.GetName(), err)
			}
			names = append(names, o.GetName())
		}
	}
	tr := wait.NewTracker(c.log, "CRDs Established", names)
	defer tr.Close()
	return wait.Until(ctx, wait.Spec{What: "CRDs Established", Timeout: c.opts.ReadyTimeout, Interval: 200 * time.Millisecond, Log: c.log},
		func(ctx context.Context) (bool, string, error) {
			for _, n := range tr.Pending() {
				u, err := dyn.Resource(crdGVR).Get(ctx, n, metav1.GetOptions{})
				if err != nil {
					return false, tr.Status(), nil
				}
				var crd apiextensionsv1.CustomResourceDefinition
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &crd); err != nil {
					return false, "", fmt.Errorf("decoding CRD %s: %w", n, err)
				}
				for _, cond := range crd.Status.Conditions {
					if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
						tr.Done(n)
					}
				}
			}
			return len(tr.Pending()) == 0, tr.Status(), nil
		})
}

// readYAMLObjects decodes every non-empty document of a multi-document YAML
// file.
func readYAMLObjects(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	var out []*unstructured.Unstructured
	for i, doc := range splitYAML(data) {
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("parsing %s document %d: %w", path, i+1, err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	return out, nil
}

func readFileIn(dir, rel string) ([]byte, error) { return os.ReadFile(filepath.Join(dir, rel)) }

// splitYAML splits a multi-document YAML stream at its "---" separators.
func splitYAML(data []byte) [][]byte {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if err != nil {
			return docs
		}
		if len(bytes.TrimSpace(doc)) > 0 {
			docs = append(docs, doc)
		}
	}
}
