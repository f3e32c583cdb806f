package redisbridge

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice/internal/tlsfiles"
	"github.com/sluicehq/sluice/internal/unixaddr"
	"github.com/sluicehq/sluice/redisbridge/internal/rls"
	"github.com/sluicehq/sluice/redisbridge/internal/store"
	"github.com/sluicehq/sluice/rules"
)

// Settings configure a bridge. ParseSettings reads them from flags and
// SLUICE_* environment variables (docs/bridge.md); flags win.
type Settings struct {
	Listen           string        // address to listen on, default ":8081"
	ListenMode       string        // octal permissions of a unix:// socket; "": the umask's
	Store            string        // "memory" (default) or "redis"
	RedisURL         string        // redis://, rediss://, redis+sentinel://, redis+cluster://
	RedisPoolSize    int           // connections per Redis node (0: go-redis default)
	RedisTimeout     time.Duration // dial/read/write timeout and bound on a check, default 150ms
	RedisPipelines   int           // pipelines in flight at once, default 2
	RedisBatch       int           // checks decided in one script call at most, default 128; 1: a call per check
	AdminKey         string        // required by config and reset endpoints; "" disables them
	CheckToken       string        // when set, check endpoints require "Authorization: Bearer <token>"
	AuditLog         string        // file for admin audit records (JSON lines); "" or "-" is stderr
	DefaultLimit     int64         // REST checks: requests per window, default 100
	DefaultWindow    time.Duration // REST checks: window, default 1m
	DefaultAlgorithm string        // REST checks: algorithm, default sliding_window
	MemoryMaxKeys    int           // memory store bound, default 1,000,000
	LogLevel         string        // debug, info (default), warn, error
	// Redis over TLS (rediss://): a CA to verify the server with, instead
	// of the system roots, and a client certificate for mutual TLS.
	RedisTLSCA, RedisTLSCert, RedisTLSKey string
	TLSCert                               string // PEM certificate; with TLSKey serves HTTPS (HTTP/1.1 and h2)
	TLSKey                                string
	// TLSClientCA, PEM CA certificates, makes the TLS listener require a
	// client certificate they issued (mutual TLS); TLSClientSAN, names
	// separated by commas, then also requires one of them among its DNS
	// or URI subject alternative names.
	TLSClientCA, TLSClientSAN string
	ShutdownGrace             time.Duration // drain time on SIGTERM, default 10s
	// MaxConnectionAge asks a client to reconnect once its connection is
	// about that old (a tenth more or less, at random): an HTTP/2
	// connection gets a graceful GOAWAY, an HTTP/1.1 one Connection:
	// close on its next answer. Bridges added behind a Service then get
	// their share of long-lived proxy connections. 0: never (the
	// default). Not with TLS, whose connections net/http serves.
	MaxConnectionAge time.Duration
	// HealthListen serves GET /healthz, /readyz (/healthcheck) and /metrics in plain
	// HTTP on addresses of their own, separated by commas ("" disables it,
	// the default), for probes that present no client certificate.
	// cmd/redisbridge serves it.
	HealthListen string
	// DebugListen serves net/http/pprof on its own address ("" disables it,
	// the default). cmd/redisbridge serves it; keep it on loopback.
	DebugListen string
	// PolicyStore is a postgres:// URL: rules, overrides and the audit
	// trail are kept there ("": overrides in the counter store's backend,
	// no rules API).
	PolicyStore string
	// RLSConfig is a YAML file, or a directory of them, in
	// envoyproxy/ratelimit's format: with it the bridge serves Envoy's
	// rate limit service (gRPC, envoy.service.ratelimit.v3).
	RLSConfig string
	// RLSXDS is the URL of an xDS management server (http:// for gRPC in
	// the clear, https:// over TLS) that gives the rate limit service its
	// configuration, in RateLimitConfig resources over ADS, as it gives it
	// to envoyproxy/ratelimit with CONFIG_TYPE=GRPC_XDS_SOTW; in place of
	// RLSConfig.
	RLSXDS string
	// RLSXDSNodeID is the node the bridge says it is to that server
	// (CONFIG_GRPC_XDS_NODE_ID); default "default", as there.
	RLSXDSNodeID string
	// RLSXDSNodeMetadata is the node's metadata, KEY=VALUE pairs separated
	// by commas (string values), and RLSXDSHeaders the stream's extra
	// headers, NAME=VALUE pairs, as envoyproxy/ratelimit's
	// CONFIG_GRPC_XDS_NODE_METADATA and
	// CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS.
	RLSXDSNodeMetadata, RLSXDSHeaders string
	// RLSXDSCA verifies an https:// server's certificate (default: the
	// system roots); RLSXDSCert and RLSXDSKey are the bridge's own, for a
	// server that asks for one (CONFIG_GRPC_XDS_SERVER_TLS_CACERT,
	// CONFIG_GRPC_XDS_CLIENT_TLS_CERT and _KEY).
	RLSXDSCA, RLSXDSCert, RLSXDSKey string
	// RLSXDSServerName is the name an https:// server's certificate must
	// have, when not the URL's host (CONFIG_GRPC_XDS_SERVER_TLS_SAN).
	RLSXDSServerName string
	// Watch is how often cmd/redisbridge looks at the files it serves
	// from (RLSConfig's, TLSCert and TLSKey) and reads again those that
	// changed, as envoyproxy/ratelimit watches its configuration
	// directory (RUNTIME_WATCH_ROOT) and its certificate's; 0: only on
	// SIGHUP.
	Watch time.Duration
	// RLSShadowMode answers every rate limit service call OK while
	// deciding and counting it as always: each limit is in shadow mode,
	// as envoyproxy/ratelimit's SHADOW_MODE puts them all.
	RLSShadowMode bool
	// RLSResponseHeaders adds RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset to every rate limit service answer (as
	// envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED), for Envoy
	// to send on to the client.
	RLSResponseHeaders bool
	// RLSResponseHeaderNames renames those three headers: their names,
	// limit, remaining and reset, separated by commas (envoyproxy/
	// ratelimit's LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and
	// LIMIT_RESET_HEADER). "": the default names.
	RLSResponseHeaderNames string
	// RLSMergeDomainConfig lets several files of RLSConfig configure one
	// domain, their descriptors joined, as envoyproxy/ratelimit's
	// MERGE_DOMAIN_CONFIG does; without it such a configuration is refused.
	RLSMergeDomainConfig bool
	// RLSQuotaMode puts every limit of the rate limit service in quota
	// mode (a descriptor's quota_mode), as envoyproxy/ratelimit's
	// QUOTA_MODE does.
	RLSQuotaMode bool
	// RLSOverLimitCache is how many counters the rate limit service
	// remembers as having nothing left until their window ends, to
	// refuse their calls without a store call (as envoyproxy/ratelimit's
	// LOCAL_CACHE_SIZE_IN_BYTES); 0: none.
	RLSOverLimitCache int
	// RLSResponseMetadata adds dynamic metadata to every rate limit
	// service answer, as envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA:
	// the request's domain, descriptors and hits_addend, and the metadata
	// of the limits that were not over.
	RLSResponseMetadata bool
	// RLSReadyNeedsConfig holds the bridge not ready (/readyz,
	// /healthcheck and the gRPC health check) while the rate limit
	// service has no configuration with a domain: none yet from
	// RLSXDS, or one without a domain, as envoyproxy/ratelimit's
	// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED; so a replica is sent
	// calls only once it has limits to decide them by.
	RLSReadyNeedsConfig bool
	// NearLimitRatio: an allowed decision that leaves more than this
	// share of its limit used (more than floor(limit × ratio) units, as
	// envoyproxy/ratelimit's NEAR_LIMIT_RATIO) is counted in
	// sluice_bridge_near_limit_total, an early warning of the refusals to
	// come. At most 1 (1: none is); 0 takes the default, 0.8.
	NearLimitRatio float64
	// ValidateOnly: cmd/redisbridge checks the settings and the files
	// they name (CheckFiles), says whether they are accepted, and exits.
	ValidateOnly bool
	// EnvoyRatelimitEnv reads envoyproxy/ratelimit's environment
	// variables too, as the flags that do what they ask, so that the
	// bridge runs where that service's deployment runs it (Envoy
	// Gateway's, say): see envoyratelimit.go. cmd/redisbridge sets it
	// when run by the name ratelimit (the image's /bin/ratelimit).
	EnvoyRatelimitEnv bool
	// notes are that service's variables that were set and change
	// nothing here; New logs them.
	notes []string

	// Not settable from flags: tests and embedders.
	Logger *slog.Logger // default: JSON to stderr at LogLevel
	Now    func() int64 // memory store clock in unix ms (default: the system clock)
}

