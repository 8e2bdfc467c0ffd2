// Package proxmox is bootstrap's small interface over the Proxmox VE API,
// built on github.com/Telmate/proxmox-api-go: TLS pinning, error
// classification (transient vs fatal at the client boundary), task waits
// that notice completion quickly, the host facts prechecks need, and VMs
// described by a spec that is ensured idempotently (create, adopt, report
// and fix drift, refuse what is not ours).
package proxmox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	pxapi "github.com/Telmate/proxmox-api-go/proxmox"
	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/internal/retry"
)

// Options configure a Client.
type Options struct {
	// URL is the API endpoint ("https://pve.lan:8006"); "/api2/json" is
	// appended when missing.
	URL string
	// Node is the Proxmox node the cluster's VMs live on.
	Node string
	// TokenID ("user@realm!name") and TokenSecret authenticate with an API
	// token; Username and Password with a ticket when no token is set.
	TokenID     string
	TokenSecret string
	Username    string
	Password    string
	// Fingerprint pins the API certificate's SHA-256 fingerprint
	// ("AB:CD:..." as the Proxmox GUI shows it).
	Fingerprint string
	// CAFile (or CAPEM) verifies the certificate chain against the cluster
	// CA (/etc/pve/pve-root-ca.pem).
	CAFile string
	CAPEM  []byte
	// Insecure skips certificate verification; only by explicit choice,
	// and it is logged loudly.
	Insecure bool
	// Log receives request, retry and wait lines; secrets never reach it.
	Log zerolog.Logger
	// Retry bounds retries of transient failures (default 6 attempts,
	// 250ms doubling to 5s).
	Retry retry.Policy
	// TaskPoll is the first interval between polls of a running task's
	// status (default 150ms); each further poll waits a quarter longer, up
	// to TaskPollMax (default 2s), so a download of minutes is not asked
	// about seven times a second.
	TaskPoll time.Duration
	// TaskPollMax caps the interval between task status polls.
	TaskPollMax time.Duration
	// TaskTimeout bounds a VM task: create, start, stop, delete (default 5m).
	TaskTimeout time.Duration
	// DownloadTimeout bounds an ISO download task (default 30m).
	DownloadTimeout time.Duration
	// RequestTimeout bounds one HTTP request (default 30s).
	RequestTimeout time.Duration
	// TicketRenewAfter is the age at which a password login's ticket is
	// renewed (default 1h; PVE's tickets last 2h).
	TicketRenewAfter time.Duration
}

// Client talks to one Proxmox VE node. It is safe for concurrent use;
// operations on one VM are serialised.
type Client struct {
	*conn
	node string
}

// conn is what every Client of one endpoint shares (see On): the API
// client, its options and the per-VM serialisation.
type conn struct {
	px   *pxapi.Client
	opts Options
	log  zerolog.Logger

	vmMu  sync.Mutex
	vmSem map[int]chan struct{}
}

// On is a client for the cluster member node through the same endpoint:
// PVE forwards every call below /nodes/{node} to that node (proxyto), so
// one connection reaches every member. "" or this client's node is c.
func (c *Client) On(node string) *Client {
	if node == "" || node == c.node {
		return c
	}
	return &Client{conn: c.conn, node: node}
}

