// Command gateway is a small reverse proxy that runs the Sluice plugin
// (build/plugin.wasm) in the wasmhost proxy-wasm host in front of an upstream,
// for users without Envoy:
//
//	gateway --listen :8080 --plugin build/plugin.wasm --config examples/config.json \
//	        --upstream http://127.0.0.1:9000 --cluster sluice_bridge=http://127.0.0.1:8081
//
// SIGHUP reloads --config, the TLS pair and --upstream-tls-ca, and every
// --watch those that changed are reloaded; a file refused leaves what it
// would replace in place. SIGINT/SIGTERM stop it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/sluicehq/sluice/internal/filewatch"
	"github.com/sluicehq/sluice/internal/rawsock"
	"github.com/sluicehq/sluice/internal/tlsfiles"
	"github.com/sluicehq/sluice/internal/unixaddr"
	"github.com/sluicehq/sluice/wasmhost"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) { // -h: the usage is printed, and asked for
			return
		}
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

type clusterFlag map[string]string

func (c clusterFlag) String() string { return fmt.Sprint(map[string]string(c)) }

func (c clusterFlag) Set(v string) error {
	name, target, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return errors.New("want NAME=URL")
	}
	if strings.HasPrefix(target, unixaddr.Scheme) {
		if err := unixaddr.Check(target); err != nil {
			return err
		}
	} else if u, err := url.Parse(target); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http(s) or unix:// URL", target)
	}
	c[name] = target
	return nil
}

func (clusterFlag) repeatable() {}

// valuesFlag is a repeatable flag of values that are not empty: file
// paths, names.
type valuesFlag []string

func (l *valuesFlag) String() string { return strings.Join(*l, ",") }

func (l *valuesFlag) Set(v string) error {
	if v == "" {
		return errors.New("a value is empty")
	}
	*l = append(*l, v)
	return nil
}

func (*valuesFlag) repeatable() {}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	if v == "" || strings.ContainsAny(v, " :\t") {
		return fmt.Errorf("%q is not a header name", v)
	}
	*l = append(*l, v)
	return nil
}

func (*listFlag) repeatable() {}

// envFlag lists the environment variables the plugin VM gets, as Envoy's
// vm_config.environment_variables: NAME passes the gateway's own value
// when it has one (host_env_keys), NAME=VALUE gives one (key_values).
// Envoy merges the two and refuses a name given twice, and leaves out a
// host key it does not have (source/extensions/common/wasm/plugin.cc,
// WasmConfig); so does the gateway.
// policyFlag is --failure-policy.
type policyFlag struct{ wasmhost.FailurePolicy }

func (p *policyFlag) String() string {
	if p == nil {
		return wasmhost.FailReload.String()
	}
	return p.FailurePolicy.String()
}

func (p *policyFlag) Set(v string) error {
	for _, fp := range []wasmhost.FailurePolicy{wasmhost.FailClosed, wasmhost.FailOpen, wasmhost.FailReload} {
		if v == fp.String() {
			p.FailurePolicy = fp
			return nil
		}
	}
	return fmt.Errorf("must be fail_reload, fail_closed or fail_open")
}

type envFlag []envVar

type envVar struct {
	name, value string
	fromHost    bool
}

func (e *envFlag) String() string {
	var parts []string
	for _, v := range *e {
		parts = append(parts, v.name)
	}
	return strings.Join(parts, ",")
}

func (e *envFlag) Set(v string) error {
	name, value, explicit := strings.Cut(v, "=")
	if name == "" || strings.ContainsAny(name, "\x00") {
		return fmt.Errorf("%q: want NAME or NAME=VALUE", v)
	}
	for _, prev := range *e {
		if prev.name == name {
			return fmt.Errorf("%s is given twice", name)
		}
	}
	*e = append(*e, envVar{name: name, value: value, fromHost: !explicit})
	return nil
}

func (*envFlag) repeatable() {}

// environment is the VM's environment: explicit values, and the named
// variables the gateway itself has (absent ones are left out, as Envoy
// leaves out host_env_keys it does not have).
func (e envFlag) environment(lookupEnv func(string) (string, bool)) map[string]string {
	if len(e) == 0 {
		return nil
	}
	out := map[string]string{}
	for _, v := range e {
		if !v.fromHost {
			out[v.name] = v.value
		} else if val, ok := lookupEnv(v.name); ok {
			out[v.name] = val
		}
	}
	return out
}

// repeatableFlag marks flags whose environment variable holds a
// comma-separated list.
type repeatableFlag interface{ repeatable() }

