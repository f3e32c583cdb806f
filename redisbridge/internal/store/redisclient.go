package store

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/rawsock"
)

// newClient builds a go-redis client from our URL forms. For a single Redis
// it also returns the client's options.
func newClient(o RedisOptions) (redis.UniversalClient, bool, *redis.Options, error) {
	scheme, rest, ok := strings.Cut(o.URL, "://")
	if !ok {
		return nil, false, nil, fmt.Errorf("redis url: missing scheme (redis://, rediss://, redis+sentinel://, redis+cluster://)")
	}
	setup := func(dial, rw *time.Duration, pool *int, retries *int) {
		if o.Timeout > 0 {
			*dial, *rw = o.Timeout, o.Timeout
		}
		if o.PoolSize > 0 {
			*pool = o.PoolSize
		}
		// A retried script may already have run: never retry, fail the check.
		*retries = -1
	}
	switch scheme {
	case "redis", "rediss", "unix":
		opt, err := redis.ParseURL(o.URL)
		if err != nil {
			return nil, false, nil, fmt.Errorf("redis url: %w", err)
		}
		setup(&opt.DialTimeout, &opt.ReadTimeout, &opt.PoolSize, &opt.MaxRetries)
		opt.WriteTimeout = opt.ReadTimeout
		applyTLS(opt.TLSConfig, o)
		opt.Dialer = redisDialer(&opt.DialTimeout, opt.TLSConfig)
		return redis.NewClient(opt), false, opt, nil
	case "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster":
	default:
		return nil, false, nil, fmt.Errorf("redis url: unknown scheme %q", scheme)
	}
	u, err := splitMultiHostURL(rest)
	if err != nil {
		return nil, false, nil, fmt.Errorf("redis url: %w", err)
	}
	var tlsConf *tls.Config
	if strings.HasPrefix(scheme, "rediss") {
		host, _, _ := strings.Cut(u.hosts[0], ":")
		tlsConf = &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
		applyTLS(tlsConf, o)
	}
	if strings.HasSuffix(scheme, "+cluster") {
		if u.path != "" {
			return nil, false, nil, errors.New("redis url: a cluster URL has no path (Redis Cluster has only db 0)")
		}
		opt := &redis.ClusterOptions{Addrs: u.hosts, Username: u.user, Password: u.pass, TLSConfig: tlsConf}
		setup(&opt.DialTimeout, &opt.ReadTimeout, &opt.PoolSize, &opt.MaxRetries)
		opt.WriteTimeout = opt.ReadTimeout
		opt.Dialer = redisDialer(&opt.DialTimeout, tlsConf)
		return redis.NewClusterClient(opt), true, nil, nil
	}
	opt, err := failoverOptions(u, tlsConf)
	if err != nil {
		return nil, false, nil, err
	}
	setup(&opt.DialTimeout, &opt.ReadTimeout, &opt.PoolSize, &opt.MaxRetries)
	opt.WriteTimeout = opt.ReadTimeout
	opt.Dialer = redisDialer(&opt.DialTimeout, tlsConf) // the sentinels' connections too
	return redis.NewFailoverClient(opt), false, nil, nil
}

// redisKeepAlive is the TCP keep-alive of every connection to Redis, as
// go-redis's own dialer sets it: probes after 30 s idle (under the idle
// timeouts of load balancers and NATs), 5 s apart, the connection dead
// after 3 unanswered.
var redisKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 5 * time.Second, Count: 3}

// dialRedis connects to a Redis server or sentinel as go-redis's own dialer
// does (timeout bounds the connection and the TLS handshake; the server
// name is the address's host when tlsConf has none), on a socket read and
// written by raw system calls (internal/rawsock): a check's commands and
// answers are a write and a read each, and Go's bookkeeping for a call that
// may block cost the bridge more than either. The direct connections and
// every go-redis client of the store dial through it.
func dialRedis(ctx context.Context, timeout time.Duration, network, addr string, tlsConf *tls.Config) (net.Conn, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	c, err := (&net.Dialer{KeepAliveConfig: redisKeepAlive}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c = rawsock.Wrap(c)
	if tlsConf == nil {
		return c, nil
	}
	if tlsConf.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			tlsConf = tlsConf.Clone()
			tlsConf.ServerName = host
		}
	}
	tc := tls.Client(c, tlsConf)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