// New builds a client; with password auth it logs in (the only call New makes).
func New(ctx context.Context, o Options) (*Client, error) {
	if o.URL == "" {
		return nil, errors.New("proxmox: no API URL configured")
	}
	if o.Node == "" {
		return nil, errors.New("proxmox: no node configured")
	}
	u, err := url.Parse(strings.TrimRight(o.URL, "/"))
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("proxmox: API URL %q must be https://host[:port]", o.URL)
	}
	if !strings.HasSuffix(u.Path, "/api2/json") {
		u.Path += "/api2/json"
	}
	if o.Retry.Attempts == 0 {
		o.Retry.Attempts = 6
	}
	if o.TaskPoll <= 0 {
		o.TaskPoll = 150 * time.Millisecond
	}
	if o.TaskPollMax < o.TaskPoll {
		o.TaskPollMax = max(2*time.Second, o.TaskPoll)
	}
	if o.TaskTimeout <= 0 {
		o.TaskTimeout = 5 * time.Minute
	}
	if o.DownloadTimeout <= 0 {
		o.DownloadTimeout = 30 * time.Minute
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 30 * time.Second
	}
	log := o.Log.With().Str("component", "proxmox").Logger()
	tlsCfg, err := tlsConfig(o, u.Hostname(), log)
	if err != nil {
		return nil, fmt.Errorf("proxmox: %w", err)
	}
	if o.TicketRenewAfter <= 0 {
		o.TicketRenewAfter = time.Hour
	}
	base := &http.Transport{TLSClientConfig: tlsCfg, DisableCompression: true, MaxIdleConnsPerHost: 16, ForceAttemptHTTP2: false}
	tr := &transport{base: base, log: log}
	if o.TokenID == "" && o.Username != "" {
		tr.auth = &ticketAuth{user: o.Username, password: o.Password, loginURL: u.String() + "/access/ticket", base: base, renewAfter: o.TicketRenewAfter}
	}
	hc := &http.Client{Timeout: o.RequestTimeout, Transport: tr}
	// TaskTimeout here only bounds Telmate's own waits, which this package
	// does not use for tasks (see waitTask).
	px, err := pxapi.NewClient(u.String(), hc, "", nil, "", int(o.TaskTimeout/time.Second), false)
	if err != nil {
		return nil, fmt.Errorf("proxmox: creating API client: %w", err)
	}
	c := &Client{conn: &conn{px: px, opts: o, log: log, vmSem: map[int]chan struct{}{}}, node: o.Node}
	switch {
	case o.TokenID != "":
		var id pxapi.ApiTokenID
		if err := id.Parse(o.TokenID); err != nil {
			return nil, fmt.Errorf("proxmox: API token ID %q must look like user@realm!name", o.TokenID)
		}
		px.SetAPIToken(id, pxapi.ApiTokenSecret(o.TokenSecret))
	case o.Username != "":
		// The first login, so that bad credentials fail here; the
		// transport renews the ticket from then on.
		err := retry.Do(ctx, o.Retry, log, "log in to Proxmox", func(ctx context.Context) error {
			_, _, err := tr.auth.current(ctx)
			return classify("POST", "/access/ticket", err)
		})
		if err != nil {
			return nil, fmt.Errorf("proxmox: logging in as %s: %w", o.Username, err)
		}
	default:
		return nil, errors.New("proxmox: no API token or user configured")
	}
	return c, nil
}

// Node is the node this client manages VMs on.
func (c *Client) Node() string { return c.node }

// transport adapts PVE's error answers for Telmate and passes what Telmate
// discards back to this package (see call).
//
// PVE puts the error text in the HTTP reason phrase; the JSON "message"
// only exists since pve-http-server 5.2, and a 401 has an empty body.
// Telmate keeps only the JSON, so the reason phrase is copied into the
// body's message when missing. That also turns an empty 401 into a JSON
// error, which Telmate does not retry with its fixed sleeps.
type transport struct {
	base http.RoundTripper
	log  zerolog.Logger
	// auth, with password login, keeps the ticket fresh (nil with a token).
	auth *ticketAuth
}

type callKey struct{}

// call carries one request's side channel between this package and the
// transport, past Telmate: the body of a successful answer (Telmate's
// Delete drops the task UPID it holds) and the real network error.
//
// Telmate retries network errors itself with fixed sleeps that ignore the
// context (1s, then 2s). The transport therefore answers Telmate with a
// synthetic 599 it does not retry and hands the real error here, where
// retry.Do applies our bounded, cancellable policy and the error keeps its
// type (a fingerprint mismatch stays fatal).
type call struct {
	body   []byte
	netErr error
}

func withCall(ctx context.Context) (context.Context, *call) {
	cl := &call{}
	return context.WithValue(ctx, callKey{}, cl), cl
}

// classify maps a Telmate error to ours, preferring the network error the
// transport recorded for the call.
func (cl *call) classify(method, path string, err error) error {
	if cl.netErr != nil {
		return classify(method, path, cl.netErr)
	}
	return classify(method, path, err)
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	cl, _ := req.Context().Value(callKey{}).(*call)
	authed, err := t.auth.authorize(req)
	if err == nil {
		var resp *http.Response
		if resp, err = t.base.RoundTrip(authed); err == nil {
			return t.answer(authed, cl, resp, start)
		}
	}
	t.log.Debug().Str("method", req.Method).Str("path", req.URL.Path).Err(err).Msg("proxmox request failed")
	if cl == nil {
		return nil, err
	}
	cl.netErr = err
	body := []byte(`{"data":null,"message":"network error (see the recorded error)"}`)
	return &http.Response{
		StatusCode: 599, Status: "599 network error", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)), Request: req,
	}, nil
}

