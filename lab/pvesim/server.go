// Package pvesim is a Proxmox VE API simulator that speaks the real protocol:
// JSON under /api2/json over HTTPS with a certificate signed by a cluster CA,
// API token and ticket authentication, per-path privileges, asynchronous
// tasks with UPIDs, per-VM locks, node memory and storage capacity, ISO
// content and download-url. It answers with PVE's JSON types and error
// texts, injects faults on request, counts every call, and tells listeners
// when a VM starts or stops so a guest simulator can boot at its address.
//
// It runs in-process: New starts it, URL and Fingerprint say where and how to
// trust it, Close stops it.
package pvesim

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/lab/pveapi"
)

// apiBase is where the JSON API lives.
const apiBase = "/api2/json"

// Server is one running simulated Proxmox VE host.
type Server struct {
	opts  Options
	log   zerolog.Logger
	certs *certs
	ln    net.Listener
	srv   *http.Server
	url   string

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu         sync.Mutex
	node       NodeSpec
	nodeOnline bool
	version    string
	repoid     string
	bootTime   time.Time
	storages   []*storage
	bridges    []BridgeSpec
	vms        map[int]*vm
	tasks      map[string]*task
	remote     map[string]RemoteFile
	tokens     map[string]Token
	users      map[string]User
	tickets    map[string]ticket
	guests     map[int]GuestSpec
	ha         map[int]string // HA-managed VMs: vmid → requested state (ha.go)
	haRules    *haRules       // the cluster's HA rules (harules.go), shared by members
	otherNodes []string       // other cluster nodes, sorted (other.go)
	cl         *clusterState  // the cluster this member belongs to (multinode.go); nil alone
	faults     []*faultRule
	counts     map[string]int
	rng        *mrand.Rand
	pid        int
	onStart    []func(VMEvent) error
	onStop     []func(VMEvent)
	onDestroy  []func(VMEvent)
	// api is the published schema of the simulated version (schema.go);
	// nil without the schema files. apiNote says when it is another
	// release's. calls counts requests by path template.
	api     *pveapi.API
	apiNote string
	calls   map[string]int
}

type ticket struct {
	user   string
	csrf   string
	issued time.Time
}

// New starts a simulator with opts (see Options for the defaults).
func New(opts Options) (*Server, error) {
	opts = withDefaults(opts)
	api, apiNote, err := loadSchema(opts.Version)
	if err != nil {
		return nil, fmt.Errorf("pvesim: %w", err)
	}
	c, err := newCerts(opts.Node.Name, opts.Hosts)
	if err != nil {
		return nil, fmt.Errorf("generating certificates: %w", err)
	}
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", opts.Addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		opts:       opts,
		log:        opts.Log.With().Str("component", "pvesim").Logger(),
		certs:      c,
		ln:         ln,
		ctx:        ctx,
		cancel:     cancel,
		node:       opts.Node,
		nodeOnline: true,
		version:    opts.Version,
		repoid:     randHex(8),
		bootTime:   time.Now().Add(-72 * time.Hour),
		bridges:    append([]BridgeSpec(nil), opts.Bridges...),
		vms:        map[int]*vm{},
		tasks:      map[string]*task{},
		remote:     map[string]RemoteFile{},
		tokens:     map[string]Token{},
		users:      map[string]User{},
		tickets:    map[string]ticket{},
		counts:     map[string]int{},
		ha:         map[int]string{},
		haRules:    newHARules(),
		rng:        mrand.New(mrand.NewPCG(uint64(opts.Seed), uint64(opts.Seed)^0x9e3779b97f4a7c15)),
		pid:        4000,
		onStart:    slices.Clone(opts.OnStart),
		onStop:     slices.Clone(opts.OnStop),
		onDestroy:  slices.Clone(opts.OnDestroy),
		api:        api,
		apiNote:    apiNote,
		calls:      map[string]int{},
	}
	switch {
	case api == nil:
		s.log.Warn().Msg("no Proxmox VE API schema found: requests are checked only by pvesim's own handlers (" + pveapi.Provenance + ")")
	case apiNote != "":
		s.log.Info().Str("schema", api.Release).Msg(apiNote)
	}
	if err := s.checkStorageSpecs(); err != nil {
		ln.Close()
		cancel()
		return nil, fmt.Errorf("pvesim: %w", err)
	}
	for _, st := range opts.Storages {
		s.storages = append(s.storages, newStorage(st))
	}
	for u, f := range opts.RemoteFiles {
		s.remote[u] = f
	}
	for _, t := range opts.Tokens {
		s.tokens[t.ID] = t
	}
	for _, u := range opts.Users {
		s.users[u.ID] = u
	}
	for _, g := range opts.Guests {
		s.SeedGuest(g)
	}
	for _, iso := range opts.ISOs {
		if err := s.AddISO(iso); err != nil {
			ln.Close()
			cancel()
			return nil, err
		}
	}
	tlsLn := tls.NewListener(ln, &tls.Config{
		Certificates: []tls.Certificate{c.leaf},
		MinVersion:   tls.VersionTLS12,
		// pve-http-server speaks HTTP/1.1 only; without "h2" here Go never
		// negotiates HTTP/2, which also keeps custom status lines possible.
		NextProtos: []string{"http/1.1"},
	})
	// Handshake failures (a client rejecting the certificate) are expected
	// in tests of pinning; they go to the simulator's debug log.
	errLog := stdlog.New(logWriter{s.log}, "", 0)
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, ErrorLog: errLog}
	s.url = "https://" + ln.Addr().String()
	go func() { _ = s.srv.Serve(tlsLn) }()
	s.log.Info().Str("url", s.url).Str("profile", opts.Profile.Name).Float64("time_scale", opts.TimeScale).
		Msg("pvesim listening")
	return s, nil
}