// DefaultSettings returns the settings a bridge starts with.
func DefaultSettings() Settings {
	return Settings{
		// 150ms: below the plugin's default call-out timeout (200ms), so the
		// bridge answers 503 before the plugin gives up on it; otherwise the
		// plugin applies its failure mode while the bridge may still count
		// the request in Redis.
		Listen: ":8081", Store: "memory", RedisTimeout: 150 * time.Millisecond, RedisPipelines: 2, RedisBatch: 128,
		DefaultLimit: 100, DefaultWindow: time.Minute, DefaultAlgorithm: "sliding_window",
		MemoryMaxKeys: 1_000_000, LogLevel: "info", ShutdownGrace: 10 * time.Second, Watch: time.Second, NearLimitRatio: defaultNearLimitRatio,
		RLSXDSNodeID: "default",
	}
}

// defaultNearLimitRatio is envoyproxy/ratelimit's NEAR_LIMIT_RATIO default.
const defaultNearLimitRatio = 0.8

// nearLimitRatio is NearLimitRatio, or its default for 0.
func (s *Settings) nearLimitRatio() float64 {
	if s.NearLimitRatio == 0 {
		return defaultNearLimitRatio
	}
	return s.NearLimitRatio
}

// rlsHeaderNames are the names --rls-response-header-names gives; none
// when it is empty, and then the answers use rls.DefaultHeaderNames.
func (s *Settings) rlsHeaderNames() ([3]string, error) {
	var names [3]string
	if s.RLSResponseHeaderNames == "" {
		return names, nil
	}
	parts := strings.Split(s.RLSResponseHeaderNames, ",")
	if len(parts) != 3 {
		return names, fmt.Errorf("--rls-response-header-names: want three names (limit, remaining, reset) separated by commas, got %d", len(parts))
	}
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if !httpguts.ValidHeaderFieldName(p) || strings.HasPrefix(p, ":") {
			return names, fmt.Errorf("--rls-response-header-names: %q is not a header name", p)
		}
		names[i] = p
	}
	return names, nil
}