type settings struct {
	listen, plugin, config, upstream string
	clusters                         clusterFlag
	routes                           routeFlag
	strip                            listFlag
	env                              envFlag
	workers                          int
	failure                          policyFlag
	appendXFF                        bool
	logLevel                         string
	cacheDir                         string
	idleTimeout, upstreamTimeout     time.Duration
	shutdownGrace                    time.Duration
	watch                            time.Duration
	adminListen                      string
	maxRequestHeadersKB              int
	tlsCert, tlsKey                  valuesFlag
	clientCA                         string
	clientSANs                       valuesFlag
	clientOptional                   bool
	accessLog                        string
	accessLogFormat, accessLogJSON   string
	upstreamProtocol                 string
	validate                         bool
	embedBridge                      string
	preserveRequestID                bool
	upstreamCA                       string
	cas                              *tlsfiles.CAs    // upstreamCA's certificates, read again on SIGHUP and --watch
	clientCAs                        *tlsfiles.CAs    // clientCA's
	now                              func() time.Time // tests: the clock of upstream service times; default time.Now
}

// envPrefix: every flag --x-y may also be set as SLUICE_GATEWAY_X_Y.
const envPrefix = "SLUICE_GATEWAY_"

// envName is the environment variable of a flag.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func flagSet(s *settings) *flag.FlagSet {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.StringVar(&s.listen, "listen", ":8080", "address to serve on")
	fs.StringVar(&s.plugin, "plugin", "build/plugin.wasm", "the plugin .wasm")
	fs.StringVar(&s.config, "config", "examples/config.json", "the plugin's JSON configuration; read again on SIGHUP and when it changes (--watch)")
	fs.StringVar(&s.upstream, "upstream", "", "the upstream base URL, e.g. http://127.0.0.1:9000; with --route, where the requests no route matches go")
	fs.Var(&s.routes, "route", "[HOST]PATH=URL[ timeout=DURATION][ rewrite=PATH][ host=HOST] (repeatable): requests whose path (and :authority, when HOST is given) match go to URL; the first match in the order given wins. HOST and PATH are patterns as in the plugin's configuration, e.g. /api/**=http://127.0.0.1:9001 or admin.example.com/**=http://127.0.0.1:9002; timeout= is the route's own --upstream-timeout, e.g. '/reports/**=http://127.0.0.1:9003 timeout=2m'; rewrite= replaces the part of the path the route's exact, prefix: or /base/** path matched, as Envoy's prefix_rewrite, e.g. '/api/v1/**=http://127.0.0.1:9001 rewrite=/v1'; host= is the Host the upstream gets, as Envoy's host_rewrite_literal")
	fs.Var(s.clusters, "cluster", "a call-out cluster NAME=URL (repeatable), e.g. sluice_bridge=http://127.0.0.1:8081, or sluice_bridge=unix:///run/sluice/bridge.sock for a bridge on a Unix socket")
	fs.IntVar(&s.workers, "workers", defaultWorkers(), "plugin VMs (default: the CPUs the gateway may use)")
	fs.Var(&s.failure, "failure-policy", "what requests get from a plugin VM that has failed (trapped), as Envoy's failure_policy: fail_reload (503, and a new VM at most once a second), fail_closed (503 until restart) or fail_open (pass unlimited)")
	fs.Var(&s.strip, "strip-header", "remove this request header before the plugin runs (repeatable): identity headers the plugin trusts must come from you, not from clients")
	fs.Var(&s.env, "env", "an environment variable for the plugin VM (repeatable): NAME passes the gateway's own value, NAME=VALUE sets one; the VM sees nothing else")
	fs.BoolVar(&s.appendXFF, "append-xff", true, "append the peer address to X-Forwarded-For, as Envoy's use_remote_address does")
	fs.BoolVar(&s.preserveRequestID, "preserve-external-request-id", false, "with --append-xff, keep the X-Request-Id a client sent rather than make a new one, as Envoy's preserve_external_request_id")
	fs.StringVar(&s.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&s.cacheDir, "compile-cache", "", "directory to keep the plugin's compiled machine code in, so restarts skip compiling (seconds for plugin.wasm)")
	fs.DurationVar(&s.idleTimeout, "idle-timeout", defaultIdleTimeout, "close a client's kept-alive connection after it has been idle this long")
	fs.DurationVar(&s.upstreamTimeout, "upstream-timeout", defaultUpstreamTimeout, "the upstream's time for a whole answer, from when the plugin lets the request through, as Envoy's route timeout; past it the client gets 504; 0 for none")
	fs.IntVar(&s.maxRequestHeadersKB, "max-request-headers-kb", defaultMaxRequestHeadersKB, "refuse a request whose request line and headers exceed this many KiB with 431, as Envoy's max_request_headers_kb")
	fs.StringVar(&s.adminListen, "admin-listen", "", "address to serve the plugin's metrics (/stats/prometheus, as Envoy's admin does) and readiness (/ready) on; none when empty")
	fs.Var(&s.tlsCert, "tls-cert", "PEM certificate chain to serve HTTPS (HTTP/2 and HTTP/1.1) with, with --tls-key (repeatable: each connection gets the first whose names match the server name it asks for, else the first); read again on SIGHUP and when they change (--watch)")
	fs.Var(&s.tlsKey, "tls-key", "PEM private key of --tls-cert (repeatable: the keys of the certificates, in their order)")
	fs.StringVar(&s.clientCA, "tls-client-ca", "", "PEM CA certificates: with --tls-cert, every client must present a certificate they issued (mutual TLS), as an Envoy listener's require_client_certificate with a validation_context's trusted_ca; read again on SIGHUP and when it changes (--watch)")
	fs.BoolVar(&s.clientOptional, "tls-client-optional", false, "with --tls-client-ca: also take clients that present no certificate, as an Envoy listener without require_client_certificate; a certificate presented is verified all the same, and names its client to the plugin (peer_certificate identity)")
	fs.Var(&s.clientSANs, "tls-client-san", "with --tls-client-ca: a client's certificate must have this DNS name or URI (a SPIFFE id) among its subject alternative names, as a validation_context's match_typed_subject_alt_names (repeatable: any of them)")
	fs.StringVar(&s.upstreamCA, "upstream-tls-ca", "", "PEM CA certificates that verify https upstreams and call-out clusters (a bridge with a private CA), instead of the system's roots, as an Envoy cluster's trusted_ca; read again on SIGHUP and when it changes (--watch)")
	fs.StringVar(&s.upstreamProtocol, "upstream-protocol", upstreamHTTP1, "how to speak to the upstream: http1, http2 (h2c for http://, ALPN h2 for https://; what gRPC upstreams need) or downstream (the client's protocol)")
	fs.DurationVar(&s.watch, "watch", time.Second, "how often to look at --config, --tls-cert, --tls-key and --upstream-tls-ca and read again those that changed, as SIGHUP reads them all (0: only on SIGHUP)")
	fs.DurationVar(&s.shutdownGrace, "shutdown-grace", defaultShutdownGrace, "on SIGTERM or SIGINT, how long requests in flight (throttled ones held up to their max_delay included) may take to finish before the gateway exits")
	fs.BoolVar(&s.validate, "validate", false, "start the plugin with --config (and read the TLS pairs) as at start, say whether they are accepted, and exit, as envoy --mode validate; --upstream may be left out")
	fs.StringVar(&s.embedBridge, "embed-bridge", "", "run the check service (the bridge) in the gateway's process and serve the plugin's call-outs to this cluster (e.g. sluice_bridge) with it, with no connection; it takes the bridge's SLUICE_* settings (store, Redis, keys: docs/bridge.md), and its API is on --admin-listen")
	fs.StringVar(&s.accessLog, "access-log", "", "file to append a line per request to, in Envoy's default access log format (/dev/stdout works); SIGUSR1 reopens it; none when empty")
	fs.StringVar(&s.accessLogFormat, "access-log-format", "", "the access log's lines as an Envoy format string, e.g. '%START_TIME% %REQ(:METHOD)% %RESPONSE_CODE% %DURATION%' (docs/deploy.md lists the command operators); default Envoy's default format")
	fs.StringVar(&s.accessLogJSON, "access-log-json", "", `the access log's lines as JSON, from an Envoy format dictionary (typed_json_format), e.g. '{"status":"%RESPONSE_CODE%","path":"%REQ(:PATH)%"}'`)
	return fs
}

