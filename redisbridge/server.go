package redisbridge

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/internal/filewatch"
	"github.com/sluicehq/sluice/internal/tlsfiles"
	"github.com/sluicehq/sluice/internal/unixaddr"
	"github.com/sluicehq/sluice/redisbridge/internal/checkio"
	"github.com/sluicehq/sluice/redisbridge/internal/h1fast"
	"github.com/sluicehq/sluice/redisbridge/internal/h2fast"
	"github.com/sluicehq/sluice/redisbridge/internal/overrides"
	"github.com/sluicehq/sluice/redisbridge/internal/policy"
	"github.com/sluicehq/sluice/redisbridge/internal/rls"
	"github.com/sluicehq/sluice/redisbridge/internal/store"
	"github.com/sluicehq/sluice/rules"
)

// Server is a bridge: an HTTP handler over a counter store.
type Server struct {
	set       Settings
	store     store.Store
	overrides *overrides.Set
	policy    *policy.Store              // nil without --policy-store
	rls       atomic.Pointer[rls.Config] // nil without --rls-config; Reload replaces it
	cert      *tlsfiles.Pair             // nil without --tls-cert
	clientCAs *tlsfiles.CAs              // nil without --tls-client-ca
	// rlsSeen is what reloadRLS last found in --rls-config.
	rlsMu   sync.Mutex
	rlsSeen filewatch.Seen
	spent   *overLimitCache // nil without --rls-over-limit-cache
	// stopXDS ends the --rls-xds client, and xdsDone is closed when it
	// has; nil without --rls-xds.
	stopXDS context.CancelFunc
	xdsDone chan struct{}
	// rlsHeaders names the RateLimit headers of --rls-response-headers
	// (empty: rls.DefaultHeaderNames).
	rlsHeaders [3]string
	log        *slog.Logger
	audit      *slog.Logger
	auditOut   io.Closer
	m          *metrics
	idem       *idemCache
	handler    http.Handler
	defSpec    rules.LimitSpec
	adminSum   [32]byte
	checkSum   [32]byte

	errLogAt   atomic.Int64 // unix ms of the last logged store error
	errSkipped atomic.Int64

	mu       sync.Mutex
	shutdown bool // Shutdown was called: Serve serves nothing
	srv      *http.Server
	fast     *h1fast.Server // cleartext only: the fast check path in front of srv
	h2       *h2fast.Server // cleartext only: h2c connections, relaying to srv what is not a check
}