// ParseSettings reads settings from command-line args and the environment
// (getenv, usually os.Getenv). An error names the setting at fault.
func ParseSettings(args []string, getenv func(string) string) (Settings, error) {
	s, err := parseSettings(args, getenv, nil)
	if err != nil || !s.EnvoyRatelimitEnv {
		return s, validated(&s, err, nil)
	}
	from, notes, err := envoyRatelimitFlags(getenv)
	if err != nil {
		return s, fmt.Errorf("--envoy-ratelimit-env: %w", err)
	}
	s, err = parseSettings(args, getenv, from)
	s.notes = notes
	return s, validated(&s, err, from)
}

// validated is err, or else what Validate says of s, naming the variable
// of from that set a flag it names.
func validated(s *Settings, err error, from []envFlag) error {
	if err != nil {
		return err
	}
	if err = s.Validate(); err == nil {
		return nil
	}
	for _, f := range from {
		if mentionsFlag(err.Error(), f.flag) {
			return fmt.Errorf("%w (--%s set from %s)", err, f.flag, f.env)
		}
	}
	return err
}

// mentionsFlag tells whether msg names --name, not a longer flag that
// starts with it.
func mentionsFlag(msg, name string) bool {
	for {
		i := strings.Index(msg, "--"+name)
		if i < 0 {
			return false
		}
		msg = msg[i+2+len(name):]
		if msg == "" || (msg[0] != '-' && (msg[0] < 'a' || msg[0] > 'z')) {
			return true
		}
	}
}

// parseSettings reads settings as ParseSettings does, without checking
// them: from the flags from sets (envoyproxy/ratelimit's variables), then
// the SLUICE_* variables, then args, the last of each setting winning.
func parseSettings(args []string, getenv func(string) string, from []envFlag) (Settings, error) {
	s := DefaultSettings()
	fs := flagSet(&s)
	fs.SetOutput(io.Discard)
	for _, f := range from {
		if err := fs.Set(f.flag, f.value); err != nil {
			return s, fmt.Errorf("--envoy-ratelimit-env: %s: %v", f.env, err)
		}
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		env := envName(f.Name)
		if v := getenv(env); v != "" && err == nil {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s: %v", env, e)
			}
		}
	})
	if err != nil {
		return s, err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return s, err
		}
		return s, fmt.Errorf("flags: %w", err)
	}
	if fs.NArg() > 0 {
		return s, fmt.Errorf("flags: unexpected argument %q", fs.Arg(0))
	}
	return s, nil
}

// Usage writes the flag list to w.
func Usage(w io.Writer) {
	s := DefaultSettings()
	fs := flagSet(&s)
	fs.SetOutput(w)
	fmt.Fprintln(w, "usage: redisbridge [flags]; every flag --x-y may also be set as SLUICE_X_Y (see docs/bridge.md)")
	fs.PrintDefaults()
}