// answer adapts a received answer (see transport).
func (t *transport) answer(req *http.Request, cl *call, resp *http.Response, start time.Time) (*http.Response, error) {
	t.log.Trace().Str("method", req.Method).Str("path", req.URL.Path).Int("status", resp.StatusCode).
		Dur("took", time.Since(start)).Msg("proxmox request")
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if cl != nil {
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return nil, err
			}
			cl.body = b
			resp.Body = io.NopCloser(bytes.NewReader(b))
		}
		return resp, nil
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	reason := strings.TrimSpace(strings.TrimPrefix(resp.Status, fmt.Sprint(resp.StatusCode)))
	var obj map[string]any
	if json.Unmarshal(b, &obj) != nil || obj == nil {
		obj = map[string]any{"data": nil}
	}
	if msg, _ := obj["message"].(string); strings.TrimSpace(msg) == "" {
		obj["message"] = reason
	}
	if errs, ok := obj["errors"]; ok {
		if _, isMap := errs.(map[string]any); !isMap {
			delete(obj, "errors")
		}
	}
	nb, _ := json.Marshal(obj)
	resp.Body = io.NopCloser(bytes.NewReader(nb))
	resp.ContentLength = int64(len(nb))
	resp.Header.Set("Content-Type", "application/json")
	resp.Header.Del("Content-Length")
	return resp, nil
}

// getData reads one API path and returns its "data", retrying transient failures.
func (c *Client) getData(ctx context.Context, path string) (any, error) {
	var out any
	err := retry.Do(ctx, c.opts.Retry, c.log, "GET "+path, func(ctx context.Context) error {
		out = nil
		cctx, cl := withCall(ctx)
		m, err := c.px.GetItemList(cctx, path)
		if err != nil {
			return cl.classify("GET", path, err)
		}
		out = m["data"]
		return nil
	})
	return out, err
}

func (c *Client) getMap(ctx context.Context, path string) (map[string]any, error) {
	d, err := c.getData(ctx, path)
	if err != nil {
		return nil, err
	}
	m, ok := d.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("Proxmox API GET %s: expected an object, got %T", path, d)
	}
	return m, nil
}

func (c *Client) getList(ctx context.Context, path string) ([]map[string]any, error) {
	d, err := c.getData(ctx, path)
	if err != nil {
		return nil, err
	}
	if d == nil {
		return nil, nil
	}
	raw, ok := d.([]any)
	if !ok {
		return nil, fmt.Errorf("Proxmox API GET %s: expected a list, got %T", path, d)
	}
	out := make([]map[string]any, 0, len(raw))
	for _, e := range raw {
		if m, ok := e.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out, nil
}

// post sends one POST (no retry) and returns the task UPID it started, if any.
func (c *Client) post(ctx context.Context, path string, params map[string]any) (string, error) {
	c.log.Debug().Str("method", "POST").Str("path", path).Msg("proxmox call")
	cctx, cl := withCall(ctx)
	body, err := c.px.CreateItemReturnStatus(cctx, params, path)
	if err != nil {
		return "", cl.classify("POST", path, err)
	}
	return upidFrom("POST", path, []byte(body))
}

// put sends one PUT (no retry) and returns the task UPID it started, if any.
func (c *Client) put(ctx context.Context, path string, params map[string]any) (string, error) {
	c.log.Debug().Str("method", "PUT").Str("path", path).Msg("proxmox call")
	cctx, cl := withCall(ctx)
	body, err := c.px.UpdateItemReturnStatus(cctx, params, path)
	if err != nil {
		return "", cl.classify("PUT", path, err)
	}
	return upidFrom("PUT", path, []byte(body))
}

// del sends one DELETE (no retry) and returns the task UPID it started.
func (c *Client) del(ctx context.Context, path string) (string, error) {
	c.log.Debug().Str("method", "DELETE").Str("path", path).Msg("proxmox call")
	cctx, cl := withCall(ctx)
	if err := c.px.Delete(cctx, path); err != nil {
		return "", cl.classify("DELETE", path, err)
	}
	return upidFrom("DELETE", path, cl.body)
}

func upidFrom(method, path string, body []byte) (string, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return "", nil
	}
	var r struct {
		Data any `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return "", fmt.Errorf("Proxmox API %s %s: unreadable answer: %w", method, path, err)
	}
	s, _ := r.Data.(string)
	return s, nil
}

// lockVM serialises operations on one VM within this process; PVE would
// otherwise answer the second with "VM is locked".
func (c *Client) lockVM(ctx context.Context, vmid int) (func(), error) {
	c.vmMu.Lock()
	sem, ok := c.vmSem[vmid]
	if !ok {
		sem = make(chan struct{}, 1)
		c.vmSem[vmid] = sem
	}
	c.vmMu.Unlock()
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for another operation on VM %d: %w", vmid, ctx.Err())
	}
}