// New builds a bridge from validated settings. It does not listen yet.
func New(set Settings) (*Server, error) {
	if err := set.Validate(); err != nil {
		return nil, err
	}
	s := &Server{set: set, m: newMetrics(), idem: newIdemCache(10_000, 5*time.Minute)}
	s.rlsHeaders, _ = set.rlsHeaderNames() // checked by Validate
	s.set.NearLimitRatio = set.nearLimitRatio()
	if set.RLSConfig != "" {
		cfg, files, err := set.loadRLS()
		if err != nil {
			return nil, err
		}
		s.rls.Store(cfg)
		s.rlsSeen.Note(files, nil)
	}
	var xdsTLS *tls.Config
	if set.RLSXDS != "" {
		var err error
		if xdsTLS, err = set.xdsTLS(); err != nil {
			return nil, err
		}
	}
	if s.servesRLS() && set.RLSOverLimitCache > 0 {
		s.spent = newOverLimitCache(set.RLSOverLimitCache, set.Now)
	}
	if set.TLSCert != "" {
		var err error
		if s.cert, err = tlsfiles.Load(set.TLSCert, set.TLSKey); err != nil {
			return nil, err
		}
	}
	if set.TLSClientCA != "" {
		var err error
		if s.clientCAs, err = tlsfiles.LoadCAs("--tls-client-ca", set.TLSClientCA); err != nil {
			return nil, err
		}
	}
	s.log = set.Logger
	if s.log == nil {
		lvl, _ := parseLevel(set.LogLevel)
		s.log = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	}
	if len(set.notes) > 0 {
		s.log.Warn("envoyproxy/ratelimit settings that change nothing here", "settings", set.notes)
	}
	var auditW io.Writer = os.Stderr
	if set.AuditLog != "" && set.AuditLog != "-" {
		f, err := os.OpenFile(set.AuditLog, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return nil, fmt.Errorf("--audit-log: %w", err)
		}
		auditW, s.auditOut = f, f
	}
	s.audit = slog.New(slog.NewJSONHandler(auditW, nil)).With("log", "audit")
	alg, _ := rules.ParseAlgorithm(set.DefaultAlgorithm)
	s.defSpec = rules.LimitSpec{Algorithm: alg, Limit: set.DefaultLimit, WindowMS: set.DefaultWindow.Milliseconds(), Burst: set.DefaultLimit, Cost: 1}
	if set.AdminKey != "" {
		s.adminSum = sha256.Sum256([]byte(set.AdminKey))
	}
	if set.CheckToken != "" {
		s.checkSum = sha256.Sum256([]byte(set.CheckToken))
	}
	var ob overrides.Backend
	switch set.Store {
	case "redis":
		ro := store.RedisOptions{
			URL: set.RedisURL, PoolSize: set.RedisPoolSize, Timeout: set.RedisTimeout,
			Pipelines: set.RedisPipelines, CallChecks: set.RedisBatch, Logger: s.log,
		}
		if err := loadRedisTLS(&set, &ro); err != nil {
			s.closeAudit()
			return nil, err
		}
		r, err := store.NewRedis(ro)
		if err != nil {
			s.closeAudit()
			return nil, fmt.Errorf("--redis-url: %w", err)
		}
		s.store = r
		ob = r.Overrides(time.Second)
	default:
		s.store = store.NewMemory(store.MemoryOptions{MaxKeys: set.MemoryMaxKeys, Now: set.Now})
		ob = overrides.NewMemory()
	}
	if set.PolicyStore != "" {
		ps, err := policy.Open(policy.Options{URL: set.PolicyStore, Logger: s.log, Registerer: s.m.reg})
		if err != nil {
			s.store.Close()
			s.closeAudit()
			return nil, fmt.Errorf("--policy-store: %w", err)
		}
		s.policy = ps
		ob = ps.Overrides()
	}
	s.overrides = overrides.New(ob, s.log)
	s.handler = s.routes()
	if set.RLSXDS != "" {
		// Last, once nothing can fail: the client runs until Close.
		ctx, stop := context.WithCancel(context.Background())
		s.stopXDS, s.xdsDone = stop, make(chan struct{})
		go func() {
			defer close(s.xdsDone)
			s.watchXDS(ctx, xdsTLS)
		}()
	}
	return s, nil
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+checkPath, s.handleCheck) // the token is checked in the check core
	mux.HandleFunc("POST /v1/rate-limit/batch-check", s.checker(s.handleBatch))
	mux.HandleFunc("GET /v1/rate-limit/status/{user_id}/{endpoint...}", s.checker(s.handleStatus))
	mux.HandleFunc("PUT /v1/rate-limit/config", s.admin("config.put", s.handlePutConfig))
	mux.HandleFunc("GET /v1/rate-limit/config/{user_id}/{endpoint...}", s.admin("config.get", s.handleGetConfig))
	mux.HandleFunc("POST /v1/rate-limit/reset", s.admin("reset", s.handleReset))
	mux.HandleFunc("POST "+rlsPath, s.handleRLS) // the token is checked in handleRLS
	mux.HandleFunc("POST /json", s.handleRLSJSON)
	mux.HandleFunc("POST "+healthPath, s.handleHealth)
	s.policyRoutes(mux)
	return s.withProbes(mux)
}

// HealthHandler serves only /healthz, /readyz (and /healthcheck) and
// /metrics, as the bridge's listener does: for --health-listen, a
// listener of their own that Kubernetes' probes and Prometheus reach
// without the client certificate --tls-client-ca asks of everything else.
func (s *Server) HealthHandler() http.Handler { return s.withProbes(http.NewServeMux()) }

// withProbes adds the probes and metrics to mux, and a 404 for what it
// does not serve, and gives each request an id.
func (s *Server) withProbes(mux *http.ServeMux) http.Handler {
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.handleReady)
	// envoyproxy/ratelimit's probe path, so that its deployments' probes
	// (Envoy Gateway's, say) keep working with the bridge in its place.
	mux.HandleFunc("GET /healthcheck", s.handleReady)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, &apiError{http.StatusNotFound, codeNotFound, "path", "no such endpoint: " + r.Method + " " + r.URL.Path})
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Request-Id") == "" {
			r.Header.Set("X-Request-Id", newRequestID())
		}
		w.Header().Set("X-Request-Id", r.Header.Get("X-Request-Id"))
		mux.ServeHTTP(w, r)
	})
}

// Handler is the bridge's HTTP handler. A gateway that embeds the bridge
// (wasmhost.Options.Handlers) has it answer the plugin's checks without
// net/http's requests and responses in between.
func (s *Server) Handler() http.Handler { return embedded{s.handler, s} }