func envName(flagName string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func flagSet(s *Settings) *flag.FlagSet {
	fs := flag.NewFlagSet("redisbridge", flag.ContinueOnError)
	fs.StringVar(&s.Listen, "listen", s.Listen, "address to listen on, or unix:///path for a Unix socket")
	fs.StringVar(&s.ListenMode, "listen-mode", s.ListenMode, "permissions of the unix:// socket, octal (0660: the bridge's group may connect); default: the umask's")
	fs.StringVar(&s.Store, "store", s.Store, "counter store: memory or redis")
	fs.StringVar(&s.RedisURL, "redis-url", s.RedisURL, "Redis URL (redis://, rediss://, redis+sentinel://, redis+cluster://)")
	fs.IntVar(&s.RedisPoolSize, "redis-pool-size", s.RedisPoolSize, "connections per Redis node")
	fs.DurationVar(&s.RedisTimeout, "redis-timeout", s.RedisTimeout, "Redis dial/read/write timeout")
	fs.IntVar(&s.RedisPipelines, "redis-pipelines", s.RedisPipelines, "Redis pipelines in flight")
	fs.IntVar(&s.RedisBatch, "redis-batch", s.RedisBatch, "checks decided in one Redis script call at most (1: a call per check)")
	fs.StringVar(&s.AdminKey, "admin-key", s.AdminKey, "key for the admin endpoints")
	fs.StringVar(&s.CheckToken, "check-token", s.CheckToken, "bearer token required on check endpoints")
	fs.StringVar(&s.AuditLog, "audit-log", s.AuditLog, "audit log file (default stderr)")
	fs.Int64Var(&s.DefaultLimit, "default-limit", s.DefaultLimit, "REST checks: requests per window when the check gives no limit")
	fs.DurationVar(&s.DefaultWindow, "default-window", s.DefaultWindow, "REST checks: window when the check gives none")
	fs.StringVar(&s.DefaultAlgorithm, "default-algorithm", s.DefaultAlgorithm, "REST checks: algorithm when the check gives none")
	fs.IntVar(&s.MemoryMaxKeys, "memory-max-keys", s.MemoryMaxKeys, "memory store key bound")
	fs.StringVar(&s.LogLevel, "log-level", s.LogLevel, "debug, info, warn or error")
	fs.StringVar(&s.RedisTLSCA, "redis-tls-ca", s.RedisTLSCA, "PEM CA certificates that verify Redis's certificate (rediss:// URLs); default: the system roots")
	fs.StringVar(&s.RedisTLSCert, "redis-tls-cert", s.RedisTLSCert, "PEM client certificate for Redis (mutual TLS)")
	fs.StringVar(&s.RedisTLSKey, "redis-tls-key", s.RedisTLSKey, "PEM key of --redis-tls-cert")
	fs.StringVar(&s.TLSCert, "tls-cert", s.TLSCert, "TLS certificate file")
	fs.StringVar(&s.TLSKey, "tls-key", s.TLSKey, "TLS key file")
	fs.StringVar(&s.TLSClientCA, "tls-client-ca", s.TLSClientCA, "PEM CA certificates: with --tls-cert, every client must present a certificate they issued (mutual TLS), as envoyproxy/ratelimit's GRPC_CLIENT_TLS_CACERT; read again on SIGHUP and when it changes (--watch)")
	fs.StringVar(&s.TLSClientSAN, "tls-client-san", s.TLSClientSAN, "with --tls-client-ca, names separated by commas: a client's certificate must have one of them as a DNS name or a URI (a SPIFFE id) among its subject alternative names")
	fs.DurationVar(&s.ShutdownGrace, "shutdown-grace", s.ShutdownGrace, "drain time on shutdown")
	fs.DurationVar(&s.MaxConnectionAge, "max-connection-age", s.MaxConnectionAge, "ask clients to reconnect once a connection is about this old (HTTP/2: a graceful GOAWAY; HTTP/1.1: Connection: close), so bridges added later get connections (0: never)")
	fs.Float64Var(&s.NearLimitRatio, "near-limit-ratio", s.NearLimitRatio, "count an allowed decision in sluice_bridge_near_limit_total when more than this share of its limit is used after it (at most 1, which counts none; 0: the default)")
	fs.StringVar(&s.HealthListen, "health-listen", s.HealthListen, "addresses (host:port, several separated by commas) for GET /healthz, /readyz (and /healthcheck) and /metrics only, in plain HTTP, without the TLS and client certificates of --listen: for Kubernetes probes and Prometheus (empty: off)")
	fs.StringVar(&s.DebugListen, "debug-listen", s.DebugListen, "address for /debug/pprof/ (empty: off)")
	fs.StringVar(&s.PolicyStore, "policy-store", s.PolicyStore, "PostgreSQL URL (postgres://) for rules, overrides and the audit trail")
	fs.BoolVar(&s.EnvoyRatelimitEnv, "envoy-ratelimit-env", s.EnvoyRatelimitEnv, "also read envoyproxy/ratelimit's environment variables (REDIS_URL, GRPC_PORT, CONFIG_TYPE, ...) as the flags that do what they ask, so the bridge runs where that service's deployment runs it; set when run as ratelimit (the image's /bin/ratelimit). SLUICE_* variables and flags win")
	fs.BoolVar(&s.ValidateOnly, "validate", s.ValidateOnly, "check the settings and the files they name (--rls-config, the TLS pairs) as a start would, say whether they are accepted, and exit")
	fs.StringVar(&s.RLSConfig, "rls-config", s.RLSConfig, "envoyproxy/ratelimit's YAML configuration (a file or a directory of them): serve Envoy's rate limit service (gRPC) with its descriptors")
	fs.StringVar(&s.RLSXDS, "rls-xds", s.RLSXDS, "URL of an xDS management server (http:// in the clear, https:// over TLS) that gives the rate limit service its configuration, in RateLimitConfig resources over ADS, as envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW; in place of a configuration file")
	fs.StringVar(&s.RLSXDSNodeID, "rls-xds-node-id", s.RLSXDSNodeID, "the node id the bridge gives that xDS server, which picks the node's resources by it")
	fs.StringVar(&s.RLSXDSNodeMetadata, "rls-xds-node-metadata", s.RLSXDSNodeMetadata, "the node's metadata the bridge gives that xDS server, KEY=VALUE pairs separated by commas (string values), which a server may pick resources by")
	fs.StringVar(&s.RLSXDSHeaders, "rls-xds-headers", s.RLSXDSHeaders, "headers (gRPC metadata) the bridge sends that xDS server with each stream, NAME=VALUE pairs separated by commas: a token it asks for, say")
	fs.StringVar(&s.RLSXDSCA, "rls-xds-ca", s.RLSXDSCA, "PEM CA certificates that verify an https:// xDS server (default: the system roots)")
	fs.StringVar(&s.RLSXDSCert, "rls-xds-cert", s.RLSXDSCert, "PEM client certificate for the xDS server (mutual TLS)")
	fs.StringVar(&s.RLSXDSKey, "rls-xds-key", s.RLSXDSKey, "PEM key of the xDS client certificate")
	fs.StringVar(&s.RLSXDSServerName, "rls-xds-server-name", s.RLSXDSServerName, "the name the xDS server's certificate must have (default: the --rls-xds URL's host)")
	fs.DurationVar(&s.Watch, "watch", s.Watch, "how often to look at the files of --rls-config and of the TLS pair and read again those added, removed or changed, as envoyproxy/ratelimit watches its configuration and certificate (0: only on SIGHUP)")
	fs.StringVar(&s.RLSResponseHeaderNames, "rls-response-header-names", s.RLSResponseHeaderNames, "rate limit service: the names of the headers of --rls-response-headers, limit, remaining and reset, separated by commas (default RateLimit-Limit,RateLimit-Remaining,RateLimit-Reset)")
	fs.BoolVar(&s.RLSResponseHeaders, "rls-response-headers", s.RLSResponseHeaders, "rate limit service: add RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset to every answer, of the descriptor closest to its limit")
	fs.IntVar(&s.RLSOverLimitCache, "rls-over-limit-cache", s.RLSOverLimitCache, "rate limit service: counters remembered as spent until their window ends, whose calls are refused without a store call (0: none)")
	fs.BoolVar(&s.RLSResponseMetadata, "rls-response-metadata", s.RLSResponseMetadata, "rate limit service: add dynamic metadata to every answer: the request's domain, descriptors and hits_addend, and the configured metadata of the limits not over")
	fs.BoolVar(&s.RLSReadyNeedsConfig, "rls-ready-needs-config", s.RLSReadyNeedsConfig, "rate limit service: not ready (/readyz, /healthcheck, gRPC health) while it has no configuration with a domain, none yet from --rls-xds or one without a domain, as envoyproxy/ratelimit's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")
	fs.BoolVar(&s.RLSMergeDomainConfig, "rls-merge-domain-config", s.RLSMergeDomainConfig, "rate limit service: let several files of --rls-config configure one domain, their descriptors joined (one configured in two files is refused), as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG")
	fs.BoolVar(&s.RLSQuotaMode, "rls-quota-mode", s.RLSQuotaMode, "rate limit service: every limit in quota mode, as envoyproxy/ratelimit's QUOTA_MODE: a call is refused only when all of its limits are over")
	fs.BoolVar(&s.RLSShadowMode, "rls-shadow-mode", s.RLSShadowMode, "rate limit service: answer every call OK, deciding and counting it as always; what it would have refused is logged and counted as log-only denials")
	return fs
}

// Validate reports the first setting that cannot work.
func (s *Settings) Validate() error {
	switch s.Store {
	case "memory":
	case "redis":
		if s.RedisURL == "" {
			return errors.New("--redis-url: required with --store redis")
		}
	default:
		return fmt.Errorf("--store: %q is neither memory nor redis", s.Store)
	}
	if s.Listen == "" {
		return errors.New("--listen: empty")
	}
	if err := unixaddr.Check(s.Listen); err != nil {
		return fmt.Errorf("--listen %w", err)
	}
	if _, err := s.socketMode(); err != nil {
		return err
	}
	if s.RedisTimeout <= 0 {
		return errors.New("--redis-timeout: must be positive")
	}
	if s.RedisPoolSize < 0 || s.RedisPipelines < 0 || s.MemoryMaxKeys < 0 {
		return errors.New("--redis-pool-size, --redis-pipelines, --memory-max-keys: must not be negative")
	}
	if !(s.NearLimitRatio >= 0 && s.NearLimitRatio <= 1) { // NaN too
		return fmt.Errorf("--near-limit-ratio: %v is not from 0 to 1", s.NearLimitRatio)
	}
	if s.RLSReadyNeedsConfig && s.RLSConfig == "" && s.RLSXDS == "" {
		return errors.New("--rls-ready-needs-config: only with --rls-config or --rls-xds (the bridge would never be ready)")
	}
	if s.RLSOverLimitCache < 0 {
		return errors.New("--rls-over-limit-cache: must not be negative")
	}
	if _, err := s.rlsHeaderNames(); err != nil {
		return err
	}
	if s.RedisBatch < 1 || s.RedisBatch > 1024 {
		return errors.New("--redis-batch: must be from 1 to 1024")
	}
	if s.DefaultLimit < 1 || s.DefaultLimit > rules.MaxLimitValue {
		return fmt.Errorf("--default-limit: must be from 1 to %d", int64(rules.MaxLimitValue))
	}
	if s.DefaultWindow < time.Millisecond || s.DefaultWindow.Milliseconds() > rules.MaxWindowMS {
		return errors.New("--default-window: must be from 1ms to one year")
	}
	if _, ok := rules.ParseAlgorithm(s.DefaultAlgorithm); !ok {
		return fmt.Errorf("--default-algorithm: %q is not one of token_bucket, sliding_window, sliding_log, fixed_window", s.DefaultAlgorithm)
	}
	if _, err := parseLevel(s.LogLevel); err != nil {
		return err
	}
	if (s.RedisTLSCert == "") != (s.RedisTLSKey == "") {
		return errors.New("--redis-tls-cert, --redis-tls-key: set both or neither")
	}
	if (s.RedisTLSCA != "" || s.RedisTLSCert != "") && !strings.HasPrefix(s.RedisURL, "rediss") {
		return errors.New("--redis-tls-ca, --redis-tls-cert: only with a rediss:// URL (Redis over TLS)")
	}
	if (s.TLSCert == "") != (s.TLSKey == "") {
		return errors.New("--tls-cert, --tls-key: set both or neither")
	}
	if s.TLSClientCA != "" && s.TLSCert == "" {
		return errors.New("--tls-client-ca: only with --tls-cert (clients are verified in the TLS handshake)")
	}
	if s.TLSClientSAN != "" {
		if s.TLSClientCA == "" {
			return errors.New("--tls-client-san: only with --tls-client-ca")
		}
		if slices.Contains(s.clientSANs(), "") {
			return fmt.Errorf("--tls-client-san %q: an empty name", s.TLSClientSAN)
		}
	}
	switch {
	case s.MaxConnectionAge < 0:
		return errors.New("--max-connection-age: must not be negative")
	case s.MaxConnectionAge > 0 && s.TLSCert != "":
		return errors.New("--max-connection-age: not with --tls-cert (net/http serves TLS connections, and cannot age them)")
	}
	for _, a := range s.HealthAddrs() {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("--health-listen %q: want HOST:PORT, or several separated by commas", s.HealthListen)
		}
	}
	if s.PolicyStore != "" && !strings.HasPrefix(s.PolicyStore, "postgres://") && !strings.HasPrefix(s.PolicyStore, "postgresql://") {
		return errors.New("--policy-store: must be a postgres:// or postgresql:// URL")
	}
	if s.Watch < 0 {
		return errors.New("--watch: must not be negative")
	}
	if err := s.validateXDS(); err != nil {
		return err
	}
	if s.ShutdownGrace < 0 {
		return errors.New("--shutdown-grace: must not be negative")
	}
	return nil
}

