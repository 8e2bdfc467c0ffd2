package gitsnap

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/pktline"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/plumbing/transport"
	gitserver "github.com/go-git/go-git/v5/plumbing/transport/server"
	"github.com/rs/zerolog"
)

const (
	// A replaced snapshot stays fetchable for retainReplaced (at most
	// maxReplaced of them), so a client that listed refs just before a swap
	// can still fetch what it was told: stateless HTTP splits a clone into
	// separate requests.
	retainReplaced = 2 * time.Minute
	maxReplaced    = 16
	// maxRequestBody bounds an upload-pack request: a request lists wants
	// and haves, never content.
	maxRequestBody = 8 << 20
	// shutdownGrace bounds how long in-flight clones may finish on shutdown.
	shutdownGrace = 10 * time.Second
	// pidHeader tells bootstrap which process answers at a URL, so a
	// recorded server is never confused with another one on the same port.
	pidHeader = "Gitsnap-Pid"
)

// ServerOptions configures a snapshot server.
type ServerOptions struct {
	// Build says what to snapshot.
	Build BuildOptions
	// Listen is the TCP address to listen on, e.g. "0.0.0.0:8089".
	Listen string
	// URL is the announced clone URL, e.g. "http://192.168.1.10:8089/homelab.git".
	// Its path is the only repository path served.
	URL string
	// Interval between re-snapshots; zero means only on Refresh.
	Interval time.Duration
	// StateDir, when set, is where a detached server's state file lives;
	// the server keeps the recorded hash current after each refresh.
	StateDir string
	// Auth, when set, is required of every request (HTTP basic auth); a
	// request without it gets 401 and nothing else.
	Auth *BasicAuth
	// TLSCert and TLSKey (PEM files), when set, make the server speak HTTPS.
	TLSCert, TLSKey string
	// Log receives the server's lines; the zero logger discards them.
	Log zerolog.Logger
}

type generation struct {
	current  *Snapshot
	replaced []replacedSnapshot // newest first
}

type replacedSnapshot struct {
	snap *Snapshot
	at   time.Time
}

// Server serves the latest snapshot of a work tree over git smart HTTP
// (protocol v0, read-only). It is an http.Handler safe for concurrent clones;
// a refresh swaps the snapshot atomically.
type Server struct {
	opts     ServerOptions
	log      zerolog.Logger
	repoPath string

	gen       atomic.Pointer[generation]
	refreshMu sync.Mutex
}

// NewServer validates opts and builds the first snapshot.
func NewServer(ctx context.Context, opts ServerOptions) (*Server, error) {
	repoPath, err := repoPathOf(opts.URL)
	if err != nil {
		return nil, err
	}
	snap, err := Build(ctx, opts.Build)
	if err != nil {
		return nil, err
	}
	if err := snap.Refusal(); err != nil {
		return nil, err
	}
	s := &Server{opts: opts, log: opts.Log, repoPath: repoPath}
	s.gen.Store(&generation{current: snap})
	return s, nil
}

func repoPathOf(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("snapshot URL %q: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("snapshot URL %q: scheme must be http or https (Flux rejects others)", raw)
	}
	if u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("snapshot URL %q: want http://host:port/path with no credentials, query or fragment", raw)
	}
	return strings.TrimSuffix(u.Path, "/"), nil
}

// Snapshot returns the snapshot currently served.
func (s *Server) Snapshot() *Snapshot { return s.gen.Load().current }

// URL is the announced clone URL.
func (s *Server) URL() string { return s.opts.URL }

