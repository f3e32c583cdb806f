package redisbridge

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
)

// A bridge may stand in for envoyproxy/ratelimit where a deployment sets
// that service's environment variables and nothing else: Envoy Gateway
// runs "/bin/ratelimit" in the image its rateLimitDeployment names, with
// a dozen of them. With --envoy-ratelimit-env (which the bridge's image
// sets when run as /bin/ratelimit), those variables are read as the
// bridge flags that do what they ask, before the bridge's own SLUICE_*
// variables and flags, which win. A variable whose value the bridge cannot
// honour without deciding differently is refused by name; one that only
// concerns how that service reports or tunes itself is noted in the log.

// envFlag is a bridge flag set from one of envoyproxy/ratelimit's
// variables (env), which errors about the flag then name.
type envFlag struct{ env, flag, value string }

// overLimitCacheEntryBytes turns LOCAL_CACHE_SIZE_IN_BYTES into a number
// of counters for --rls-over-limit-cache: about what a spent counter
// takes in that service's cache (its key, a header and the value).
const overLimitCacheEntryBytes = 100

// envoyRatelimitFlags reads envoyproxy/ratelimit's variables from getenv,
// with that service's defaults, and returns the bridge flags they come to
// and notes on the ones set that change nothing here.
func envoyRatelimitFlags(getenv func(string) string) ([]envFlag, []string, error) {
	t := envTranslation{getenv: getenv}
	t.listeners()
	t.config()
	t.redis()
	t.service()
	t.ignored()
	return t.flags, t.notes, t.err
}

// envTranslation collects the flags and notes of envoyRatelimitFlags, and
// its first error.
type envTranslation struct {
	getenv func(string) string
	flags  []envFlag
	notes  []string
	err    error
}

// get is the variable's value, def when it is unset or empty (as
// envoyproxy/ratelimit's settings reader takes it).
func (t *envTranslation) get(name, def string) string {
	if v := t.getenv(name); v != "" {
		return v
	}
	return def
}

func (t *envTranslation) fail(name, format string, args ...any) {
	if t.err == nil {
		t.err = fmt.Errorf("%s: %s", name, fmt.Sprintf(format, args...))
	}
}

func (t *envTranslation) set(env, flag, value string) {
	t.flags = append(t.flags, envFlag{env, flag, value})
}

// setIf sets flag to the variable's value when it is set.
func (t *envTranslation) setIf(env, flag string) {
	if v := t.getenv(env); v != "" {
		t.set(env, flag, v)
	}
}

// boolean is the variable as a boolean, def when unset, read as that
// service reads it (strconv.ParseBool).
func (t *envTranslation) boolean(name string, def bool) bool {
	v := t.getenv(name)
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		t.fail(name, "%q is not a boolean", v)
	}
	return b
}

// hostPort joins a host variable and a port variable into an address.
func (t *envTranslation) hostPort(hostVar, hostDef, portVar, portDef string) string {
	port := t.get(portVar, portDef)
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		t.fail(portVar, "%q is not a port", port)
	}
	return net.JoinHostPort(t.get(hostVar, hostDef), port)
}

// listeners: its gRPC port is the bridge's listener; its HTTP port
// (/healthcheck, which Envoy Gateway's probes ask) and its Prometheus
// address are the bridge's health listener; its debug port only when
// asked for, since it serves pprof.
func (t *envTranslation) listeners() {
	if uds := t.getenv("GRPC_UDS"); uds != "" {
		t.set("GRPC_UDS", "listen", "unix://"+uds)
	} else {
		t.set("GRPC_PORT", "listen", t.hostPort("GRPC_HOST", "0.0.0.0", "GRPC_PORT", "8081"))
	}
	health := []string{t.hostPort("HOST", "0.0.0.0", "PORT", "8080")}
	if t.boolean("USE_PROMETHEUS", false) {
		if p := t.get("PROMETHEUS_PATH", "/metrics"); p != "/metrics" {
			t.fail("PROMETHEUS_PATH", "%q: the bridge serves its metrics at /metrics only", p)
		}
		if a := t.get("PROMETHEUS_ADDR", ":9090"); a != health[0] {
			health = append(health, a)
		}
	}
	t.set("PORT", "health-listen", strings.Join(health, ","))
	if t.getenv("DEBUG_HOST") != "" || t.getenv("DEBUG_PORT") != "" {
		t.set("DEBUG_PORT", "debug-listen", t.hostPort("DEBUG_HOST", "0.0.0.0", "DEBUG_PORT", "6070"))
	}
	if t.boolean("GRPC_SERVER_USE_TLS", false) {
		for _, name := range []string{"GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY"} {
			if t.getenv(name) == "" {
				t.fail(name, "required with GRPC_SERVER_USE_TLS")
			}
		}
		t.set("GRPC_SERVER_TLS_CERT", "tls-cert", t.getenv("GRPC_SERVER_TLS_CERT"))
		t.set("GRPC_SERVER_TLS_KEY", "tls-key", t.getenv("GRPC_SERVER_TLS_KEY"))
		t.setIf("GRPC_CLIENT_TLS_CACERT", "tls-client-ca")
		t.setIf("GRPC_CLIENT_TLS_SAN", "tls-client-san")
	}
	t.setIf("GRPC_MAX_CONNECTION_AGE", "max-connection-age")
	// Its levels the bridge lacks become the nearest it has; --log-level
	// checks the rest.
	if lvl := strings.ToLower(t.getenv("LOG_LEVEL")); lvl != "" {
		switch lvl {
		case "trace":
			lvl = "debug"
		case "warning":
			lvl = "warn"
		case "fatal", "panic":
			lvl = "error"
		}
		t.set("LOG_LEVEL", "log-level", lvl)
	}
}