// HealthAddrs are the addresses of HealthListen.
func (s *Settings) HealthAddrs() []string {
	if s.HealthListen == "" {
		return nil
	}
	return strings.Split(s.HealthListen, ",")
}

// validateXDS checks the --rls-xds settings.
func (s *Settings) validateXDS() error {
	if s.RLSXDS == "" {
		if s.RLSXDSCA != "" || s.RLSXDSCert != "" || s.RLSXDSKey != "" || s.RLSXDSServerName != "" || s.RLSXDSNodeMetadata != "" || s.RLSXDSHeaders != "" {
			return errors.New("--rls-xds-ca, --rls-xds-cert, --rls-xds-key, --rls-xds-server-name, --rls-xds-node-metadata, --rls-xds-headers: only with --rls-xds")
		}
		return nil
	}
	if _, err := s.xdsNodeMetadata(); err != nil {
		return err
	}
	if _, err := s.xdsHeaders(); err != nil {
		return err
	}
	if s.RLSConfig != "" {
		return errors.New("--rls-xds: not with --rls-config; the configuration comes from one or the other")
	}
	u, err := url.Parse(s.RLSXDS)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || (u.Path != "" && u.Path != "/") {
		return fmt.Errorf("--rls-xds %q: want http://HOST:PORT or https://HOST:PORT", s.RLSXDS)
	}
	if u.Scheme == "http" && (s.RLSXDSCA != "" || s.RLSXDSCert != "" || s.RLSXDSServerName != "") {
		return errors.New("--rls-xds-ca, --rls-xds-cert, --rls-xds-server-name: only with an https:// --rls-xds")
	}
	if (s.RLSXDSCert == "") != (s.RLSXDSKey == "") {
		return errors.New("--rls-xds-cert, --rls-xds-key: set both or neither")
	}
	if s.RLSXDSNodeID == "" {
		return errors.New("--rls-xds-node-id: empty")
	}
	return nil
}