// Serve answers HTTP/1.1 and h2c (or, with TLS settings, HTTPS with h2) on
// ln until Shutdown. It returns nil after a Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	srv := s.httpServer()
	s.mu.Lock()
	if s.shutdown { // a signal during start: nothing to serve, nothing to wait for
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	if s.srv != nil {
		s.mu.Unlock()
		return errors.New("redisbridge: Serve called twice")
	}
	s.srv = srv
	if s.cert != nil {
		s.mu.Unlock()
		srv.TLSConfig = tlsfiles.Config(s.cert)
		if s.clientCAs != nil {
			s.clientCAs.RequireClients(srv.TLSConfig, s.set.clientSANs())
		}
		return serverClosed(srv.ServeTLS(ln, "", ""))
	}
	fast := h1fast.New(ln, checkio.HandlerFunc(s.serveCheck))
	fast.SetMaxAge(s.set.MaxConnectionAge)
	var serveRLS checkio.Handler // nil: no rate limit service, and its calls go to net/http
	if s.servesRLS() {
		serveRLS = checkio.HandlerFunc(s.serveRLS)
	}
	s.h2 = h2fast.New(h2fast.Options{Handler: checkio.HandlerFunc(s.serveCheck), RLS: serveRLS, Handoff: fast.Give,
		MaxBody: maxBody, IdleTimeout: srv.IdleTimeout, MaxAge: s.set.MaxConnectionAge})
	fast.ServeH2(s.h2.ServeConn)
	s.fast = fast
	s.mu.Unlock()
	httpDone := make(chan error, 1)
	go func() {
		err := srv.Serve(fast.Handoff())
		fast.Handoff().Close() // connections handed over from now on are closed
		httpDone <- err
	}()
	if err := fast.Serve(); err != nil {
		return err
	}
	return serverClosed(<-httpDone)
}

// httpServer is net/http's server of the bridge: what the fast paths
// hand over, TLS, and, in tests, all of it.
func (s *Server) httpServer() *http.Server {
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		Protocols:         new(http.Protocols),
		// net/http's HTTP/2 server writes an answer's HEADERS on another
		// goroutine with the connection's HPACK encoder while its read
		// loop applies the peer's SETTINGS_HEADER_TABLE_SIZE to that
		// encoder (h2_bundle.go: startFrameWrite, processSetting): a peer
		// changing it mid-connection corrupted the answers' headers or
		// crashed the process ("concurrent map read and map write").
		// Below the size of any entry, the encoder's table stays empty
		// and the setting touches nothing the writer uses. h2fast, which
		// serves h2c, has its own encoder under its lock.
		HTTP2: &http.HTTP2Config{MaxEncoderHeaderTableSize: 1},
	}
	srv.Protocols.SetHTTP1(true)
	if s.set.TLSCert != "" {
		srv.Protocols.SetHTTP2(true)
	} else {
		srv.Protocols.SetUnencryptedHTTP2(true)
	}
	return srv
}

// Reload reads --rls-config and the TLS pair again, whatever changed
// (cmd/redisbridge calls it on SIGHUP). What is refused leaves what it
// would replace in place; the log, and the error, say why.
func (s *Server) Reload() error { return s.reload(true) }

// ReloadChanged is Reload of the files that were added, removed or
// changed since they were last read (cmd/redisbridge calls it every
// --watch); files refused are logged once, not at every look.
func (s *Server) ReloadChanged() error { return s.reload(false) }

func (s *Server) reload(always bool) error {
	err := s.reloadRLS(always)
	// logged says how a file's reload went, and keeps its error.
	logged := func(read bool, ferr error, refused, reloaded string, attrs ...any) {
		switch {
		case ferr != nil:
			s.log.Error(refused, "err", ferr)
		case read:
			s.log.Info(reloaded, attrs...)
		}
		err = errors.Join(err, ferr)
	}
	if s.cert != nil {
		read, ferr := s.cert.Reload(always)
		logged(read, ferr, "TLS certificate refused; the one served stays", "TLS certificate reloaded", "cert", s.set.TLSCert, "not_after", s.cert.NotAfter())
	}
	if s.clientCAs != nil {
		read, ferr := s.clientCAs.Reload(always)
		logged(read, ferr, "client CAs refused; the ones in use stay", "client CAs reloaded", "file", s.set.TLSClientCA)
	}
	return err
}

func serverClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// ListenAndServe listens on Settings.Listen, prints "listening on ADDR" to
// stderr, and serves until Shutdown.
func (s *Server) ListenAndServe() error {
	ln, err := s.Listen()
	if err != nil {
		return err
	}
	return s.Serve(ln)
}