// config: the limits come from its configuration directory, or from an
// xDS server.
func (t *envTranslation) config() {
	ct := t.get("CONFIG_TYPE", "FILE")
	switch ct {
	case "FILE":
		// Its files are those under the root's subdirectory's app
		// directory, whether or not it watches the root.
		t.set("RUNTIME_ROOT", "rls-config", filepath.Join(t.get("RUNTIME_ROOT", "/srv/runtime_data/current"),
			t.getenv("RUNTIME_SUBDIRECTORY"), t.get("RUNTIME_APPDIRECTORY", "config")))
	case "GRPC_XDS_SOTW":
		scheme := "http://"
		tls := t.boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS", false)
		if tls {
			scheme = "https://"
		}
		t.set("CONFIG_GRPC_XDS_SERVER_URL", "rls-xds", scheme+t.get("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"))
		t.setIf("CONFIG_GRPC_XDS_NODE_ID", "rls-xds-node-id")
		t.pairs("CONFIG_GRPC_XDS_NODE_METADATA", "rls-xds-node-metadata")
		t.pairs("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "rls-xds-headers")
		if tls {
			t.setIf("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "rls-xds-ca")
			t.setIf("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "rls-xds-cert")
			t.setIf("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "rls-xds-key")
			t.setIf("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "rls-xds-server-name")
		}
	default:
		t.fail("CONFIG_TYPE", "%q is neither FILE nor GRPC_XDS_SOTW", ct)
	}
	// That service is unhealthy until it has a domain configured with
	// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, and unless forced to, does
	// not listen before an xDS server's first configuration. The bridge
	// starts at once, not ready until then.
	switch {
	case t.boolean("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false):
		t.set("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "rls-ready-needs-config", "true")
	case ct == "GRPC_XDS_SOTW" && !t.boolean("FORCE_START_WITHOUT_INITIAL_CONFIG", false):
		t.set("FORCE_START_WITHOUT_INITIAL_CONFIG", "rls-ready-needs-config", "true")
	}
}

// pairs sets flag from a variable of pairs "k1:v1,k2:v2" (how that
// service's settings reader takes a map), as the flag's "k1=v1,k2=v2".
func (t *envTranslation) pairs(env, flag string) {
	v := t.getenv(env)
	if v == "" {
		return
	}
	var out []string
	for _, p := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(p, ":")
		if !ok {
			t.fail(env, "%q is not KEY:VALUE", p)
			return
		}
		out = append(out, k+"="+val)
	}
	t.set(env, flag, strings.Join(out, ","))
}

// redis: the counters are in Redis, reached as REDIS_TYPE, _SOCKET_TYPE,
// _URL, _AUTH and _TLS say, in one URL of the bridge's.
func (t *envTranslation) redis() {
	switch b := t.get("BACKEND_TYPE", "redis"); b {
	case "redis":
	case "memcache":
		t.fail("BACKEND_TYPE", "memcache is not supported: the bridge keeps its counters in Redis")
		return
	default:
		t.fail("BACKEND_TYPE", "%q is not redis", b)
		return
	}
	t.set("BACKEND_TYPE", "store", "redis")
	useTLS := t.boolean("REDIS_TLS", false)
	raw := t.get("REDIS_URL", "/var/run/nutcracker/ratelimit.sock")
	authUser, authPass := splitAuth(t.getenv("REDIS_AUTH"))
	scheme := "redis"
	if useTLS {
		scheme = "rediss"
	}
	var redisURL string
	switch typ := strings.ToLower(t.get("REDIS_TYPE", "SINGLE")); typ {
	case "single":
		switch sock := t.get("REDIS_SOCKET_TYPE", "unix"); sock {
		case "tcp":
			a := t.parseRedisAddrs(raw)
			if len(a.hosts) != 1 {
				t.fail("REDIS_URL", "%q: with REDIS_TYPE single, one address", raw)
				return
			}
			redisURL = scheme + "://" + userinfo(a.credentials(authUser, authPass)) + a.hosts[0]
			if a.db != "" {
				redisURL += "/" + url.PathEscape(a.db)
			}
		case "unix":
			if useTLS {
				t.fail("REDIS_TLS", "not with REDIS_SOCKET_TYPE unix")
			}
			redisURL = "unix://" + userinfo(authUser, authPass) + raw
		default:
			t.fail("REDIS_SOCKET_TYPE", "%q is neither tcp nor unix", sock)
		}
	case "cluster":
		a := t.parseRedisAddrs(raw)
		if a.db != "" && a.db != "0" {
			t.fail("REDIS_URL", "%q: a cluster has only db 0", raw)
		}
		redisURL = scheme + "+cluster://" + userinfo(a.credentials(authUser, authPass)) + strings.Join(a.hosts, ",")
	case "sentinel":
		master, sentinels, ok := strings.Cut(raw, ",")
		if !ok {
			t.fail("REDIS_URL", "%q: with REDIS_TYPE sentinel, want the master's name, then the sentinels: name,host:port,...", raw)
			return
		}
		// A sentinel's URL authenticates to the sentinels, where
		// REDIS_SENTINEL_AUTH does not.
		a := t.parseRedisAddrs(sentinels)
		if a.db != "" {
			t.fail("REDIS_URL", "%q: a sentinel has no db", raw)
		}
		q := url.Values{}
		user, pass := a.credentials(splitAuth(t.getenv("REDIS_SENTINEL_AUTH")))
		if user != "" {
			q.Set("sentinel_username", user)
		}
		if pass != "" {
			q.Set("sentinel_password", pass)
		}
		redisURL = scheme + "+sentinel://" + userinfo(authUser, authPass) + strings.Join(a.hosts, ",") + "/" + url.PathEscape(master)
		if len(q) > 0 {
			redisURL += "?" + q.Encode()
		}
	default:
		t.fail("REDIS_TYPE", "%q is not SINGLE, SENTINEL or CLUSTER", t.getenv("REDIS_TYPE"))
	}
	t.set("REDIS_URL", "redis-url", redisURL)
	if useTLS {
		t.setIf("REDIS_TLS_CACERT", "redis-tls-ca")
		t.setIf("REDIS_TLS_CLIENT_CERT", "redis-tls-cert")
		t.setIf("REDIS_TLS_CLIENT_KEY", "redis-tls-key")
		if t.boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false) {
			t.fail("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "not supported: the bridge verifies Redis's certificate and its name; give its CA with REDIS_TLS_CACERT")
		}
	}
	t.setIf("REDIS_POOL_SIZE", "redis-pool-size")
	t.setIf("REDIS_TIMEOUT", "redis-timeout")
}

// splitAuth reads REDIS_AUTH and REDIS_SENTINEL_AUTH as that service
// does: "user:password", or a password alone.
func splitAuth(auth string) (user, pass string) {
	if u, p, ok := strings.Cut(auth, ":"); ok {
		return u, p
	}
	return "", auth
}

// redisAddrs are REDIS_URL's addresses, host:port each, and what their
// redis:// URLs say (parseRedisAddrs).
type redisAddrs struct {
	hosts          []string
	user, pass, db string
}

// parseRedisAddrs reads a comma-separated list of addresses as that service's
// Redis client (radix) dials them: each is host:port, or a redis:// URL
// whose user and password (in it, or as ?username= and ?password=) are
// used where REDIS_AUTH gives none, and whose db (its path, or ?db=) is
// selected on connecting. The bridge has one set of credentials and one
// db for every node, so the URLs must agree on them; a host:port takes
// theirs.
func (t *envTranslation) parseRedisAddrs(list string) redisAddrs {
	var out redisAddrs
	urls := 0
	for _, addr := range strings.Split(list, ",") {
		if strings.Contains(addr, "://") && !strings.HasPrefix(addr, "redis://") {
			t.fail("REDIS_URL", "%q: an address is host:port or a redis:// URL (REDIS_TLS asks for TLS)", addr)
			return out
		}
		if strings.HasPrefix(addr, "redis://") {
			var a redisAddrs
			u, err := url.Parse(addr)
			if err != nil {
				t.fail("REDIS_URL", "%q does not parse: %v", addr, err)
				return out
			}
			q := u.Query()
			a.user, a.pass, a.db = q.Get("username"), q.Get("password"), q.Get("db")
			if n := u.User.Username(); n != "" {
				a.user = n
			}
			if p, ok := u.User.Password(); ok {
				a.pass = p
			}
			if u.Path != "" && u.Path != "/" {
				a.db = u.Path[1:]
			}
			if urls++; urls > 1 && (a.user != out.user || a.pass != out.pass || a.db != out.db) {
				t.fail("REDIS_URL", "%q: its URLs give different credentials or dbs; the bridge has one set for every node", list)
				return out
			}
			out.user, out.pass, out.db = a.user, a.pass, a.db
			addr = u.Host
		}
		if addr == "" {
			t.fail("REDIS_URL", "%q: an address is empty", list)
			return out
		}
		out.hosts = append(out.hosts, addr)
	}
	return out
}

// credentials are user and pass (REDIS_AUTH's or REDIS_SENTINEL_AUTH's),
// each taken from a's URLs where empty, as that service's client takes
// them.
func (a redisAddrs) credentials(user, pass string) (string, string) {
	if user == "" {
		user = a.user
	}
	if pass == "" {
		pass = a.pass
	}
	return user, pass
}

// userinfo is a Redis URL's user information and "@", or "" for no user
// and no password.
func userinfo(user, pass string) string {
	if user == "" && pass == "" {
		return ""
	}
	return url.UserPassword(user, pass).String() + "@"
}

// service: how the rate limit service answers.
func (t *envTranslation) service() {
	for _, b := range []struct{ env, flag string }{
		{"SHADOW_MODE", "rls-shadow-mode"},
		{"QUOTA_MODE", "rls-quota-mode"},
		{"MERGE_DOMAIN_CONFIG", "rls-merge-domain-config"},
		{"LIMIT_RESPONSE_HEADERS_ENABLED", "rls-response-headers"},
		{"RESPONSE_DYNAMIC_METADATA", "rls-response-metadata"},
	} {
		if t.boolean(b.env, false) {
			t.set(b.env, b.flag, "true")
		}
	}
	if t.getenv("LIMIT_LIMIT_HEADER") != "" || t.getenv("LIMIT_REMAINING_HEADER") != "" || t.getenv("LIMIT_RESET_HEADER") != "" {
		t.set("LIMIT_LIMIT_HEADER", "rls-response-header-names", t.get("LIMIT_LIMIT_HEADER", "RateLimit-Limit")+","+
			t.get("LIMIT_REMAINING_HEADER", "RateLimit-Remaining")+","+t.get("LIMIT_RESET_HEADER", "RateLimit-Reset"))
	}
	t.setIf("NEAR_LIMIT_RATIO", "near-limit-ratio")
	if v := t.getenv("LOCAL_CACHE_SIZE_IN_BYTES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			t.fail("LOCAL_CACHE_SIZE_IN_BYTES", "%q is not a size in bytes", v)
		}
		if n > 0 {
			t.set("LOCAL_CACHE_SIZE_IN_BYTES", "rls-over-limit-cache", strconv.Itoa(max(n/overLimitCacheEntryBytes, 1)))
		}
	}
}

// ignored notes the variables set that change nothing here: how that
// service reports, traces and tunes itself.
func (t *envTranslation) ignored() {
	note := func(name, why string) { t.notes = append(t.notes, name+": "+why) }
	if t.boolean("USE_STATSD", false) || t.boolean("USE_DOG_STATSD", false) {
		note("USE_STATSD", "no StatsD; the metrics are Prometheus's, at /metrics on "+t.hostPort("HOST", "0.0.0.0", "PORT", "8080"))
	}
	if t.getenv("PROMETHEUS_MAPPER_YAML") != "" {
		note("PROMETHEUS_MAPPER_YAML", "the metrics have the bridge's own names (sluice_bridge_*)")
	}
	if t.boolean("TRACING_ENABLED", false) {
		note("TRACING_ENABLED", "no tracing")
	}
	if t.boolean("REDIS_PERSECOND", false) {
		note("REDIS_PERSECOND", "per-second limits count in the same Redis as the others")
	}
	if t.getenv("CACHE_KEY_PREFIX") != "" {
		note("CACHE_KEY_PREFIX", "the bridge's keys are its own (rls: and the domain)")
	}
	if f := t.getenv("LOG_FORMAT"); f != "" && f != "json" {
		note("LOG_FORMAT", "the bridge logs JSON lines")
	}
	for _, name := range []string{"GRPC_MAX_CONNECTION_AGE_GRACE", "REDIS_PIPELINE_WINDOW", "REDIS_PIPELINE_LIMIT",
		"EXPIRATION_JITTER_MAX_SECONDS", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
		"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"} {
		if t.getenv(name) != "" {
			note(name, "the bridge's own (docs/bridge.md, \"Moving from envoyproxy/ratelimit\")")
		}
	}
}