// defaultWorkers is one plugin VM per CPU the Go runtime schedules on, as
// Envoy runs one VM per worker thread and its --concurrency defaults to the
// hardware threads: with fewer VMs than CPUs, requests queue for a VM
// while CPUs are idle. GOMAXPROCS follows the container's CPU limit.
func defaultWorkers() int { return min(runtime.GOMAXPROCS(0), maxWorkers) }

const maxWorkers = 256

// parseFlags reads the command line, then, for each flag it does not set,
// the flag's SLUICE_GATEWAY_* variable (lookupEnv is os.LookupEnv outside
// tests): flags win. A repeatable flag's variable is a comma-separated list.
func parseFlags(args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (settings, error) {
	s := settings{clusters: clusterFlag{}, failure: policyFlag{wasmhost.FailReload}}
	fs := flagSet(&s)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: gateway [flags]; every flag --x-y may also be set as %sX_Y (see docs/deploy.md)\n", envPrefix)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	if fs.NArg() > 0 {
		return s, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		v, ok := lookupEnv(envName(f.Name))
		if err != nil || given[f.Name] || !ok || v == "" {
			return
		}
		values := []string{v}
		if _, list := f.Value.(repeatableFlag); list {
			values = strings.Split(v, ",")
		}
		for _, one := range values {
			if e := fs.Set(f.Name, strings.TrimSpace(one)); e != nil {
				err = fmt.Errorf("%s: %v", envName(f.Name), e)
				return
			}
		}
	})
	if err != nil {
		return s, err
	}
	if s.upstream == "" && len(s.routes) == 0 && !s.validate {
		return s, errNoUpstream
	}
	if _, err := upstreamURL(s.upstream); s.upstream != "" && err != nil {
		return s, fmt.Errorf("--upstream %w", err)
	}
	if s.workers < 1 || s.workers > maxWorkers {
		return s, fmt.Errorf("--workers %d: must be from 1 to %d", s.workers, maxWorkers)
	}
	if s.idleTimeout <= 0 {
		return s, fmt.Errorf("--idle-timeout %v: must be above 0", s.idleTimeout)
	}
	if s.maxRequestHeadersKB < 1 || s.maxRequestHeadersKB > maxRequestHeadersKBLimit {
		return s, fmt.Errorf("--max-request-headers-kb %d: must be from 1 to %d", s.maxRequestHeadersKB, maxRequestHeadersKBLimit)
	}
	if s.upstreamTimeout < 0 {
		return s, fmt.Errorf("--upstream-timeout %v: must be 0 (none) or above", s.upstreamTimeout)
	}
	if s.shutdownGrace < 0 {
		return s, fmt.Errorf("--shutdown-grace %v: must be 0 or above", s.shutdownGrace)
	}
	if s.watch < 0 {
		return s, fmt.Errorf("--watch %v: must be 0 (only on SIGHUP) or above", s.watch)
	}
	switch s.upstreamProtocol {
	case upstreamHTTP1, upstreamHTTP2, upstreamDownstream:
	default:
		return s, fmt.Errorf("--upstream-protocol %q: must be http1, http2 or downstream", s.upstreamProtocol)
	}
	if len(s.tlsCert) != len(s.tlsKey) {
		return s, fmt.Errorf("--tls-cert and --tls-key: give a key for each certificate (%d certificates, %d keys)", len(s.tlsCert), len(s.tlsKey))
	}
	if s.clientCA != "" && len(s.tlsCert) == 0 {
		return s, errors.New("--tls-client-ca: only with --tls-cert (clients are verified in the TLS handshake)")
	}
	if s.clientOptional && s.clientCA == "" {
		return s, errors.New("--tls-client-optional: only with --tls-client-ca")
	}
	if len(s.clientSANs) > 0 && s.clientCA == "" {
		return s, errors.New("--tls-client-san: only with --tls-client-ca")
	}
	if (s.accessLogFormat != "" || s.accessLogJSON != "") && s.accessLog == "" {
		return s, errors.New("--access-log-format, --access-log-json: only with --access-log, the file they format")
	}
	if _, dup := s.clusters[s.embedBridge]; dup {
		return s, fmt.Errorf("--embed-bridge %s: also a --cluster; the plugin's call-outs to it go to one or the other", s.embedBridge)
	}
	return s, nil
}

