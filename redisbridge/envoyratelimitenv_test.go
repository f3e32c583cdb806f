package redisbridge

import (
	"context"
	"crypto/tls"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice/internal/nettest"
	"github.com/sluicehq/sluice/internal/tlsfiles/tlsfilestest"
	"github.com/sluicehq/sluice/redisbridge/internal/rls"
	"github.com/sluicehq/sluice/redisbridge/redistest"
)

// envoyGatewayEnv is the environment Envoy Gateway gives the rate limit
// service it deploys, with Prometheus on (its default): the variables of
// its ratelimit Deployment (internal/infrastructure/kubernetes/ratelimit
// in envoyproxy/gateway), as it runs /bin/ratelimit with no arguments.
var envoyGatewayEnv = map[string]string{
	"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true", "RUNTIME_WATCH_ROOT": "false",
	"LOG_LEVEL": "info", "USE_STATSD": "false",
	"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway:18001", "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
	"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/certs/tls.crt", "GRPC_SERVER_TLS_KEY": "/certs/tls.key",
	// Not one of envoyproxy/ratelimit's: it reads no such variable.
	"GRPC_SERVER_TLS_CA_CERT": "/certs/ca.crt", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true",
	"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/certs/tls.crt", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "/certs/tls.key",
	"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/certs/ca.crt", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
	"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis.redis.svc:6379",
	"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001", "PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml",
}