func withDefaults(o Options) Options {
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	if o.Node.Name == "" {
		o.Node.Name = "pve"
	}
	if o.Node.CPUs == 0 {
		o.Node.CPUs = 4
	}
	if o.Node.CPUModel == "" {
		o.Node.CPUModel = "Intel(R) N100"
	}
	if o.Node.MemoryBytes == 0 {
		o.Node.MemoryBytes = 16 * gib
	}
	if o.Node.HostUsedBytes == 0 {
		o.Node.HostUsedBytes = 3 * gib / 2
	}
	if o.Node.PageCacheBytes == 0 {
		o.Node.PageCacheBytes = 3 * gib
	}
	if o.Profile.TicketLifetime == 0 && o.Profile.Name != "" {
		o.Profile.TicketLifetime = 2 * time.Hour
	}
	if o.Version == "" {
		o.Version = "8.2.4"
	}
	if o.QemuServer == "" {
		o.QemuServer = defaultQemuServer(o.Version)
	}
	if o.QemuServerCandidate == "" {
		o.QemuServerCandidate = o.QemuServer
	}
	if o.PVEStorage == "" {
		o.PVEStorage = defaultPVEStorage(o.Version)
	}
	if o.Storages == nil {
		o.Storages = []StorageSpec{
			{Name: "local", Type: "dir", Content: []string{"iso", "vztmpl", "backup"}, TotalBytes: 94 * gib, UsedBytes: 9 * gib, Path: "/var/lib/vz"},
			{Name: "local-lvm", Type: "lvmthin", Content: []string{"images", "rootdir"}, TotalBytes: 348 * gib},
		}
	}
	if o.Bridges == nil {
		o.Bridges = []BridgeSpec{{Name: "vmbr0", Ports: "enp1s0", CIDR: "10.0.20.5/24", Gateway: "10.0.20.1"}}
	}
	if len(o.Tokens) == 0 {
		o.Tokens = []Token{{ID: "root@pam!bootstrap", Secret: newUUID(), ACL: Admin(o.Version)}}
	}
	if o.Profile.Name == "" {
		o.Profile = Instant()
	}
	if o.TimeScale <= 0 {
		o.TimeScale = 1
	}
	return o
}

type logWriter struct{ log zerolog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Debug().Msg(strings.TrimSpace(string(p)))
	return len(p), nil
}