func run(ctx context.Context, args []string, stderr *os.File) error {
	s, err := parseFlags(args, os.LookupEnv, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(s.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	logger := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	wasm, err := os.ReadFile(s.plugin)
	if err != nil {
		return fmt.Errorf("--plugin: %w (build it with make wasm)", err)
	}
	cfg, err := os.ReadFile(s.config)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	if s.upstreamCA != "" {
		if s.cas, err = tlsfiles.LoadCAs("--upstream-tls-ca", s.upstreamCA); err != nil {
			return err
		}
	}
	if s.clientCA != "" {
		if s.clientCAs, err = tlsfiles.LoadCAs("--tls-client-ca", s.clientCA); err != nil {
			return err
		}
	}
	var certs []*tlsfiles.Pair
	for i := range s.tlsCert {
		cert, err := tlsfiles.Load(s.tlsCert[i], s.tlsKey[i])
		if err != nil {
			return err
		}
		certs = append(certs, cert)
	}
	format, err := accessFormatFrom(s.accessLogFormat, s.accessLogJSON)
	if err != nil {
		return err
	}
	var alog *accessLog
	if s.accessLog != "" && !s.validate {
		if alog, err = openAccessLog(s.accessLog, format, logger); err != nil {
			return err
		}
		defer alog.Close() // after the server's shutdown below: the last requests are logged
	}
	hostLevel := wasmhost.LogLevel(1) // debug
	switch {
	case level >= slog.LevelError:
		hostLevel = 4
	case level >= slog.LevelWarn:
		hostLevel = 3
	case level >= slog.LevelInfo:
		hostLevel = 2
	}
	opts := wasmhost.Options{
		Workers: s.workers, PluginConfig: cfg, RootID: "sluice", Clusters: s.clusters,
		Logger: logger, FailurePolicy: s.failure.FailurePolicy, LogLevel: hostLevel,
		Environment: s.env.environment(os.LookupEnv), TLSClientConfig: s.cas.ClientConfig(),
	}
	var bridge http.Handler // the embedded bridge's API, for the admin address
	if s.embedBridge != "" {
		br, err := embeddedBridge(os.Getenv, logger)
		if err != nil {
			return err
		}
		defer br.Close() // after the plugin's host: no call-out is left in flight
		bridge = br.Handler()
		opts.Handlers = map[string]http.Handler{s.embedBridge: bridge}
	}
	if s.cacheDir != "" {
		cache, err := wazero.NewCompilationCacheWithDir(s.cacheDir)
		if err != nil {
			return fmt.Errorf("--compile-cache: %w", err)
		}
		opts.CompilationCache = cache
	}
	start := time.Now()
	host, err := wasmhost.New(ctx, wasm, opts)
	if err != nil {
		return fmt.Errorf("starting the plugin: %w", err)
	}
	defer host.Close()
	logger.Info("plugin started", "workers", s.workers, "took", time.Since(start).String())
	if s.validate { // every VM took the configuration
		logger.Info("configuration valid", "config", s.config, "plugin", s.plugin)
		return nil
	}

	// The gateway's own address is bound before the admin address serves:
	// /ready says LIVE only once requests can be accepted, as Envoy's
	// server is LIVE only after its listeners are up.
	ln, err := listen(s.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	var draining atomic.Bool
	if s.adminListen != "" {
		aln, err := net.Listen("tcp", s.adminListen)
		if err != nil {
			ln.Close()
			return fmt.Errorf("--admin-listen: %w", err)
		}
		admin := &http.Server{Handler: adminHandler(host, &draining, bridge), ReadHeaderTimeout: 10 * time.Second}
		go admin.Serve(aln)
		defer admin.Close() // after the gateway's own shutdown: /ready says DRAINING meanwhile
		logger.Info("admin listening", "addr", aln.Addr().String())
	}

	var up *url.URL // none: every request goes by --route
	if s.upstream != "" {
		up, _ = url.Parse(s.upstream)
	}
	srv := newServer(newHandler(up, host, alog, logger, s), s)
	// What net/http reports (a refused handshake, a client's bad request
	// line) goes to the gateway's log, not bare to stderr.
	srv.ErrorLog = slog.NewLogLogger(logger.Handler(), slog.LevelWarn)
	serve := srv.Serve
	if len(certs) > 0 {
		srv.TLSConfig = tlsfiles.Config(certs...)
		switch {
		case s.clientCAs != nil && s.clientOptional:
			s.clientCAs.VerifyClients(srv.TLSConfig, s.clientSANs)
		case s.clientCAs != nil:
			s.clientCAs.RequireClients(srv.TLSConfig, s.clientSANs)
		}
		serve = func(ln net.Listener) error { return srv.ServeTLS(ln, "", "") }
		for _, c := range certs {
			logger.Info("serving HTTPS", "cert", c.CertFile, "not_after", c.NotAfter())
		}
	}
	logger.Info("gateway listening", "addr", ln.Addr().String(), "upstream", s.upstream, "routes", s.routes.String(), "workers", s.workers)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1)
	defer signal.Stop(sigs)
	r := &reloader{host: host, config: s.config, certs: certs, logger: logger}
	if s.cas != nil {
		r.cas = append(r.cas, reloadedCAs{s.cas, "upstream"})
	}
	if s.clientCAs != nil {
		r.cas = append(r.cas, reloadedCAs{s.clientCAs, "client"})
	}
	r.seen.Note(map[string][]byte{s.config: cfg}, nil)
	var watch <-chan time.Time // reread the files that changed
	if s.watch > 0 {
		t := time.NewTicker(s.watch)
		defer t.Stop()
		watch = t.C
	}
	errc := make(chan error, 1)
	go func() { errc <- serve(ln) }()
	for {
		select {
		case err := <-errc:
			return err
		case <-ctx.Done():
			draining.Store(true)
			return shutdown(srv, s.shutdownGrace)
		case <-watch:
			r.reload(ctx, false)
		case sig := <-sigs:
			switch sig {
			case syscall.SIGHUP:
				r.reload(ctx, true)
			case syscall.SIGUSR1: // as Envoy: reopen the access log, for rotation
				if alog == nil {
					continue
				}
				if err := alog.reopen(); err != nil {
					logger.Error("access log not reopened; it goes on in the file it had", "err", err)
				} else {
					logger.Info("access log reopened", "file", s.accessLog)
				}
			default:
				logger.Info("stopping", "signal", sig.String())
				draining.Store(true)
				return shutdown(srv, s.shutdownGrace)
			}
		}
	}
}

// reloader reads again what the gateway serves from: the plugin's
// configuration, the TLS pairs (certs), and the upstream and client CAs
// (cas); on SIGHUP whatever changed, every --watch what changed. Each is kept as it runs when its new files are refused, and
// the log says which, once while they stay as they are.
type reloader struct {
	host   *wasmhost.Host
	config string
	seen   filewatch.Seen // the plugin's configuration file
	certs  []*tlsfiles.Pair
	cas    []reloadedCAs
	logger *slog.Logger
}

// reloadedCAs are CAs the reloader reads again, and what they verify
// (upstream, client), for its log.
type reloadedCAs struct {
	cas  *tlsfiles.CAs
	what string
}

func (r *reloader) reload(ctx context.Context, always bool) {
	files, err := filewatch.Read(r.config)
	if r.seen.Note(files, err) || always {
		if err == nil {
			err = r.host.Configure(ctx, files[r.config])
		}
		if err != nil {
			r.logger.Error("reload refused; the running configuration stays", "err", err)
		} else {
			r.logger.Info("configuration reloaded", "file", r.config)
		}
	}
	for _, c := range r.certs {
		if read, err := c.Reload(always); err != nil {
			r.logger.Error("certificate reload refused; the running certificate stays", "err", err)
		} else if read {
			r.logger.Info("certificate reloaded", "cert", c.CertFile, "not_after", c.NotAfter())
		}
	}
	for _, c := range r.cas {
		if read, err := c.cas.Reload(always); err != nil {
			r.logger.Error(c.what+" CA reload refused; the CAs in use stay", "err", err)
		} else if read {
			r.logger.Info(c.what+" CAs reloaded", "file", c.cas.File)
		}
	}
}

// newHandler is the gateway: the access log (when alog is not nil), the
// stripped identity headers (s.strip), X-Forwarded-For, X-Forwarded-Proto
// and X-Request-Id (connectionManager, with s.appendXFF), the plugin (when
// host is not nil), and a reverse proxy in s.upstreamProtocol: to the
// upstream of the first of s.routes that matches, with the route's timeout
// or s.upstreamTimeout, else to up with s.upstreamTimeout (nil: none, and
// 404).
func newHandler(up *url.URL, host *wasmhost.Host, alog *accessLog, logger *slog.Logger, s settings) http.Handler {
	// One pool of connections for each protocol and timeout, whatever the
	// upstream.
	type transportKey struct {
		http2   bool
		timeout time.Duration
	}
	transports := map[transportKey]http.RoundTripper{}
	transport := func(k transportKey) http.RoundTripper {
		if transports[k] == nil {
			transports[k] = newUpstreamTransport(k.timeout, k.http2, s.cas.ClientConfig())
		}
		return transports[k]
	}
	to := func(u *url.URL, timeout time.Duration) http.Handler {
		proxy := func(http2 bool) http.Handler {
			return newProxy(u, transport(transportKey{http2, timeout}), timeout, logger, s)
		}
		var handler http.Handler
		switch s.upstreamProtocol {
		case upstreamHTTP2:
			handler = proxy(true)
		case upstreamDownstream:
			handler = byProtocol{h1: proxy(false), h2: proxy(true)}
		default:
			handler = proxy(false)
		}
		if alog != nil {
			handler = markUpstream(handler, u.Host)
		}
		return handler
	}
	var handler http.Handler
	if up != nil {
		handler = to(up, s.upstreamTimeout)
	}
	if len(s.routes) > 0 {
		rt := &router{routes: s.routes, fallback: handler}
		for _, r := range s.routes {
			timeout := s.upstreamTimeout
			if r.hasTimeout {
				timeout = r.timeout
			}
			rt.handlers = append(rt.handlers, to(r.to, timeout))
		}
		handler = rt
	}
	if host != nil {
		handler = host.Middleware(handler)
	}
	handler = connectionManager(handler, s.appendXFF, s.preserveRequestID)
	if len(s.strip) > 0 {
		handler = stripHeaders(handler, s.strip)
	}
	if alog != nil {
		handler = alog.handler(handler)
	}
	return handler
}

// newProxy is the reverse proxy to up through transport, whose timeout is
// timeout, with the gateway's forwarded headers and its answers when the
// upstream fails.
func newProxy(up *url.URL, transport http.RoundTripper, timeout time.Duration, logger *slog.Logger, s settings) *httputil.ReverseProxy {
	now := s.now
	if now == nil {
		now = time.Now
	}
	proxy := &httputil.ReverseProxy{Transport: serviceTimed{transport, now}, BufferPool: &bufferPool{}, Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(up)
		pr.Out.Host = pr.In.Host
		// X-Forwarded-For and X-Forwarded-Proto are as connectionManager left them
		// (ReverseProxy drops both before Rewrite); pass them on as they are.
		pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
		pr.Out.Header["X-Forwarded-Proto"] = pr.In.Header["X-Forwarded-Proto"]
	}}
	// What the proxy logs itself (an answer cut midway) goes to the
	// gateway's log, not to the standard logger's stderr lines.
	proxy.ErrorLog = slog.NewLogLogger(logger.Handler(), slog.LevelWarn)
	// A failed exchange gets Envoy's router's answer and response flag;
	// a client gone meanwhile is DC, as in Envoy's access log.
	proxy.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		gone := r.Context().Err() != nil
		reply, flag := wasmhost.UpstreamFailure(err, isTimeout(err) && !gone)
		if gone {
			flag = "DC"
		}
		if e := accessEntryOf(w); e != nil {
			e.flags = flag
		}
		if flag == "UT" {
			logger.Warn("upstream timeout", "timeout", timeout.String(), "path", r.URL.Path)
		} else {
			logger.Warn("upstream error", "err", err, "flag", flag, "path", r.URL.Path)
		}
		wasmhost.WriteLocalResponse(w, r, &reply)
	}
	return proxy
}