// Refresh rebuilds the snapshot and, if its hash differs from the one
// served, swaps it in. It returns the snapshot now served and whether it
// changed. On error the previous snapshot stays served: also when the new
// one would withhold a file the cluster's build reads (Refusal), so the
// cluster keeps what it had instead of something else than git declares.
func (s *Server) Refresh(ctx context.Context) (*Snapshot, bool, error) {
	s.refreshMu.Lock()
	defer s.refreshMu.Unlock()
	snap, err := Build(ctx, s.opts.Build)
	if err != nil {
		return s.Snapshot(), false, fmt.Errorf("re-snapshotting %s: %w", s.opts.Build.Dir, err)
	}
	if err := snap.Refusal(); err != nil {
		return s.Snapshot(), false, fmt.Errorf("re-snapshotting %s: %w", s.opts.Build.Dir, err)
	}
	old := s.gen.Load()
	if snap.Hash == old.current.Hash {
		return old.current, false, nil
	}
	now := time.Now()
	replaced := []replacedSnapshot{{snap: old.current, at: now}}
	for _, r := range old.replaced {
		if len(replaced) < maxReplaced && now.Sub(r.at) < retainReplaced {
			replaced = append(replaced, r)
		}
	}
	s.gen.Store(&generation{current: snap, replaced: replaced})
	s.log.Info().Str("hash", snap.Hash.String()).Str("previous", old.current.Hash.String()).
		Int("files", snap.Files).Int("excluded", snap.Excluded.Total()).
		Msgf("snapshot changed: now serving %s (%d files: %s; withheld: %s)", snap.Hash, snap.Files, snap.Scope(), snap.WithheldList())
	if s.opts.StateDir != "" {
		if err := recordRefresh(s.opts.StateDir, os.Getpid(), snap.Hash.String(), withheldOrEmpty(snap)); err != nil {
			s.log.Warn().Err(err).Msg("recording the new snapshot hash in the state file")
		}
	}
	return snap, true, nil
}

// ListenAndServe listens on opts.Listen and calls Serve.
func (s *Server) ListenAndServe(ctx context.Context, refresh <-chan os.Signal) error {
	ln, err := net.Listen("tcp", s.opts.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s for the git snapshot server: %w", s.opts.Listen, err)
	}
	return s.Serve(ctx, ln, refresh)
}

// Serve serves on ln until ctx ends, then shuts down gracefully (bounded).
// Every value received on refresh (the CLI passes SIGHUP) and every
// opts.Interval triggers a Refresh; a failed refresh is logged and the old
// snapshot stays served.
func (s *Server) Serve(ctx context.Context, ln net.Listener, refresh <-chan os.Signal) error {
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       90 * time.Second,
	}
	if (s.opts.TLSCert == "") != (s.opts.TLSKey == "") {
		return errors.New("the snapshot server needs both a TLS certificate and its key, or neither")
	}
	errc := make(chan error, 1)
	if s.opts.TLSCert != "" {
		hs.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		go func() { errc <- hs.ServeTLS(ln, s.opts.TLSCert, s.opts.TLSKey) }()
	} else {
		go func() { errc <- hs.Serve(ln) }()
	}

	snap := s.Snapshot()
	s.log.Info().Str("url", s.opts.URL).Str("listen", ln.Addr().String()).Str("hash", snap.Hash.String()).
		Str("branch", snap.Branch).Int("files", snap.Files).Int("excluded", snap.Excluded.Total()).
		Msgf("serving snapshot %s of %s at %s (%d files: %s; withheld: %s)", snap.Hash, s.opts.Build.Dir, s.opts.URL, snap.Files, snap.Scope(), snap.WithheldList())
	if host := hostOf(s.opts.URL); host != "" {
		if ip := net.ParseIP(host); (ip != nil && ip.IsLoopback()) || host == "localhost" {
			s.log.Warn().Str("url", s.opts.URL).Msg("the announced URL is a loopback address: cluster pods cannot reach it")
		}
	}

	var tick <-chan time.Time
	if s.opts.Interval > 0 {
		t := time.NewTicker(s.opts.Interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
			defer cancel()
			if err := hs.Shutdown(sctx); err != nil {
				_ = hs.Close()
			}
			s.log.Info().Str("url", s.opts.URL).Msg("git snapshot server stopped")
			return nil
		case err := <-errc:
			return fmt.Errorf("serving the git snapshot on %s: %w", ln.Addr(), err)
		case sig := <-refresh:
			s.refreshLogged(ctx, fmt.Sprint(sig))
		case <-tick:
			s.refreshLogged(ctx, "interval")
		}
	}
}

func (s *Server) refreshLogged(ctx context.Context, trigger string) {
	snap, changed, err := s.Refresh(ctx)
	if err != nil {
		s.log.Error().Err(err).Str("trigger", trigger).Msg("re-snapshot failed; still serving the previous snapshot")
		return
	}
	if !changed {
		s.log.Debug().Str("trigger", trigger).Str("hash", snap.Hash.String()).Msg("work tree unchanged")
		return
	}
	s.log.Info().Str("trigger", trigger).Str("hash", snap.Hash.String()).Int("files", snap.Files).Int("excluded", snap.Excluded.Total()).
		Msgf("now serving snapshot %s (%d files: %s; withheld: %s)", snap.Hash, snap.Files, snap.Scope(), snap.WithheldList())
}