// URL is the server's base URL ("https://127.0.0.1:PORT"); the API is below
// URL()+"/api2/json".
func (s *Server) URL() string { return s.url }

// APIURL is URL()+"/api2/json".
func (s *Server) APIURL() string { return s.url + apiBase }

// Fingerprint is the SHA-256 fingerprint of the served certificate, in the
// form the PVE GUI shows ("AB:CD:...").
func (s *Server) Fingerprint() string { return s.certs.fingerprint }

// CACertPEM is the cluster CA that signed the served certificate (what PVE
// keeps in /etc/pve/pve-root-ca.pem).
func (s *Server) CACertPEM() []byte { return append([]byte(nil), s.certs.caPEM...) }

// NodeName is the simulated node's name.
func (s *Server) NodeName() string { return s.node.Name }

// Token returns the first configured API token's ID and secret.
func (s *Server) Token() (id, secret string) {
	t := s.opts.Tokens[0]
	return t.ID, t.Secret
}

// Close stops serving, interrupts running tasks and waits for them.
func (s *Server) Close() error {
	s.cancel()
	// Close, not Shutdown: a client's spare connection that never sent a
	// request would hold Shutdown for five seconds, and a simulator has
	// nothing to drain.
	err := s.srv.Close()
	s.wg.Wait()
	return err
}

// scaled converts a profile duration to wall time.
func (s *Server) scaled(d time.Duration) time.Duration {
	return time.Duration(math.Round(float64(d) * s.opts.TimeScale))
}

// pause waits for a profile duration, or until ctx or the server ends.
func (s *Server) pause(ctx context.Context, d time.Duration) error {
	return s.sleep(ctx, s.scaled(d))
}

func (s *Server) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return errors.New("got interrupted by signal")
	case <-s.ctx.Done():
		return errors.New("got interrupted by signal")
	}
}