// byProtocol sends HTTP/2 requests to h2 and the rest to h1: the
// upstream is spoken to in the client's protocol, as Envoy's
// use_downstream_protocol_config.
type byProtocol struct{ h1, h2 http.Handler }

func (b byProtocol) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 2 {
		b.h2.ServeHTTP(w, r)
		return
	}
	b.h1.ServeHTTP(w, r)
}

// The values of --upstream-protocol.
const (
	upstreamHTTP1      = "http1"
	upstreamHTTP2      = "http2"
	upstreamDownstream = "downstream"
)

// adminHandler serves what Envoy's admin interface serves for the plugin,
// at the same paths, so scrape configurations, dashboards and probes
// written for Envoy work unchanged: the plugin's metrics on
// /stats/prometheus (wasmhost.Host.WritePrometheus), and on /ready "LIVE"
// with 200 while the gateway serves, "DRAINING" with 503 once it is
// stopping. With an embedded bridge (not nil), every other path is the
// bridge's own API: its checks, status, admin endpoints, /metrics,
// /healthz and /readyz.
func adminHandler(host *wasmhost.Host, draining *atomic.Bool, bridge http.Handler) http.Handler {
	mux := http.NewServeMux()
	if bridge != nil {
		mux.Handle("/", bridge)
	}
	mux.HandleFunc("GET /stats/prometheus", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		host.WritePrometheus(w) // fails only when the scraper has gone
	})
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, r *http.Request) {
		if draining.Load() {
			http.Error(w, "DRAINING", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "LIVE\n")
	})
	return mux
}