// with is env with more variables (or others' values).
func with(env map[string]string, kv ...string) map[string]string {
	out := maps.Clone(env)
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// With --envoy-ratelimit-env, envoyproxy/ratelimit's variables are read,
// with that service's defaults, as the bridge settings that do what they
// ask; the bridge's own variables and flags win; the ones that change
// nothing are noted for the log.
func TestParseSettings_EnvoyRatelimitEnv(t *testing.T) {
	// base is what every case starts from: the bridge's defaults, and
	// that service's listeners and Redis store.
	base := func(edit func(s *Settings)) Settings {
		s := DefaultSettings()
		s.EnvoyRatelimitEnv = true
		s.Listen, s.HealthListen, s.Store = "0.0.0.0:8081", "0.0.0.0:8080", "redis"
		edit(&s)
		return s
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want Settings
	}{
		{"Envoy Gateway's", envoyGatewayEnv, nil, base(func(s *Settings) {
			s.HealthListen = "0.0.0.0:8080,:19001"
			s.RedisURL = "redis://redis.redis.svc:6379"
			s.TLSCert, s.TLSKey = "/certs/tls.crt", "/certs/tls.key"
			s.RLSXDS, s.RLSXDSNodeID = "https://envoy-gateway:18001", "envoy-ratelimit"
			s.RLSXDSCA, s.RLSXDSCert, s.RLSXDSKey = "/certs/ca.crt", "/certs/tls.crt", "/certs/tls.key"
			s.notes = []string{"PROMETHEUS_MAPPER_YAML: the metrics have the bridge's own names (sluice_bridge_*)"}
		})},
		{"none set: that service's defaults", map[string]string{}, nil, base(func(s *Settings) {
			s.RedisURL = "unix:///var/run/nutcracker/ratelimit.sock"
			s.RLSConfig = "/srv/runtime_data/current/config"
		})},
		{"a file configuration, as envoyproxy/ratelimit's examples deploy it", map[string]string{
			"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false",
			"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "REDIS_AUTH": "s3cret", "LOG_LEVEL": "debug",
			"USE_STATSD": "false", "PORT": "9080", "GRPC_PORT": "9081", "DEBUG_PORT": "6070", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true",
		}, nil, base(func(s *Settings) {
			s.RLSReadyNeedsConfig = true
			s.Listen, s.HealthListen, s.DebugListen = "0.0.0.0:9081", "0.0.0.0:9080", "0.0.0.0:6070"
			s.RedisURL, s.LogLevel = "redis://:s3cret@redis:6379", "debug"
			s.RLSConfig = "/data/ratelimit/config"
		})},
		{"Sentinel over TLS", map[string]string{
			"REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,s1:26379,s2:26379", "REDIS_AUTH": "app:pw", "REDIS_SENTINEL_AUTH": "watch:spw",
			"REDIS_TLS": "true", "REDIS_TLS_CACERT": "/ca.pem", "REDIS_TLS_CLIENT_CERT": "/c.pem", "REDIS_TLS_CLIENT_KEY": "/k.pem",
			"REDIS_POOL_SIZE": "20", "REDIS_TIMEOUT": "300ms", "GRPC_UDS": "/run/rl.sock", "LOG_LEVEL": "WARNING",
		}, nil, base(func(s *Settings) {
			s.Listen, s.LogLevel = "unix:///run/rl.sock", "warn"
			s.RedisURL = "rediss+sentinel://app:pw@s1:26379,s2:26379/mymaster?sentinel_password=spw&sentinel_username=watch"
			s.RedisTLSCA, s.RedisTLSCert, s.RedisTLSKey = "/ca.pem", "/c.pem", "/k.pem"
			s.RedisPoolSize, s.RedisTimeout = 20, 300*time.Millisecond
			s.RLSConfig = "/srv/runtime_data/current/config"
		})},
		{"Cluster; the service's options; what changes nothing", map[string]string{
			"REDIS_TYPE": "cluster", "REDIS_URL": "n1:7000,n2:7000", "CONFIG_TYPE": "GRPC_XDS_SOTW",
			"CONFIG_GRPC_XDS_NODE_METADATA": "zone:a,team:b", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "authorization:Bearer t",
			"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/ignored-without-tls.pem", "SHADOW_MODE": "true", "QUOTA_MODE": "1", "MERGE_DOMAIN_CONFIG": "true", "LIMIT_RESPONSE_HEADERS_ENABLED": "true",
			"LIMIT_REMAINING_HEADER": "X-Left", "RESPONSE_DYNAMIC_METADATA": "true", "NEAR_LIMIT_RATIO": "0.9",
			"LOCAL_CACHE_SIZE_IN_BYTES": "1048576", "USE_STATSD": "true", "TRACING_ENABLED": "true", "LOG_FORMAT": "text",
			"CACHE_KEY_PREFIX": "rl_", "REDIS_PIPELINE_WINDOW": "150us", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true",
		}, nil, base(func(s *Settings) {
			s.RedisURL = "redis+cluster://n1:7000,n2:7000"
			s.RLSXDS, s.RLSXDSNodeMetadata, s.RLSXDSHeaders = "http://localhost:18000", "zone=a,team=b", "authorization=Bearer t"
			s.RLSShadowMode, s.RLSQuotaMode, s.RLSMergeDomainConfig, s.RLSResponseHeaders, s.RLSResponseMetadata = true, true, true, true, true
			s.RLSResponseHeaderNames = "RateLimit-Limit,X-Left,RateLimit-Reset"
			s.NearLimitRatio, s.RLSOverLimitCache = 0.9, 1048576/overLimitCacheEntryBytes
			s.RLSReadyNeedsConfig = true // not FORCE_START_WITHOUT_INITIAL_CONFIG
			s.notes = []string{
				"USE_STATSD: no StatsD; the metrics are Prometheus's, at /metrics on 0.0.0.0:8080",
				"TRACING_ENABLED: no tracing",
				"CACHE_KEY_PREFIX: the bridge's keys are its own (rls: and the domain)",
				"LOG_FORMAT: the bridge logs JSON lines",
				`REDIS_PIPELINE_WINDOW: the bridge's own (docs/bridge.md, "Moving from envoyproxy/ratelimit")`,
			}
		})},
		// Its Redis client takes an address as a redis:// URL too, with
		// credentials REDIS_AUTH (or REDIS_SENTINEL_AUTH) does not give,
		// and a db; REDIS_TLS says whether it is TLS.
		{"a URL with a user, REDIS_AUTH's password, a db, TLS", map[string]string{
			"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis://app:ignored@r:6380/2?password=ignored&pool_size=3", "REDIS_AUTH": "pw", "REDIS_TLS": "true",
		}, nil, base(func(s *Settings) {
			s.RedisURL = "rediss://app:pw@r:6380/2"
			s.RLSConfig = "/srv/runtime_data/current/config"
		})},
		{"URLs' credentials as query parameters, a host:port beside them", map[string]string{
			"REDIS_TYPE": "cluster", "REDIS_URL": "redis://n1:7000?username=app&password=pw&db=0,n2:7000,redis://app:pw@n3:7000/0",
		}, nil, base(func(s *Settings) {
			s.RedisURL = "redis+cluster://app:pw@n1:7000,n2:7000,n3:7000"
			s.RLSConfig = "/srv/runtime_data/current/config"
		})},
		{"sentinels' URLs authenticate to the sentinels", map[string]string{
			"REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster,redis://:spw@s1:26379,s2:26379", "REDIS_AUTH": "pw",
		}, nil, base(func(s *Settings) {
			s.RedisURL = "redis+sentinel://:pw@s1:26379,s2:26379/mymaster?sentinel_password=spw"
			s.RLSConfig = "/srv/runtime_data/current/config"
		})},
		{"the bridge's own variables and flags win", with(envoyGatewayEnv, "SLUICE_REDIS_URL", "redis://elsewhere:6379", "SLUICE_LOG_LEVEL", "error"),
			[]string{"--health-listen", "127.0.0.1:8080"}, base(func(s *Settings) {
				s.HealthListen = "127.0.0.1:8080"
				s.RedisURL, s.LogLevel = "redis://elsewhere:6379", "error"
				s.TLSCert, s.TLSKey = "/certs/tls.crt", "/certs/tls.key"
				s.RLSXDS, s.RLSXDSNodeID = "https://envoy-gateway:18001", "envoy-ratelimit"
				s.RLSXDSCA, s.RLSXDSCert, s.RLSXDSKey = "/certs/ca.crt", "/certs/tls.crt", "/certs/tls.key"
				s.notes = []string{"PROMETHEUS_MAPPER_YAML: the metrics have the bridge's own names (sluice_bridge_*)"}
			})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := with(tc.env, "SLUICE_ENVOY_RATELIMIT_ENV", "true")
			got, err := ParseSettings(tc.args, func(k string) string { return env[k] })
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("settings\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	t.Run("without the flag, none is read", func(t *testing.T) {
		got, err := ParseSettings(nil, func(k string) string { return envoyGatewayEnv[k] })
		if err != nil {
			t.Fatal(err)
		}
		if want := DefaultSettings(); !reflect.DeepEqual(got, want) {
			t.Errorf("settings\n got %+v\nwant %+v", got, want)
		}
	})
}

// A variable the bridge cannot honour, or that does not parse, is refused
// by its name; so is a setting it makes that the bridge's checks refuse.
func TestParseSettings_EnvoyRatelimitEnvRefused(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"BACKEND_TYPE": "memcache"}, "BACKEND_TYPE: memcache is not supported"},
		{map[string]string{"CONFIG_TYPE": "GRPC_XDS_DELTA"}, `CONFIG_TYPE: "GRPC_XDS_DELTA" is neither FILE nor GRPC_XDS_SOTW`},
		{map[string]string{"REDIS_TYPE": "ring"}, `REDIS_TYPE: "ring" is not SINGLE, SENTINEL or CLUSTER`},
		{map[string]string{"REDIS_SOCKET_TYPE": "udp"}, `REDIS_SOCKET_TYPE: "udp" is neither tcp nor unix`},
		{map[string]string{"REDIS_TYPE": "sentinel", "REDIS_URL": "s1:26379"}, "REDIS_URL: \"s1:26379\": with REDIS_TYPE sentinel"},
		{map[string]string{"REDIS_TLS": "true", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"},
			"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION: not supported"},
		{map[string]string{"REDIS_TLS": "true"}, "REDIS_TLS: not with REDIS_SOCKET_TYPE unix"},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r1:6379,r2:6379"}, `REDIS_URL: "r1:6379,r2:6379": with REDIS_TYPE single, one address`},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "rediss://r:6379"}, `REDIS_URL: "rediss://r:6379": an address is host:port or a redis:// URL`},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis://r:6379/%zz"}, `REDIS_URL: "redis://r:6379/%zz" does not parse`},
		{map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": "n1:7000,,n2:7000"}, `REDIS_URL: "n1:7000,,n2:7000": an address is empty`},
		{map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": "redis://:a@n1:7000,redis://:b@n2:7000"}, "its URLs give different credentials or dbs"},
		{map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": "redis://n1:7000/1"}, `REDIS_URL: "redis://n1:7000/1": a cluster has only db 0`},
		{map[string]string{"REDIS_TYPE": "sentinel", "REDIS_URL": "m,redis://s1:26379?db=1"}, "a sentinel has no db"},
		{map[string]string{"GRPC_PORT": "grpc"}, `GRPC_PORT: "grpc" is not a port`},
		{map[string]string{"SHADOW_MODE": "maybe"}, `SHADOW_MODE: "maybe" is not a boolean`},
		{map[string]string{"LOG_LEVEL": "loud"}, `"loud" is not debug, info, warn or error (--log-level set from LOG_LEVEL)`},
		{map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_PATH": "/stats"}, "PROMETHEUS_PATH: \"/stats\": the bridge serves its metrics at /metrics only"},
		{map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_KEY": "/k"}, "GRPC_SERVER_TLS_CERT: required with GRPC_SERVER_USE_TLS"},
		{map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_METADATA": "zone"}, `CONFIG_GRPC_XDS_NODE_METADATA: "zone" is not KEY:VALUE`},
		{map[string]string{"LOCAL_CACHE_SIZE_IN_BYTES": "1MB"}, `LOCAL_CACHE_SIZE_IN_BYTES: "1MB" is not a size in bytes`},
		// Refused by the flag's parser or the bridge's checks, named.
		{map[string]string{"REDIS_POOL_SIZE": "ten"}, "--envoy-ratelimit-env: REDIS_POOL_SIZE: "},
		{map[string]string{"GRPC_CLIENT_TLS_SAN": "x", "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c", "GRPC_SERVER_TLS_KEY": "/k"},
			"--tls-client-san: only with --tls-client-ca (--tls-client-san set from GRPC_CLIENT_TLS_SAN)"},
		{map[string]string{"NEAR_LIMIT_RATIO": "2"}, "(--near-limit-ratio set from NEAR_LIMIT_RATIO)"},
	} {
		env := with(tc.env, "SLUICE_ENVOY_RATELIMIT_ENV", "true")
		_, err := ParseSettings(nil, func(k string) string { return env[k] })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one with %q", tc.env, err, tc.want)
		}
	}
}

func TestMentionsFlag(t *testing.T) {
	for _, tc := range []struct {
		msg, flag string
		want      bool
	}{
		{"--rls-xds: bad", "rls-xds", true},
		{"--rls-xds-ca, --rls-xds-cert: only with --rls-xds", "rls-xds", true},
		{"--rls-xds-ca, --rls-xds-cert: only with x", "rls-xds", false},
		{"--tls-cert, --tls-key: set both", "tls-cert", true},
		{"--redis-tls-cert: x", "tls-cert", false},
		{"--listen", "listen", true},
	} {
		if got := mentionsFlag(tc.msg, tc.flag); got != tc.want {
			t.Errorf("mentionsFlag(%q, %q) = %v", tc.msg, tc.flag, got)
		}
	}
}

// The bridge's binary run as Envoy Gateway runs its rate limit service:
// by the name /bin/ratelimit, with no argument, with the variables of
// envoyGatewayEnv (its addresses, files and Redis this test's). It
// listens where that service would: the rate limit service over TLS on
// the gRPC port, /healthcheck (Envoy Gateway's probes) on the HTTP port,
// /metrics on the Prometheus address; it asks the xDS server over mutual
// TLS, as node envoy-ratelimit, for its limits, and decides on Redis.
func TestEnvoyRatelimitEnv_AsEnvoyGatewayRunsIt(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin", "ratelimit")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/redisbridge").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// One CA, and one pair for the service and the xDS server each, as
	// Envoy Gateway's certgen issues them.
	ca := tlsfilestest.NewCA(t)
	caFile := filepath.Join(dir, "ca.crt")
	ca.WriteCert(t, caFile)
	cert, key := ca.Issue(t, dir, "envoy-ratelimit")
	xdsCert, xdsKey := ca.Issue(t, dir, "envoy-gateway")
	pair, err := tls.LoadX509KeyPair(xdsCert, xdsKey)
	if err != nil {
		t.Fatal(err)
	}
	ads, adsAddr := startADS(t, credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: ca.Pool,
		ClientAuth: tls.RequireAndVerifyClientCert}))
	rs := redistest.Start(t)
	addrs := nettest.FreeAddrs(t, 3)
	grpcAddr, httpAddr, promAddr := addrs[0], addrs[1], addrs[2]
	host, grpcPort, _ := net.SplitHostPort(grpcAddr)
	_, httpPort, _ := net.SplitHostPort(httpAddr)
	env := with(envoyGatewayEnv, "GRPC_HOST", host, "GRPC_PORT", grpcPort, "HOST", host, "PORT", httpPort, "PROMETHEUS_ADDR", promAddr,
		"CONFIG_GRPC_XDS_SERVER_URL", adsAddr, "REDIS_URL", rs.Addr,
		"GRPC_SERVER_TLS_CERT", cert, "GRPC_SERVER_TLS_KEY", key, "GRPC_SERVER_TLS_CA_CERT", caFile,
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", caFile)
	cmd := exec.Command(bin)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	cmd.Stderr = stderr
	logged := func() string { b, _ := os.ReadFile(stderr.Name()); return string(b) }
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-exited
	})
	// Envoy Gateway's readiness probe: GET /healthcheck on the HTTP port.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		select {
		case err := <-exited:
			t.Fatalf("the bridge exited: %v\n%s", err, logged())
		default:
		}
		res, err := http.Get("http://" + httpAddr + "/healthcheck")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthcheck: %v, %v\n%s", res, err, logged())
		}
	}
	req := nextRequest(t, ads)
	if req.GetNode().GetId() != "envoy-ratelimit" || req.GetTypeUrl() != rls.XDSTypeURL {
		t.Fatalf("xDS request %v; want node envoy-ratelimit, type %s", req, rls.XDSTypeURL)
	}
	ads.responses <- xdsResponse(t, "1", oneLimit(1))
	if ack := nextRequest(t, ads); ack.GetVersionInfo() != "1" || ack.GetErrorDetail() != nil {
		t.Fatalf("want the ACK of version 1, got %v", ack)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	call := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("k", "v")}}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		res, err := client.ShouldRateLimit(context.Background(), call)
		if err != nil || res.GetOverallCode() != want {
			t.Fatalf("call %d: %v, %v; want %v", i+1, res.GetOverallCode(), err, want)
		}
	}
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rc.Close()
	if n, err := rc.DBSize(context.Background()).Result(); err != nil || n == 0 {
		t.Errorf("Redis holds %d keys (%v): the counter is not there", n, err)
	}
	res, err := http.Get("http://" + promAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "sluice_bridge_rls") {
		t.Errorf("/metrics on the Prometheus address: %d, %.200s", res.StatusCode, body)
	}
	if !strings.Contains(logged(), "PROMETHEUS_MAPPER_YAML: the metrics have the bridge's own names") {
		t.Errorf("the log does not note PROMETHEUS_MAPPER_YAML:\n%s", logged())
	}
}