// apiError is an error answer with PVE's status, message and per-parameter errors.
type apiError struct {
	code int
	msg  string
	errs map[string]string
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s", e.code, strings.TrimSpace(e.msg)) }

// errf builds an error answer; PVE messages end in a newline.
func errf(code int, format string, a ...any) *apiError {
	msg := fmt.Sprintf(format, a...)
	if !strings.HasSuffix(msg, "\n") {
		msg += "\n"
	}
	return &apiError{code: code, msg: msg}
}

// paramErr is PVE's 400 answer for failed parameter verification
// (pve-common src/PVE/Exception.pm raise_param_exc): the messages go out
// as they were raised, a newline only where the text had one (a format's
// die), as pve-http-server's Formatter/Standard.pm copies them.
func paramErr(errs map[string]string) *apiError {
	return &apiError{code: http.StatusBadRequest, msg: "Parameter verification failed.\n", errs: errs}
}

// request is one parsed API call.
type request struct {
	method string
	path   string
	segs   []string
	params url.Values
	who    *identity
	// taskFault, when set, makes the task this request starts fail with it.
	taskFault string
	// api is the schema's method for this call and uri its path
	// parameters (schema.go); validated is set once the parameters were
	// checked, on whichever member answers.
	api       *pveapi.Method
	uri       map[string]string
	validated bool
}

func (r *request) param(k string) string { return r.params.Get(k) }

// ServeHTTP answers one API call.
func (s *Server) ServeHTTP(w http.ResponseWriter, hr *http.Request) {
	if !strings.HasPrefix(hr.URL.Path, apiBase+"/") && hr.URL.Path != apiBase {
		s.writeError(w, errf(http.StatusNotImplemented, "no such uri"))
		return
	}
	rel := strings.TrimPrefix(hr.URL.Path, apiBase)
	if rel == "" {
		rel = "/"
	}
	rel = "/" + strings.Trim(rel, "/")
	s.count(hr.Method, rel)

	body, err := io.ReadAll(io.LimitReader(hr.Body, 64*1024+1))
	if err != nil {
		s.writeError(w, errf(http.StatusBadRequest, "bad request"))
		return
	}
	if len(body) > 64*1024 {
		s.writeError(w, errf(http.StatusNotImplemented, "for data too large"))
		return
	}
	if err := s.pause(hr.Context(), s.opts.Profile.Request); err != nil {
		return
	}

	req := &request{method: hr.Method, path: rel, segs: strings.Split(strings.Trim(rel, "/"), "/")}
	if f := s.fireFault(hr.Method, rel); f != nil {
		switch f.Kind {
		case FaultSlow:
			if err := s.sleep(hr.Context(), f.Delay); err != nil {
				return
			}
		case FaultTaskError:
			req.taskFault = f.Message
		case FaultUnauthorized:
			s.unauthorized(w, hr, "Authentication failed!")
			return
		case FaultLock:
			s.writeError(w, errf(http.StatusInternalServerError, "can't lock file '/var/lock/qemu-server/lock-%s.conf' - got timeout", vmidInPath(req.segs)))
			return
		default:
			code := f.Status
			if code == 0 {
				code = http.StatusInternalServerError
			}
			msg := f.Message
			if msg == "" {
				msg = http.StatusText(code)
			}
			s.writeError(w, errf(code, "%s", msg))
			return
		}
	}

	params, perr := parseParams(hr, body)
	if perr != nil {
		s.writeError(w, perr)
		return
	}
	req.params = params

	if !(hr.Method == http.MethodPost && rel == "/access/ticket") {
		who, aerr := s.authenticate(hr)
		if aerr != nil {
			s.unauthorized(w, hr, aerr.msg)
			return
		}
		req.who = who
	}
	if aerr := s.findMethod(req); aerr != nil {
		s.writeError(w, aerr)
		return
	}

	data, aerr := s.route(hr.Context(), req)
	if aerr == nil {
		aerr = s.checkResult(req, data)
	}
	if aerr != nil {
		s.writeError(w, aerr)
		return
	}
	s.writeData(w, data)
}

func vmidInPath(segs []string) string {
	for i, p := range segs {
		if (p == "qemu" || p == "lxc") && i+1 < len(segs) {
			return segs[i+1]
		}
	}
	return "0"
}

// parseParams merges the urlencoded (or JSON) body with the query, as
// pve-http-server does; the login body arrives without a Content-Type.
func parseParams(hr *http.Request, body []byte) (url.Values, *apiError) {
	params := url.Values{}
	if len(body) > 0 {
		if hr.Method != http.MethodPost && hr.Method != http.MethodPut {
			return nil, errf(http.StatusNotImplemented, "Unexpected content for method '%s'", hr.Method)
		}
		ct := strings.TrimSpace(strings.SplitN(hr.Header.Get("Content-Type"), ";", 2)[0])
		switch ct {
		case "", "application/x-www-form-urlencoded":
			v, err := url.ParseQuery(string(body))
			if err != nil {
				return nil, errf(http.StatusBadRequest, "unable to parse request body: %v", err)
			}
			params = v
		case "application/json":
			var m map[string]any
			if err := json.Unmarshal(body, &m); err != nil {
				return nil, errf(http.StatusBadRequest, "unable to parse JSON body: %v", err)
			}
			for k, v := range m {
				switch t := v.(type) {
				case string:
					params.Set(k, t)
				case bool:
					if t {
						params.Set(k, "1")
					} else {
						params.Set(k, "0")
					}
				default:
					params.Set(k, fmt.Sprint(t))
				}
			}
		default:
			return nil, errf(506, "upload 'Content-Type '%s' not implemented", hr.Header.Get("Content-Type"))
		}
	}
	for k, vs := range hr.URL.Query() {
		params[k] = vs
	}
	params.Del("_dc")
	return params, nil
}

func (s *Server) writeData(w http.ResponseWriter, data any) {
	b, err := json.Marshal(map[string]any{"data": data})
	if err != nil {
		s.writeError(w, errf(http.StatusInternalServerError, "encoding answer: %v", err))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json;charset=UTF-8")
	h.Set("Server", "pve-api-daemon/3.0")
	h.Set("Cache-Control", "max-age=0")
	h.Set("Pragma", "no-cache")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// writeError answers like pve-http-server: the message (first line) is the
// HTTP reason phrase, the JSON body carries data:null, the message (since
// pve-http-server 5.2) and per-parameter errors, and the connection closes.
func (s *Server) writeError(w http.ResponseWriter, e *apiError) {
	body := map[string]any{"data": nil}
	if !s.opts.LegacyErrors {
		body["message"] = e.msg
	}
	if len(e.errs) > 0 {
		body["errors"] = e.errs
	}
	b, _ := json.Marshal(body)
	s.writeRaw(w, e.code, e.msg, "application/json;charset=UTF-8", b)
}

// unauthorized answers 401 with the reason only in the status line and an
// empty body, after PVE's delay for failed authentication.
func (s *Server) unauthorized(w http.ResponseWriter, hr *http.Request, msg string) {
	if err := s.pause(hr.Context(), s.opts.Profile.AuthFailure); err != nil {
		return
	}
	s.writeRaw(w, http.StatusUnauthorized, msg, "", nil)
}

func (s *Server) writeRaw(w http.ResponseWriter, code int, msg, contentType string, body []byte) {
	reason := strings.TrimSpace(strings.SplitN(msg, "\n", 2)[0])
	if reason == "" {
		reason = http.StatusText(code)
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		if contentType != "" {
			w.Header().Set("Content-Type", contentType)
		}
		w.Header().Set("Connection", "close")
		w.WriteHeader(code)
		_, _ = w.Write(body)
		return
	}
	conn, rw, err := hj.Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	writeStatusLine(rw, code, reason, contentType, body)
	_ = rw.Flush()
}

func writeStatusLine(rw *bufio.ReadWriter, code int, reason, contentType string, body []byte) {
	date := time.Now().UTC().Format(http.TimeFormat)
	fmt.Fprintf(rw, "HTTP/1.1 %d %s\r\n", code, reason)
	fmt.Fprintf(rw, "Cache-Control: max-age=0\r\nConnection: close\r\nDate: %s\r\nPragma: no-cache\r\nServer: pve-api-daemon/3.0\r\nExpires: %s\r\n", date, date)
	if contentType != "" {
		fmt.Fprintf(rw, "Content-Type: %s\r\n", contentType)
	}
	fmt.Fprintf(rw, "Content-Length: %d\r\n\r\n", len(body))
	_, _ = rw.Write(body)
}

// route dispatches an authenticated request.
func (s *Server) route(ctx context.Context, r *request) (any, *apiError) {
	seg := r.segs
	n := len(seg)
	get, post, del := r.method == http.MethodGet, r.method == http.MethodPost, r.method == http.MethodDelete
	if !(n >= 2 && seg[0] == "nodes") {
		if aerr := s.checkParams(r); aerr != nil {
			return nil, aerr
		}
	}
	switch {
	case n == 1 && seg[0] == "version" && get:
		return s.getVersion(), nil
	case n == 2 && seg[0] == "access" && seg[1] == "ticket" && post:
		return s.login(ctx, r)
	case n == 2 && seg[0] == "access" && seg[1] == "permissions" && get:
		return s.getPermissions(r)
	case n == 2 && seg[0] == "cluster" && seg[1] == "resources" && get:
		return s.clusterResources(r)
	case n == 2 && seg[0] == "cluster" && seg[1] == "status" && get:
		return s.clusterStatus(r)
	case n == 2 && seg[0] == "cluster" && seg[1] == "nextid" && get:
		return s.nextID(r)
	case n == 2 && seg[0] == "cluster" && seg[1] == "options" && get:
		return s.clusterOptions(r), nil
	case n == 4 && seg[0] == "cluster" && seg[1] == "sdn" && seg[2] == "vnets" && get:
		return s.readVNet(r, seg[3])
	case n == 3 && seg[0] == "cluster" && seg[1] == "ha" && seg[2] == "resources" && post:
		return s.haCreate(r)
	case n == 4 && seg[0] == "cluster" && seg[1] == "ha" && seg[2] == "resources" && get:
		return s.haRead(r, seg[3])
	case n == 4 && seg[0] == "cluster" && seg[1] == "ha" && seg[2] == "resources" && del:
		return s.haDelete(r, seg[3])
	case n == 3 && seg[0] == "cluster" && seg[1] == "ha" && seg[2] == "rules" && get:
		return s.haRulesIndex(r)
	case n == 3 && seg[0] == "cluster" && seg[1] == "ha" && seg[2] == "rules" && post:
		return s.haRuleCreate(r)
	case n == 4 && seg[0] == "cluster" && seg[1] == "ha" && seg[2] == "rules" && get:
		return s.haRuleRead(r, seg[3])
	case n == 4 && seg[0] == "cluster" && seg[1] == "ha" && seg[2] == "rules" && r.method == http.MethodPut:
		return s.haRuleUpdate(r, seg[3])
	case n == 4 && seg[0] == "cluster" && seg[1] == "ha" && seg[2] == "rules" && del:
		return s.haRuleDelete(r, seg[3])
	case n == 1 && seg[0] == "nodes" && get:
		return s.listNodes(), nil
	case n == 3 && seg[0] == "cluster" && seg[1] == "mapping" && seg[2] == "pci" && get:
		return s.mappingIndex(r)
	case n == 4 && seg[0] == "cluster" && seg[1] == "mapping" && seg[2] == "pci" && get:
		return s.mappingGet(r, seg[3])
	case n == 2 && seg[0] == "storage" && get:
		return s.storageConfig(r, seg[1])
	}
	if n >= 2 && seg[0] == "nodes" && seg[1] != s.node.Name {
		// pveproxy forwards a call for another member to that node
		// (proxyto => 'node'); a node pvesim runs in full answers it, a
		// node only holding seeded guests answers for those.
		if peer := s.peer(seg[1]); peer != nil {
			return peer.routeNode(ctx, r, seg[2:])
		}
		if s.isOtherNode(seg[1]) {
			return s.routeOther(ctx, r, seg[1], seg[2:])
		}
		return nil, errf(500, "hostname lookup '%s' failed - failed to get address info for: %s: Name or service not known", seg[1], seg[1])
	}
	if n >= 2 && seg[0] == "nodes" {
		return s.routeNode(ctx, r, seg[2:])
	}
	return nil, errf(http.StatusNotImplemented, "Method '%s %s' not implemented", r.method, r.path)
}

// routeNode answers a call below /nodes/{node}/ for this node.
func (s *Server) routeNode(ctx context.Context, r *request, rest []string) (any, *apiError) {
	get, post, put, del := r.method == http.MethodGet, r.method == http.MethodPost, r.method == http.MethodPut, r.method == http.MethodDelete
	{
		s.mu.Lock()
		online := s.nodeOnline
		s.mu.Unlock()
		if !online {
			return nil, errf(595, "Connection refused")
		}
		if aerr := s.checkParams(r); aerr != nil {
			return nil, aerr
		}
		m := len(rest)
		switch {
		case m == 3 && rest[0] == "qemu" && rest[2] == "migrate" && post:
			return s.migrateVM(r, rest[1])
		case m == 1 && rest[0] == "status" && get:
			return s.nodeStatus(r)
		case m == 2 && rest[0] == "apt" && rest[1] == "versions" && get:
			return s.aptVersions(r)
		case m == 1 && rest[0] == "rrddata" && get:
			return s.rrdData(r)
		case m == 2 && rest[0] == "hardware" && rest[1] == "pci" && get:
			return s.hardwarePCI(r)
		case m == 1 && rest[0] == "network" && get:
			return s.listNetwork(r), nil
		case m == 1 && rest[0] == "storage" && get:
			return s.listStorage(r), nil
		case m == 3 && rest[0] == "storage" && rest[2] == "status" && get:
			return s.storageStatus(r, rest[1])
		case m == 3 && rest[0] == "storage" && rest[2] == "content" && get:
			return s.storageContent(r, rest[1])
		case m == 3 && rest[0] == "storage" && rest[2] == "download-url" && post:
			return s.downloadURL(r, rest[1])
		case m == 1 && rest[0] == "qemu" && get:
			return s.listQemu(r), nil
		case m == 1 && rest[0] == "qemu" && post:
			return s.createVM(r)
		case m == 2 && rest[0] == "qemu" && del:
			return s.deleteVM(r, rest[1])
		case m == 3 && rest[0] == "qemu" && rest[2] == "config" && get:
			return s.getConfig(r, rest[1])
		case m == 3 && rest[0] == "qemu" && rest[2] == "config" && put:
			return s.updateConfig(ctx, r, rest[1], false)
		case m == 3 && rest[0] == "qemu" && rest[2] == "config" && post:
			return s.updateConfig(ctx, r, rest[1], true)
		case m == 3 && rest[0] == "qemu" && rest[2] == "pending" && get:
			return s.getPending(r, rest[1])
		case m == 3 && rest[0] == "qemu" && rest[2] == "resize" && put:
			return s.resize(r, rest[1])
		case m == 4 && rest[0] == "qemu" && rest[2] == "status" && rest[3] == "current" && get:
			return s.statusCurrent(r, rest[1])
		case m == 4 && rest[0] == "qemu" && rest[2] == "status" && post:
			return s.powerAction(r, rest[1], rest[3])
		case m == 4 && rest[0] == "qemu" && rest[2] == "agent" && rest[3] == "network-get-interfaces" && get:
			return s.agentInterfaces(r, rest[1])
		case m == 4 && rest[0] == "qemu" && rest[2] == "agent" && rest[3] == "ping" && post:
			return s.agentPing(r, rest[1])
		case m == 3 && rest[0] == "tasks" && rest[2] == "status" && get:
			return s.taskStatus(r, rest[1])
		case m == 3 && rest[0] == "tasks" && rest[2] == "log" && get:
			return s.taskLog(r, rest[1])
		}
	}
	return nil, errf(http.StatusNotImplemented, "Method '%s %s' not implemented", r.method, r.path)
}

func haSID(id string) string {
	if strings.Contains(id, ":") {
		return id
	}
	return "vm:" + id
}

func (s *Server) getVersion() map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	release := s.version
	if parts := strings.Split(release, "."); len(parts) >= 2 {
		release = parts[0] + "." + parts[1]
	}
	return map[string]any{"version": s.version, "release": release, "repoid": s.repoid}
}

// count records one request under "METHOD /path".
func (s *Server) count(method, path string) {
	s.mu.Lock()
	s.counts[method+" "+path]++
	s.mu.Unlock()
}

// Counts returns how many requests arrived, keyed "METHOD /path" with the
// path below /api2/json.
func (s *Server) Counts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.counts))
	for k, v := range s.counts {
		out[k] = v
	}
	return out
}