// listen binds the gateway's address. Its clients' sockets are read and
// written by raw system calls, as its upstream and call-out connections
// are (internal/rawsock): Go's bookkeeping for a call that may block took
// about a tenth of the gateway's CPU a request (docs/performance.md).
func listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return rawsock.Listener(ln), nil
}

// newServer is the gateway's HTTP server around its handler. A client's
// connection idle for longer than s.idleTimeout is closed: without a limit
// net/http keeps every idle connection (and its goroutine and buffers)
// for as long as the client does. A request's head is bounded as Envoy
// bounds it (s.maxRequestHeadersKB; net/http's own default is 1 MiB): the
// plugin copies every header into its memory, which never shrinks.
//
// It speaks HTTP/1.1 and HTTP/2 as Envoy's listener does with its default
// codec_type AUTO: over TLS the client picks by ALPN; in the clear a
// connection that opens with HTTP/2's preface (prior knowledge, as gRPC
// clients and the plugin's own bridge cluster send) is HTTP/2. net/http
// looks for the preface once per connection, not per request.
func newServer(h http.Handler, s settings) *http.Server {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(true)
	protocols.SetUnencryptedHTTP2(true)
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: s.idleTimeout,
		MaxHeaderBytes: s.maxRequestHeadersKB << 10, Protocols: &protocols}
}

