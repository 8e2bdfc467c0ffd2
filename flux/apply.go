package flux

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/fluxcd/cli-utils/pkg/kstatus/polling"
	"github.com/fluxcd/pkg/ssa"
	ssautil "github.com/fluxcd/pkg/ssa/utils"
	"github.com/rs/zerolog"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// FieldManager owns the fields bootstrap applies.
var owner = ssa.Owner{Field: "bootstrap", Group: "bootstrap.homelab"}

// Client applies objects with server-side apply and waits with kstatus,
// the way the flux CLI installs Flux.
type Client struct {
	kube client.Client
	dyn  dynamic.Interface
	rm   *ssa.ResourceManager
	log  zerolog.Logger
}

// NewClient connects to the cluster cfg reaches (kube.RESTConfigFrom).
func NewClient(cfg *rest.Config, log zerolog.Logger) (*Client, error) {
	return NewClientAs(cfg, owner, log)
}

// NewClientAs is NewClient applying as another field manager: the Talos
// bootstrap manifests are synced as "talos", the manager Talos created
// them with, as talosctl upgrade-k8s does.
func NewClientAs(cfg *rest.Config, as ssa.Owner, log zerolog.Logger) (*Client, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	// A dynamic mapper sees the Flux CRDs as soon as they are established.
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, hc)
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Mapper: mapper})
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, err
	}
	rm := ssa.NewResourceManager(c, polling.NewStatusPoller(c, mapper, polling.Options{}), as)
	return &Client{kube: c, dyn: dyn, rm: rm, log: log}, nil
}

// Change is what applying one object would do.
type Change struct {
	Object string
	Action string // created, configured, unchanged
}

// Plan diffs objects against the cluster with server-side dry runs and
// returns the objects that would change. Objects whose CRD is not
// installed yet count as created.
func (c *Client) Plan(ctx context.Context, objs []*unstructured.Unstructured) ([]Change, error) {
	// The dry runs are independent reads: a few at a time, not one round
	// trip after another.
	changes := make([]*Change, len(objs))
	sem := make(chan struct{}, planConcurrency)
	var wg sync.WaitGroup
	for i, o := range objs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			entry, _, _, err := c.rm.Diff(ctx, o, ssa.DefaultDiffOptions())
			switch {
			case err != nil:
				// A custom resource whose CRD is not there yet cannot be dry-run.
				changes[i] = &Change{Object: ssautil.FmtUnstructured(o), Action: string(ssa.CreatedAction)}
			case entry.Action != ssa.UnchangedAction:
				changes[i] = &Change{Object: entry.Subject, Action: string(entry.Action)}
			}
		}()
	}
	wg.Wait()
	var out []Change
	for _, ch := range changes {
		if ch != nil {
			out = append(out, *ch)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Object < out[j].Object })
	return out, nil
}

// planConcurrency bounds the dry runs of Plan in flight at once.
const planConcurrency = 8

// Apply applies objects in stages (CRDs and namespaces first, then the
// rest), then waits until every applied object is current (kstatus).
func (c *Client) Apply(ctx context.Context, objs []*unstructured.Unstructured, timeout time.Duration) (*ssa.ChangeSet, error) {
	opts := ssa.DefaultApplyOptions()
	opts.WaitTimeout = timeout
	cs, err := c.rm.ApplyAllStaged(ctx, objs, opts)
	if err != nil {
		return cs, fmt.Errorf("applying: %w", err)
	}
	for _, e := range cs.Entries {
		if e.Action != ssa.UnchangedAction {
			c.log.Debug().Str("object", e.Subject).Str("action", string(e.Action)).Msg(e.String())
		}
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.rm.WaitForSetWithContext(wctx, cs.ToObjMetadataSet(), ssa.WaitOptions{Interval: 250 * time.Millisecond, Timeout: timeout}); err != nil {
		return cs, fmt.Errorf("waiting for %d object(s) to become ready: %w", len(cs.Entries), err)
	}
	return cs, nil
}