// withheldOrEmpty is the snapshot's withheld files, an empty (not nil)
// list when there are none, so the state file's list is replaced.
func withheldOrEmpty(snap *Snapshot) []Withheld {
	if snap.Withheld == nil {
		return []Withheld{}
	}
	return snap.Withheld
}

func hostOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// ServeHTTP implements the smart-HTTP endpoints of the one served
// repository; every other path is 404, and pushes are 403.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.opts.Auth != nil && !s.opts.Auth.allows(r) {
		// What git clients expect before they send credentials; no hint
		// of what is served.
		w.Header().Set("WWW-Authenticate", `Basic realm="bootstrap git snapshot", charset="UTF-8"`)
		http.Error(w, "authentication required", http.StatusUnauthorized)
		s.log.Debug().Str("remote", r.RemoteAddr).Str("path", r.URL.Path).Msg("refused a request without the snapshot credential")
		return
	}
	switch r.URL.Path {
	case s.repoPath + "/info/refs":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		switch r.URL.Query().Get("service") {
		case transport.UploadPackServiceName:
			s.advertise(w, r)
		case transport.ReceivePackServiceName:
			refusePush(w)
		default:
			http.Error(w, "only the smart HTTP protocol (git-upload-pack) is served", http.StatusForbidden)
		}
	case s.repoPath + "/" + transport.UploadPackServiceName:
		if r.Method != http.MethodPost {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		s.uploadPack(w, r)
	case s.repoPath + "/" + transport.ReceivePackServiceName:
		refusePush(w)
	default:
		http.NotFound(w, r)
	}
}

func refusePush(w http.ResponseWriter) {
	http.Error(w, "this is a read-only snapshot of a local work tree: push is not accepted", http.StatusForbidden)
}

type snapshotLoader struct{ sto storer.Storer }

func (l snapshotLoader) Load(*transport.Endpoint) (storer.Storer, error) { return l.sto, nil }

func uploadPackSession(snap *Snapshot) (transport.UploadPackSession, error) {
	ep, err := transport.NewEndpoint("/snapshot")
	if err != nil {
		return nil, err
	}
	return gitserver.NewServer(snapshotLoader{snap.storage}).NewUploadPackSession(ep, nil)
}

func (s *Server) advertise(w http.ResponseWriter, r *http.Request) {
	snap := s.Snapshot()
	sess, err := uploadPackSession(snap)
	if err != nil {
		s.internalError(w, "opening upload-pack session", err)
		return
	}
	ar, err := sess.AdvertisedReferencesContext(r.Context())
	if err != nil {
		s.internalError(w, "advertising references", err)
		return
	}
	// `git clone --depth 1` refuses a server without the shallow capability;
	// uploadPack answers depth requests itself.
	if err := ar.Capabilities.Add(capability.Shallow); err != nil {
		s.internalError(w, "advertising capabilities", err)
		return
	}
	ar.Prefix = [][]byte{[]byte("# service=" + transport.UploadPackServiceName), pktline.Flush}
	var buf bytes.Buffer
	if err := ar.Encode(&buf); err != nil {
		s.internalError(w, "encoding advertised references", err)
		return
	}
	w.Header().Set("Content-Type", "application/x-git-upload-pack-advertisement")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set(pidHeader, strconv.Itoa(os.Getpid()))
	_, _ = w.Write(buf.Bytes())
}