// defaultMaxRequestHeadersKB and maxRequestHeadersKBLimit are Envoy's
// default and upper bound for max_request_headers_kb (the connection
// manager's HttpConnectionManager proto). net/http lets a head run 4 KiB
// past its bound, so the gateway refuses from 64 KiB by default.
const (
	defaultMaxRequestHeadersKB = 60
	maxRequestHeadersKBLimit   = 8192
)

// defaultIdleTimeout is above the idle time after which common clients
// drop a kept-alive connection themselves (90 s in Go's http.Transport),
// so the gateway seldom closes one a client is about to reuse.
const defaultIdleTimeout = 2 * time.Minute

// defaultUpstreamTimeout is Envoy's default route timeout, and envoy.yaml's.
const defaultUpstreamTimeout = 15 * time.Second

// bufferPool lends the reverse proxy its copy buffers: without one it
// allocates 32 KiB for every response, most of the gateway's garbage.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if buf, ok := b.p.Get().(*[]byte); ok {
		return *buf
	}
	return make([]byte, 32<<10) // ReverseProxy's own size
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

// shutdown stops taking connections and waits up to grace for the
// requests in flight; past it, they are cut when the gateway exits.
func shutdown(srv *http.Server, grace time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("requests still in flight after --shutdown-grace %v: %w", grace, err)
	}
	return nil
}