// xdsNodeMetadata is --rls-xds-node-metadata: KEY=VALUE pairs, each key
// once and none empty.
func (s *Settings) xdsNodeMetadata() (map[string]string, error) {
	pairs, err := keyValues("--rls-xds-node-metadata", s.RLSXDSNodeMetadata)
	if err != nil {
		return nil, err
	}
	md := map[string]string{}
	for _, p := range pairs {
		if _, dup := md[p[0]]; dup {
			return nil, fmt.Errorf("--rls-xds-node-metadata: key %q given twice", p[0])
		}
		md[p[0]] = p[1]
	}
	return md, nil
}

// xdsHeaders is --rls-xds-headers: NAME=VALUE pairs of valid header names
// and values, lower-cased names, none of those gRPC or HTTP/2 set
// themselves.
func (s *Settings) xdsHeaders() ([][2]string, error) {
	pairs, err := keyValues("--rls-xds-headers", s.RLSXDSHeaders)
	if err != nil {
		return nil, err
	}
	for i, p := range pairs {
		name := strings.ToLower(p[0])
		switch {
		case !httpguts.ValidHeaderFieldName(name):
			return nil, fmt.Errorf("--rls-xds-headers: %q is not a header name", p[0])
		case !httpguts.ValidHeaderFieldValue(p[1]):
			return nil, fmt.Errorf("--rls-xds-headers: the value of %s is not a header value", p[0])
		case name == "content-type" || name == "te" || name == "host" || name == "connection" || strings.HasPrefix(name, "grpc-"):
			return nil, fmt.Errorf("--rls-xds-headers: %s is gRPC's own header", p[0])
		}
		pairs[i][0] = name
	}
	return pairs, nil
}