// uploadPack answers one stateless upload-pack round (protocol v0).
//
// The stock go-git session rejects shallow requests. Every snapshot is a
// single parentless commit, so a clone of any depth is the complete history
// and nothing is ever shallow: a deepen request is answered with an empty
// shallow-update, and then served like a full clone. The git CLI's first
// stateless round of a shallow clone carries no "done" and expects only the
// shallow list; the second carries "done" and gets the pack.
func (s *Server) uploadPack(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = http.MaxBytesReader(w, r.Body, maxRequestBody)
	if r.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(body)
		if err != nil {
			http.Error(w, "bad gzip request body", http.StatusBadRequest)
			return
		}
		defer gz.Close()
		body = io.LimitReader(gz, maxRequestBody)
	}
	req, haves, done, err := parseUploadPackRequest(body)
	if err != nil {
		http.Error(w, "bad upload-pack request: "+err.Error(), http.StatusBadRequest)
		return
	}

	w.Header().Set("Content-Type", "application/x-git-upload-pack-result")
	w.Header().Set("Cache-Control", "no-cache")
	enc := pktline.NewEncoder(w)

	snap := s.snapshotWith(req.Wants)
	if snap == nil {
		_ = enc.Encodef("ERR upload-pack: not our ref (the snapshot changed; fetch again)\n")
		return
	}
	var common []plumbing.Hash
	for _, h := range haves {
		if snap.has(h) {
			common = append(common, h)
		}
	}

	deepen := req.Depth != nil && !req.Depth.IsZero()
	if deepen {
		req.Depth = packp.DepthCommits(0)
		if err := enc.Flush(); err != nil {
			return
		}
	}
	// Shallow boundaries the client reports are its own business: no
	// snapshot commit has a parent to unshallow.
	req.Shallows = nil
	req.Capabilities.Delete(capability.Shallow)

	if !done {
		switch {
		case deepen:
			return
		case len(haves) > 0:
			if len(common) > 0 {
				_ = enc.Encodef("ACK %s\n", common[0])
			} else {
				_ = enc.Encodef("NAK\n")
			}
			return
		}
	}
	req.Haves = common

	sess, err := uploadPackSession(snap)
	if err != nil {
		_ = enc.Encodef("ERR upload-pack: %s\n", err)
		return
	}
	resp, err := sess.UploadPack(r.Context(), req)
	if err != nil {
		_ = enc.Encodef("ERR upload-pack: %s\n", err)
		return
	}
	if err := resp.Encode(w); err != nil && !errors.Is(err, context.Canceled) {
		s.log.Warn().Err(err).Str("snapshot", snap.Hash.String()).Msg("sending a pack to a git client failed")
	}
}

// snapshotWith returns the newest served snapshot holding every wanted object.
func (s *Server) snapshotWith(wants []plumbing.Hash) *Snapshot {
	g := s.gen.Load()
	candidates := []*Snapshot{g.current}
	for _, r := range g.replaced {
		candidates = append(candidates, r.snap)
	}
	for _, snap := range candidates {
		ok := true
		for _, h := range wants {
			if !snap.has(h) {
				ok = false
				break
			}
		}
		if ok {
			return snap
		}
	}
	return nil
}

// Bounds of one upload-pack request. A snapshot is one commit on one
// branch: a client has no reason to want more than a few objects, and the
// haves of a stateless fetch are its own history, resent each round.
const (
	maxWants = 64
	maxHaves = 1 << 16
)

// parseUploadPackRequest reads one stateless upload-pack request: the
// upload-request section (wants, capabilities, shallow and deepen lines),
// then "have" lines and an optional "done". Anything malformed or beyond
// the bounds is an error the handler answers with 400; it never panics
// (FuzzUploadPackRequest).
func parseUploadPackRequest(body io.Reader) (*packp.UploadPackRequest, []plumbing.Hash, bool, error) {
	req := packp.NewUploadPackRequest()
	if err := req.UploadRequest.Decode(body); err != nil {
		return nil, nil, false, err
	}
	if len(req.Wants) > maxWants {
		return nil, nil, false, fmt.Errorf("%d wants: at most %d are served", len(req.Wants), maxWants)
	}
	haves, done, err := readHaves(body)
	if err != nil {
		return nil, nil, false, err
	}
	return req, haves, done, nil
}

// readHaves reads the rest of an upload-pack request after the
// upload-request section: "have" lines, flushes and an optional "done".
func readHaves(r io.Reader) ([]plumbing.Hash, bool, error) {
	sc := pktline.NewScanner(r)
	var haves []plumbing.Hash
	for sc.Scan() {
		if len(haves) >= maxHaves {
			return nil, false, fmt.Errorf("more than %d haves", maxHaves)
		}
		line := bytes.TrimSuffix(sc.Bytes(), []byte("\n"))
		switch {
		case len(line) == 0:
			continue
		case bytes.Equal(line, []byte("done")):
			return haves, true, nil
		case bytes.HasPrefix(line, []byte("have ")):
			h := string(line[len("have "):])
			if len(h) != 40 || !plumbing.IsHash(h) {
				return nil, false, fmt.Errorf("malformed have line %q", line)
			}
			haves = append(haves, plumbing.NewHash(h))
		default:
			return nil, false, fmt.Errorf("unexpected line %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, false, err
	}
	return haves, false, nil
}

func (s *Server) internalError(w http.ResponseWriter, what string, err error) {
	s.log.Error().Err(err).Msg(what)
	http.Error(w, what+" failed", http.StatusInternalServerError)
}