// Count returns how many requests matched method and the path glob.
func (s *Server) Count(method, pathGlob string) int {
	n := 0
	for k, v := range s.Counts() {
		m, p, _ := strings.Cut(k, " ")
		if (method == "" || method == m) && globMatch(pathGlob, p) {
			n += v
		}
	}
	return n
}

// mutating says whether a counted request changes the host: POST, PUT and
// DELETE, leaving out logins (POST /access/ticket) and the guest agent's
// ping, which qemu-server registers as a POST (src/PVE/API2/Qemu/Agent.pm
// at 9.2.6) but which only asks the agent to answer.
func mutating(k string) bool {
	if k == "POST /access/ticket" || strings.HasSuffix(k, "/agent/ping") {
		return false
	}
	return strings.HasPrefix(k, "POST ") || strings.HasPrefix(k, "PUT ") || strings.HasPrefix(k, "DELETE ")
}

// MutatingCalls counts the requests that change the host (see mutating).
func (s *Server) MutatingCalls() int {
	n := 0
	for k, v := range s.Counts() {
		if mutating(k) {
			n += v
		}
	}
	return n
}

// MutatingCallList lists the mutating calls made, sorted, for test messages.
func (s *Server) MutatingCallList() []string {
	var out []string
	for k, v := range s.Counts() {
		if mutating(k) {
			out = append(out, fmt.Sprintf("%s ×%d", k, v))
		}
	}
	sort.Strings(out)
	return out
}

// ResetCounters forgets all counted requests.
func (s *Server) ResetCounters() {
	s.mu.Lock()
	s.counts = map[string]int{}
	s.mu.Unlock()
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func newUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