// keyValues splits s, the value of flag, into KEY=VALUE pairs separated
// by commas, keys not empty; none for "".
func keyValues(flag, s string) ([][2]string, error) {
	if s == "" {
		return nil, nil
	}
	var pairs [][2]string
	for _, item := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: want KEY=VALUE pairs separated by commas", flag, s)
		}
		pairs = append(pairs, [2]string{k, v})
	}
	return pairs, nil
}

// xdsTLS is the TLS configuration of an https:// --rls-xds.
func (s *Settings) xdsTLS() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: s.RLSXDSServerName}
	var err error
	c.RootCAs, c.Certificates, err = clientTLSFiles("--rls-xds", s.RLSXDSCA, s.RLSXDSCert, s.RLSXDSKey)
	return c, err
}

// clientTLSFiles reads a client's TLS files, those of the flags named
// flag-ca, flag-cert and flag-key: the CAs that verify the server (nil
// for none: the system roots) and the client's certificate (none for "").
func clientTLSFiles(flag, ca, cert, key string) (*x509.CertPool, []tls.Certificate, error) {
	var roots *x509.CertPool
	if ca != "" {
		pemBytes, err := os.ReadFile(ca)
		if err != nil {
			return nil, nil, fmt.Errorf("%s-ca: %w", flag, err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pemBytes) {
			return nil, nil, fmt.Errorf("%s-ca: no PEM certificate in %s", flag, ca)
		}
	}
	if cert == "" {
		return roots, nil, nil
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, nil, fmt.Errorf("%s-cert: %w", flag, err)
	}
	return roots, []tls.Certificate{pair}, nil
}

// clientSANs is --tls-client-san's names; none when it is empty.
func (s *Settings) clientSANs() []string {
	if s.TLSClientSAN == "" {
		return nil
	}
	names := strings.Split(s.TLSClientSAN, ",")
	for i := range names {
		names[i] = strings.TrimSpace(names[i])
	}
	return names
}

// loadRLS reads --rls-config as the settings say, and returns the files
// it read with the configuration; its error names the flag.
func (s *Settings) loadRLS() (*rls.Config, map[string][]byte, error) {
	files, err := rls.ReadFiles(s.RLSConfig)
	if err != nil {
		return nil, nil, fmt.Errorf("--rls-config: %w", err)
	}
	cfg, err := s.parseRLS(files)
	return cfg, files, err
}

// parseRLS is the configuration of files, read from --rls-config.
func (s *Settings) parseRLS(files map[string][]byte) (*rls.Config, error) {
	cfg, err := rls.Parse(files, s.RLSMergeDomainConfig)
	if err != nil {
		return nil, fmt.Errorf("--rls-config: %w", err)
	}
	return cfg, nil
}

// CheckFiles reads the files the settings name as a start reads them:
// --rls-config's configuration, Redis's and the xDS server's TLS files and
// the listener's TLS pair (which net/http reads when it serves). It
// connects to nothing.
func (s *Settings) CheckFiles() error {
	if s.RLSConfig != "" {
		if _, _, err := s.loadRLS(); err != nil {
			return err
		}
	}
	if err := loadRedisTLS(s, &store.RedisOptions{}); err != nil {
		return err
	}
	if s.RLSXDS != "" {
		if _, err := s.xdsTLS(); err != nil {
			return err
		}
	}
	if s.TLSCert != "" {
		if _, err := tls.LoadX509KeyPair(s.TLSCert, s.TLSKey); err != nil {
			return fmt.Errorf("--tls-cert, --tls-key: %w", err)
		}
	}
	if s.TLSClientCA != "" {
		if _, err := tlsfiles.LoadCAs("--tls-client-ca", s.TLSClientCA); err != nil {
			return err
		}
	}
	return nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("--log-level: %q is not debug, info, warn or error", s)
	}
	return l, nil
}

// socketMode is ListenMode parsed: 0 when it is not set.
func (s *Settings) socketMode() (os.FileMode, error) {
	if s.ListenMode == "" {
		return 0, nil
	}
	if _, unix := unixaddr.Path(s.Listen); !unix {
		return 0, errors.New("--listen-mode: only with --listen unix:///path")
	}
	m, err := strconv.ParseUint(s.ListenMode, 8, 32)
	if err != nil || m == 0 || m > 0o777 {
		return 0, fmt.Errorf("--listen-mode: %q is not a file mode from 0001 to 0777 in octal", s.ListenMode)
	}
	return os.FileMode(m), nil
}
