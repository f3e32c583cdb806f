package redisbridge

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/redisbridge/internal/store"
	"github.com/sluicehq/sluice/rules"
)

// Server is a bridge: an HTTP handler over a counter store.
type Server struct {
	set      Settings
	store    store.Store
	log      *slog.Logger
	audit    *slog.Logger
	auditOut io.Closer
	m        *metrics
	idem     *idemCache
	handler  http.Handler
	defSpec  rules.LimitSpec
	adminSum [32]byte
	checkSum [32]byte

	errLogAt   atomic.Int64 // unix ms of the last logged store error
	errSkipped atomic.Int64

	mu  sync.Mutex
	srv *http.Server
	h1  *http1 // cleartext only: the fast check path in front of srv
}

// New builds a bridge from validated settings. It does not listen yet.
func New(set Settings) (*Server, error) {
	if err := set.Validate(); err != nil {
		return nil, err
	}
	s := &Server{set: set, m: newMetrics(), idem: newIdemCache(10_000, 5*time.Minute)}
	s.log = set.Logger
	if s.log == nil {
		lvl, _ := parseLevel(set.LogLevel)
		s.log = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
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
	alg, _ := rules.ParseAlgorithm(set.DefaultStrategy)
	s.defSpec = rules.LimitSpec{Algorithm: alg, Limit: set.DefaultLimit, WindowMS: set.DefaultWindow.Milliseconds(), Burst: set.DefaultLimit, Cost: 1}
	if set.AdminKey != "" {
		s.adminSum = sha256.Sum256([]byte(set.AdminKey))
	}
	if set.CheckToken != "" {
		s.checkSum = sha256.Sum256([]byte(set.CheckToken))
	}
	switch set.Store {
	case "redis":
		ro := store.RedisOptions{
			URL: set.RedisURL, PoolSize: set.RedisPoolSize, Timeout: set.RedisTimeout,
			Pipelines: set.RedisPipelines, Logger: s.log,
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
	default:
		s.store = store.NewMemory(store.MemoryOptions{MaxKeys: set.MemoryMaxKeys, Now: set.Now})
	}
	s.handler = s.routes()
	return s, nil
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/rate-limit/check", s.checker(s.handleCheck))
	mux.HandleFunc("POST /v1/rate-limit/batch-check", s.checker(s.handleBatch))
	mux.HandleFunc("GET /v1/rate-limit/status/{user_id}/{endpoint...}", s.checker(s.handleStatus))
	mux.HandleFunc("PUT /v1/rate-limit/config", s.admin("config.put", s.handlePutConfig))
	mux.HandleFunc("GET /v1/rate-limit/config/{user_id}/{endpoint...}", s.admin("config.get", s.handleGetConfig))
	mux.HandleFunc("POST /v1/rate-limit/reset", s.admin("reset", s.handleReset))
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.handleReady)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, http.StatusNotFound, codeNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path, nil)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Request-Id") == "" {
			r.Header.Set("X-Request-Id", newRequestID())
		}
		w.Header().Set("X-Request-Id", r.Header.Get("X-Request-Id"))
		mux.ServeHTTP(w, r)
	})
}

// Handler is the bridge's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve answers HTTP/1.1 and h2c (or, with TLS settings, HTTPS with h2) on
// ln until Shutdown. It returns nil after a Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		Protocols:         new(http.Protocols),
	}
	srv.Protocols.SetHTTP1(true)
	if s.set.TLSCert != "" {
		srv.Protocols.SetHTTP2(true)
	} else {
		srv.Protocols.SetUnencryptedHTTP2(true)
	}
	s.mu.Lock()
	if s.srv != nil {
		s.mu.Unlock()
		return errors.New("redisbridge: Serve called twice")
	}
	s.srv = srv
	if s.set.TLSCert != "" {
		s.mu.Unlock()
		return serverClosed(srv.ServeTLS(ln, s.set.TLSCert, s.set.TLSKey))
	}
	h := &http1{s: s, ln: ln, handoff: newChanListener(ln.Addr()), conns: map[*fastConn]struct{}{}}
	s.h1 = h
	s.mu.Unlock()
	httpDone := make(chan error, 1)
	go func() {
		err := srv.Serve(h.handoff)
		h.handoff.Close() // connections handed over from now on are closed
		httpDone <- err
	}()
	if err := h.serve(); err != nil {
		return err
	}
	return serverClosed(<-httpDone)
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
	ln, err := net.Listen("tcp", s.set.Listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	fmt.Fprintf(os.Stderr, "listening on %s\n", ln.Addr())
	return s.Serve(ln)
}

// Shutdown stops accepting requests and waits for those in flight.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	srv, h := s.srv, s.h1
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	var err error
	if h != nil {
		err = h.shutdown(ctx)
	}
	if e := srv.Shutdown(ctx); err == nil {
		err = e
	}
	return err
}

// Close releases the store and the audit log. Call after Shutdown.
func (s *Server) Close() error {
	err := s.store.Close()
	s.closeAudit()
	return err
}