// Listen listens on the settings' --listen address, for Serve: a caller
// that serves probes on an address of its own listens first, so that a
// probe never says ready while checks cannot yet be accepted.
func (s *Server) Listen() (net.Listener, error) {
	mode, _ := s.set.socketMode() // checked by Validate
	ln, err := listen(s.set.Listen, mode)
	if err != nil {
		return nil, fmt.Errorf("--listen: %w", err)
	}
	fmt.Fprintf(os.Stderr, "listening on %s\n", ln.Addr())
	return ln, nil
}

// Shutdown stops accepting requests and waits for those in flight. Called
// before Serve, it makes Serve return at once.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.shutdown = true
	srv, fast, h2 := s.srv, s.fast, s.h2
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	// At once: the fast paths' connections and net/http's each drain on
	// their own, and h2c streams that are not checks need net/http.
	errs := make(chan error, 3)
	var wg sync.WaitGroup
	if fast != nil {
		wg.Go(func() { errs <- fast.Shutdown(ctx) })
		wg.Go(func() { errs <- h2.Shutdown(ctx) })
	}
	wg.Go(func() { errs <- srv.Shutdown(ctx) })
	wg.Wait()
	close(errs)
	var err error
	for e := range errs {
		if err == nil {
			err = e
		}
	}
	return err
}

// Close releases the store and the audit log. Call after Shutdown.
func (s *Server) Close() error {
	if s.stopXDS != nil {
		s.stopXDS()
		<-s.xdsDone
	}
	s.overrides.Close()
	if s.policy != nil {
		s.policy.Close()
	}
	err := s.store.Close()
	s.closeAudit()
	return err
}

func (s *Server) closeAudit() {
	if s.auditOut != nil {
		_ = s.auditOut.Close()
	}
}

// handleReady answers /readyz and /healthcheck: ready while the store
// answers and, with --rls-ready-needs-config, the rate limit service has
// a domain configured; else 503.
func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	if err := s.store.Ping(r.Context()); err != nil {
		s.storeFailed("ping", err)
		writeError(w, r, storeError(err))
		return
	}
	if s.set.RLSReadyNeedsConfig && s.rlsWaiting() {
		writeError(w, r, &apiError{http.StatusServiceUnavailable, codeServiceUnavailable, "",
			"the rate limit service has no configuration with a domain yet (--rls-ready-needs-config)"})
		return
	}
	ready := map[string]any{"status": "ready", "store": s.set.Store}
	if s.policy != nil {
		// Detail only: a policy store that is down leaves the last policy
		// in force and never fails a check, so the bridge stays ready.
		ready["policy"] = s.policy.Status()
	}
	writeJSON(w, ready)
}

// storeFailed counts a store error and logs it, at most once a second so an
// outage does not flood the log.
func (s *Server) storeFailed(op string, err error) {
	s.m.storeErrors.WithLabelValues(op).Inc()
	now := time.Now().UnixMilli()
	last := s.errLogAt.Load()
	if now-last < 1000 || !s.errLogAt.CompareAndSwap(last, now) {
		s.errSkipped.Add(1)
		return
	}
	s.log.Error("store_error", "op", op, "err", err.Error(), "unavailable", errors.Is(err, store.ErrUnavailable),
		"suppressed_since_last", s.errSkipped.Swap(0))
}

// loadRedisTLS reads the Redis CA and client certificate files once, at
// start, so a bad file stops the start with the setting's name.
func loadRedisTLS(set *Settings, ro *store.RedisOptions) error {
	var err error
	ro.RootCAs, ro.Certificates, err = clientTLSFiles("--redis-tls", set.RedisTLSCA, set.RedisTLSCert, set.RedisTLSKey)
	return err
}

// listen listens on addr: "host:port", or "unix:///path" for a Unix socket,
// for a proxy on the same machine (an Envoy cluster with a pipe address, or
// the gateway's unix:// cluster) to reach without the TCP stack. The
// socket's file takes mode when it is not 0 (as an Envoy pipe address's
// mode), else the process's umask: a proxy running as another user needs
// write permission on it. A socket file left by a bridge that did not
// stop cleanly is replaced; one another process still listens on is not.
func listen(addr string, mode os.FileMode) (net.Listener, error) {
	sock, ok := unixaddr.Path(addr)
	if !ok {
		return net.Listen("tcp", addr)
	}
	if fi, err := os.Lstat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: another process listens on it", sock)
		}
		os.Remove(sock) // stale: nothing answers
	}
	ln, err := net.Listen("unix", sock)
	if err != nil || mode == 0 {
		return ln, err
	}
	if err := os.Chmod(sock, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("--listen-mode: %w", err)
	}
	return ln, nil
}