// redisDialer is dialRedis as a go-redis client's Dialer. timeout points
// into the client's options: go-redis puts its default there when the
// client is made.
func redisDialer(timeout *time.Duration, tlsConf *tls.Config) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dialRedis(ctx, *timeout, network, addr, tlsConf)
	}
}

// failoverOptions are a sentinel URL's: the sentinels, the master's name
// (the path), its credentials, and the sentinels' own
// (sentinel_username=, sentinel_password=).
func failoverOptions(u multiHostURL, tlsConf *tls.Config) (*redis.FailoverOptions, error) {
	if u.path == "" {
		return nil, errors.New("redis url: a sentinel URL needs the master name as its path: redis+sentinel://host:26379/mymaster")
	}
	opt := &redis.FailoverOptions{
		MasterName: u.path, SentinelAddrs: u.hosts, Username: u.user, Password: u.pass, TLSConfig: tlsConf,
		SentinelUsername: u.query.Get("sentinel_username"), SentinelPassword: u.query.Get("sentinel_password"),
	}
	if db := u.query.Get("db"); db != "" {
		var err error
		if opt.DB, err = strconv.Atoi(db); err != nil || opt.DB < 0 {
			return nil, fmt.Errorf("redis url: db: %q is not a database number", db)
		}
	}
	return opt, nil
}

// applyTLS adds the configured CA and client certificates to c (nil for
// cleartext URLs).
func applyTLS(c *tls.Config, o RedisOptions) {
	if c == nil {
		return
	}
	if o.RootCAs != nil {
		c.RootCAs = o.RootCAs
	}
	if len(o.Certificates) > 0 {
		c.Certificates = o.Certificates
	}
}

type multiHostURL struct {
	user, pass string
	hosts      []string
	path       string
	query      url.Values
}

// splitMultiHostURL parses "[user:pass@]h1:p1,h2:p2[/path][?query]", which
// net/url does not accept because of the comma-separated hosts.
func splitMultiHostURL(rest string) (multiHostURL, error) {
	var u multiHostURL
	rest, q, _ := strings.Cut(rest, "?")
	var err error
	if u.query, err = url.ParseQuery(q); err != nil {
		return u, fmt.Errorf("query: %w", err)
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		info := rest[:at]
		rest = rest[at+1:]
		user, pass, _ := strings.Cut(info, ":")
		if u.user, err = url.PathUnescape(user); err != nil {
			return u, fmt.Errorf("user: %w", err)
		}
		if u.pass, err = url.PathUnescape(pass); err != nil {
			return u, fmt.Errorf("password: %w", err)
		}
	}
	hosts, path, _ := strings.Cut(rest, "/")
	u.path = strings.Trim(path, "/")
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			return u, errors.New("empty host")
		}
		if !strings.Contains(h, ":") {
			h += ":6379"
		}
		u.hosts = append(u.hosts, h)
	}
	return u, nil
}

// unavailableReplies are error replies that mean Redis cannot serve us now
// (starting, failing over) or will not let us in (credentials, ACL; an
// unauthenticated client's script call gets "Protocol error:
// unauthenticated multibulk length", and Redis then closes the
// connection): the store is unavailable, not broken.
var unavailableReplies = []string{"LOADING", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "READONLY", "NOAUTH", "WRONGPASS", "NOPERM", "Protocol error"}

// storeErr classifies a command error: a Redis error reply is a bug (ours or
// a hostile setup) unless it is one of unavailableReplies; anything else
// means Redis could not be reached in time.
func storeErr(err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		unavailable := false
		for _, p := range unavailableReplies {
			unavailable = unavailable || redis.HasErrorPrefix(err, p)
		}
		if !unavailable {
			return fmt.Errorf("redis script: %w", err)
		}
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// goRedisArgs collects a script command for go-redis.
type goRedisArgs []any

func (a *goRedisArgs) begin(parts int)  { *a = make([]any, 0, parts) }
func (a *goRedisArgs) bulk(x, y string) { *a = append(*a, x+y) }
func (a *goRedisArgs) int(n int64)      { *a = append(*a, n) }

var redisLogOnce sync.Once

// goRedisLog sends go-redis's own messages (one per failed dial during an
// outage) to the debug level; failed checks are logged by the bridge.
type goRedisLog struct{ l *slog.Logger }

func (g goRedisLog) Printf(ctx context.Context, format string, v ...any) {
	g.l.DebugContext(ctx, "go-redis: "+fmt.Sprintf(format, v...))
}