// defaultShutdownGrace is the bridge's own default, and above a throttled
// request's default max_delay (1s).
const defaultShutdownGrace = 10 * time.Second

// connectionManager sets X-Forwarded-For, X-Forwarded-Proto and
// X-Request-Id before the plugin sees the request, as Envoy's connection
// manager does (source/common/http/conn_manager_utility.cc,
// mutateRequestHeaders), so the plugin and the upstream see what they
// would behind Envoy.
//
// At the edge (edge, Envoy's use_remote_address with no trusted hops) the
// connection peer is appended to X-Forwarded-For, so that
// trusted_proxy_depth 1 names the peer itself and nothing a client writes
// in the header can change whose quota it uses; and X-Forwarded-Proto is
// the connection's own, https over TLS, whatever the client sent. Behind a
// proxy that sets them, both pass as they came, and X-Forwarded-Proto is
// only added when missing. A request without X-Request-Id gets one, so the
// id in the plugin's events is the one the upstream logs; at the edge
// every request gets a new one, unless preserveID. Envoy makes a new id
// for each request it takes as external (preserve_external_request_id is
// false by default): at the edge, each one from an address its
// internal_address_config does not list, which is none by default in
// current releases (earlier ones trusted RFC 1918 addresses).
func connectionManager(next http.Handler, edge, preserveID bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if edge {
			if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
				if prior := r.Header.Values("X-Forwarded-For"); len(prior) > 0 {
					r.Header.Set("X-Forwarded-For", strings.Join(prior, ", ")+", "+host)
				} else {
					r.Header.Set("X-Forwarded-For", host)
				}
			}
		}
		if _, ok := r.Header["X-Forwarded-Proto"]; edge || !ok {
			r.Header["X-Forwarded-Proto"] = protoHTTP
			if r.TLS != nil {
				r.Header["X-Forwarded-Proto"] = protoHTTPS
			}
		}
		if v := r.Header["X-Request-Id"]; edge && !preserveID || len(v) == 0 || v[0] == "" {
			r.Header["X-Request-Id"] = []string{wasmhost.NewRequestID()}
		}
		next.ServeHTTP(w, r)
	})
}

// protoHTTP and protoHTTPS are X-Forwarded-Proto's values, shared by every
// request rather than allocated for each: a header's values are only
// replaced or appended to (which copies a full slice), never written in
// place.
var (
	protoHTTP  = []string{"http"}
	protoHTTPS = []string{"https"}
)

// stripHeaders removes client-sent headers that the plugin would otherwise
// trust as identity (a user id or tier set by an authenticating layer).
func stripHeaders(next http.Handler, names []string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, n := range names {
			r.Header.Del(n)
		}
		next.ServeHTTP(w, r)
	})
}