func (s *Server) closeAudit() {
	if s.auditOut != nil {
		_ = s.auditOut.Close()
	}
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	if err := s.store.Ping(r.Context()); err != nil {
		s.storeFailed("ping", err)
		writeError(w, r, http.StatusServiceUnavailable, codeServiceUnavailable, "counter store unavailable", nil)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready", "store": s.set.Store})
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

// bearer returns the credential of r: "Authorization: Bearer x" or, with
// allowAdminHeader, "X-Admin-Key: x".
func bearer(r *http.Request, allowAdminHeader bool) (string, bool) {
	if a := r.Header.Get("Authorization"); a != "" {
		if len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
			return strings.TrimSpace(a[7:]), true
		}
		return "", false
	}
	if allowAdminHeader {
		if k := r.Header.Get("X-Admin-Key"); k != "" {
			return k, true
		}
	}
	return "", false
}

// keyMatches compares digests in constant time, so neither content nor
// length of the secret leaks through timing.
func keyMatches(got string, want [32]byte) bool {
	sum := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(sum[:], want[:]) == 1
}

// fingerprint names a key in the audit log without revealing it.
func fingerprint(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:8])
}

func (s *Server) checker(h http.HandlerFunc) http.HandlerFunc {
	if s.set.CheckToken == "" {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		tok, ok := bearer(r, false)
		if !ok {
			w.Header().Set("WWW-Authenticate", "Bearer")
			writeError(w, r, http.StatusUnauthorized, codeUnauthorized, "missing bearer token", nil)
			return
		}
		if !keyMatches(tok, s.checkSum) {
			writeError(w, r, http.StatusForbidden, codeForbidden, "wrong bearer token", nil)
			return
		}
		h(w, r)
	}
}

type adminHandler func(w http.ResponseWriter, r *http.Request, who string)

func (s *Server) admin(action string, h adminHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.set.AdminKey == "" {
			s.m.adminOps.WithLabelValues(action, "disabled").Inc()
			writeError(w, r, http.StatusForbidden, codeForbidden, "admin API disabled: start the bridge with --admin-key", nil)
			return
		}
		key, ok := bearer(r, true)
		if !ok {
			s.m.adminOps.WithLabelValues(action, "unauthorized").Inc()
			w.Header().Set("WWW-Authenticate", "Bearer")
			writeError(w, r, http.StatusUnauthorized, codeUnauthorized, "missing admin key (Authorization: Bearer or X-Admin-Key)", nil)
			return
		}
		if !keyMatches(key, s.adminSum) {
			s.m.adminOps.WithLabelValues(action, "forbidden").Inc()
			s.audit.Warn("admin_denied", "who", fingerprint(key), "remote", r.RemoteAddr, "action", action, "request_id", requestID(r))
			writeError(w, r, http.StatusForbidden, codeForbidden, "wrong admin key", nil)
			return
		}
		s.m.adminOps.WithLabelValues(action, "ok").Inc()
		h(w, r, fingerprint(key))
	}
}

// idemCache replays batch-check answers for a repeated idempotency key.
// Entries live ttl; FIFO order is expiry order because ttl is fixed.
type idemCache struct {
	mu    sync.Mutex
	max   int
	ttl   time.Duration
	m     map[string]idemEntry
	order []string
}

type idemEntry struct {
	body []byte
	at   time.Time
}

func newIdemCache(max int, ttl time.Duration) *idemCache {
	return &idemCache{max: max, ttl: ttl, m: make(map[string]idemEntry)}
}

func (c *idemCache) get(key string, now time.Time) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || now.Sub(e.at) >= c.ttl {
		return nil, false
	}
	return e.body, true
}

func (c *idemCache) put(key string, body []byte, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[key]; ok && now.Sub(e.at) < c.ttl {
		return // the first answer stays the answer
	}
	for len(c.order) > 0 {
		oldest := c.order[0]
		e, ok := c.m[oldest]
		if ok && len(c.m) < c.max && now.Sub(e.at) < c.ttl {
			break
		}
		delete(c.m, oldest)
		c.order = c.order[1:]
	}
	c.m[key] = idemEntry{body: body, at: now}
	c.order = append(c.order, key)
}

// loadRedisTLS reads the Redis CA and client certificate files once, at
// start, so a bad file stops the start with the setting's name.
func loadRedisTLS(set *Settings, ro *store.RedisOptions) error {
	if set.RedisTLSCA != "" {
		pemBytes, err := os.ReadFile(set.RedisTLSCA)
		if err != nil {
			return fmt.Errorf("--redis-tls-ca: %w", err)
		}
		ro.RootCAs = x509.NewCertPool()
		if !ro.RootCAs.AppendCertsFromPEM(pemBytes) {
			return fmt.Errorf("--redis-tls-ca: no PEM certificate in %s", set.RedisTLSCA)
		}
	}
	if set.RedisTLSCert != "" {
		cert, err := tls.LoadX509KeyPair(set.RedisTLSCert, set.RedisTLSKey)
		if err != nil {
			return fmt.Errorf("--redis-tls-cert: %w", err)
		}
		ro.Certificates = []tls.Certificate{cert}
	}
	return nil
}
