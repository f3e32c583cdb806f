package store

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/rules"
)

var (
	//go:embed lua/check.lua
	checkLua string
	//go:embed lua/refund.lua
	refundLua string

	checkScript  = redis.NewScript(checkLua)
	refundScript = redis.NewScript(refundLua)
)

// CheckScript returns the check script's source, for benchmarks with redis-benchmark.
func CheckScript() string { return checkLua }

// RedisOptions configure a Redis store.
type RedisOptions struct {
	// URL is redis://, rediss://, redis+sentinel://, rediss+sentinel://,
	// redis+cluster:// or rediss+cluster:// (docs/bridge.md).
	URL      string
	PoolSize int           // connections per node, default 10 per CPU (go-redis)
	Timeout  time.Duration // dial, read and write timeout; also bounds a check
	// Pipelines is how many pipelines may be in flight at once; requests that
	// arrive meanwhile wait and go out together in the next one. Default 4.
	Pipelines int
	MaxBatch  int // commands per pipeline, default 128
	// RefreshEvery is how often overrides are looked up in Redis, default 1s.
	RefreshEvery time.Duration
	Logger       *slog.Logger
	// RootCAs verify Redis's certificate on rediss:// URLs (nil: system
	// roots); Certificates are presented to it (mutual TLS).
	RootCAs      *x509.CertPool
	Certificates []tls.Certificate
	// splitSlots decides per hash tag even on a single node, so tests can
	// exercise the Redis Cluster path with one redis-server.
	splitSlots bool
	// viaGoRedis sends checks to a single Redis through go-redis too, as
	// for Cluster and Sentinel (tests and benchmarks of that path).
	viaGoRedis bool
	idleCheck  time.Duration // direct connections: probe after this idle time (tests)
}

// Redis keeps counters in Redis (single, Sentinel or Cluster).
type Redis struct {
	c         redis.UniversalClient
	cluster   bool
	split     bool
	timeout   time.Duration
	log       *slog.Logger
	in        chan *call
	direct    *redis.Options // single Redis: pipelines use connections of their own (direct.go)
	idleCheck time.Duration  // see directConn.idleCheck
	overrides atomic.Pointer[overrideTable]
	version   atomic.Int64
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// overridesKey holds one field per override plus the "version" counter that
// bridges poll to notice changes.
const overridesKey = "sluice:overrides"

// NewRedis connects lazily: a Redis that is down at start makes checks fail
// until it is up, it does not stop the bridge.
func NewRedis(o RedisOptions) (*Redis, error) {
	c, cluster, single, err := newClient(o)
	if err != nil {
		return nil, err
	}
	if o.Pipelines <= 0 {
		o.Pipelines = 4
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 128
	}
	if o.RefreshEvery <= 0 {
		o.RefreshEvery = time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Redis{
		c: c, cluster: cluster, split: cluster || o.splitSlots, timeout: o.Timeout, log: o.Logger,
		in: make(chan *call, 4096), stop: make(chan struct{}),
	}
	if single != nil && !o.viaGoRedis {
		s.direct = single
		s.idleCheck = o.idleCheck
		if s.idleCheck <= 0 {
			s.idleCheck = defaultIdleCheck
		}
	}
	s.overrides.Store(&overrideTable{})
	s.version.Store(-1)
	redisLogOnce.Do(func() { redis.SetLogger(goRedisLog{o.Logger}) })
	for range o.Pipelines {
		s.wg.Add(1)
		go s.pipeline(o.MaxBatch)
	}
	s.wg.Add(1)
	go s.refreshLoop(o.RefreshEvery)
	return s, nil
}

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
		return redis.NewClusterClient(opt), true, nil, nil
	}
	if u.path == "" {
		return nil, false, nil, errors.New("redis url: a sentinel URL needs the master name as its path: redis+sentinel://host:26379/mymaster")
	}
	opt := &redis.FailoverOptions{
		MasterName: u.path, SentinelAddrs: u.hosts, Username: u.user, Password: u.pass, TLSConfig: tlsConf,
		SentinelPassword: u.query.Get("sentinel_password"),
	}
	if db := u.query.Get("db"); db != "" {
		if opt.DB, err = strconv.Atoi(db); err != nil || opt.DB < 0 {
			return nil, false, nil, fmt.Errorf("redis url: db: %q is not a database number", db)
		}
	}
	setup(&opt.DialTimeout, &opt.ReadTimeout, &opt.PoolSize, &opt.MaxRetries)
	opt.WriteTimeout = opt.ReadTimeout
	return redis.NewFailoverClient(opt), false, nil, nil
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

// call is one check.lua call waiting for a pipeline: the limits idx of ls
// (all when idx is nil) in mode "c" or "p".
type call struct {
	mode     string
	ls       []rules.LimitRequest
	idx      []int
	deadline time.Time // the pipeline drops the call once it is past
	expired  bool      // set by the pipeline: dropped, never sent
	vals     []int64   // the script's answer, or
	err      error     // why there is none
	done     chan struct{}
}

// limits is how many limits the call decides.
func (c *call) limits() int {
	if c.idx != nil {
		return len(c.idx)
	}
	return len(c.ls)
}

// limit returns the j-th limit the call decides.
func (c *call) limit(j int) *rules.LimitRequest {
	if c.idx != nil {
		return &c.ls[c.idx[j]]
	}
	return &c.ls[j]
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// pipeline sends queued script calls: it takes one, adds whatever else is
// waiting (up to max), and sends them all in one round trip. With several
// of these running, a pipeline fills while the others wait for Redis.
func (s *Redis) pipeline(maxBatch int) {
	defer s.wg.Done()
	var d *directConn
	if s.direct != nil {
		d = &directConn{opt: s.direct, timeout: s.timeout, idleCheck: s.idleCheck}
		defer d.close()
	}
	batch := make([]*call, 0, maxBatch)
	for {
		select {
		case <-s.stop:
			return
		case first := <-s.in:
			// Calls that waited past their deadline (every pipeline was
			// busy with a slow Redis) fail at once rather than run late.
			now := time.Now()
			batch = batch[:0]
			for c := first; c != nil; {
				if c.deadline.After(now) {
					batch = append(batch, c)
				} else {
					c.expired = true
					c.done <- struct{}{}
				}
				c = nil
				if len(batch) < maxBatch {
					select {
					case c = <-s.in:
					default:
					}
				}
			}
			if len(batch) == 0 {
				continue
			}
			if d != nil {
				d.exec(batch, batchDeadline(batch))
			} else {
				s.exec(batch)
			}
			for i, c := range batch {
				c.done <- struct{}{}
				batch[i] = nil
			}
		}
	}
}

// batchDeadline is how long a batch may take: as long as its most patient
// call may wait. Calls queue in arrival order, so usually the first one's.
func batchDeadline(batch []*call) time.Time {
	deadline := batch[0].deadline
	for _, c := range batch[1:] {
		if c.deadline.Before(deadline) {
			deadline = c.deadline
		}
	}
	return deadline
}

// exec sends a batch through go-redis (Cluster, Sentinel).
func (s *Redis) exec(batch []*call) {
	ctx, cancel := context.WithDeadline(context.Background(), batchDeadline(batch))
	defer cancel()
	cmds := make([]*redis.Cmd, len(batch))
	p := s.c.Pipeline()
	for i, c := range batch {
		cmds[i] = checkCmd(ctx, c.mode, c.ls, c.idx)
		_ = p.Process(ctx, cmds[i])
	}
	_, _ = p.Exec(ctx) // errors are read per command
	if s.cluster {
		s.reloadOnNodeError(ctx, cmds)
	}
	// A Redis that restarted or flushed its scripts answers NOSCRIPT: load
	// the script once and send those calls again.
	var again []int
	for i, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		// EVAL caches the script on whichever node the call lands (cluster).
		p = s.c.Pipeline()
		for _, i := range again {
			args := cmds[i].Args()
			cmds[i] = redis.NewCmd(ctx, append([]any{"eval", checkLua}, args[2:]...)...)
			_ = p.Process(ctx, cmds[i])
		}
		_, _ = p.Exec(ctx)
	}
	for i, c := range batch {
		c.vals, c.err = c.vals[:0], nil
		if err := cmds[i].Err(); err != nil {
			c.err = storeErr(err)
		} else if v, err := cmds[i].Int64Slice(); err != nil {
			c.err = fmt.Errorf("redis script: unexpected answer (%v)", err)
		} else {
			c.vals = append(c.vals, v...)
		}
	}
}

// reloadOnNodeError asks the cluster client to reload the slot map when a
// node could not be reached. go-redis reloads it on MOVED and otherwise only
// every ClusterStateReloadInterval (60 s); a pipeline to a dead master gets
// dial errors, never MOVED, so without this the bridge kept sending a
// failed-over slot to the dead node for up to a minute. Reloads are
// coalesced by go-redis (at most one per 200 ms).
func (s *Redis) reloadOnNodeError(ctx context.Context, cmds []*redis.Cmd) {
	for _, cmd := range cmds {
		err := cmd.Err()
		var rerr redis.Error
		if err != nil && err != redis.Nil && !errors.As(err, &rerr) {
			if cc, ok := s.c.(*redis.ClusterClient); ok {
				cc.ReloadState(ctx)
			}
			return
		}
	}
}

// run has a pipeline call check.lua for the limits idx of ls (all when
// nil) and waits for the answer, at most the store's timeout or until ctx's
// deadline; the pipeline enforces the deadline (one timer per batch, not
// one per check). The caller reads c.vals and c.err, then releases c.
func (s *Redis) run(ctx context.Context, mode string, ls []rules.LimitRequest, idx []int) (*call, error) {
	c := callPool.Get().(*call)
	c.mode, c.ls, c.idx, c.expired, c.err = mode, ls, idx, false, nil
	c.deadline = time.Now().Add(s.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(c.deadline) {
		c.deadline = d
	}
	select {
	case s.in <- c:
	case <-ctx.Done():
		release(c)
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
	case <-s.stop:
		return nil, fmt.Errorf("%w: store closed", ErrUnavailable)
	}
	select {
	case <-c.done:
		if c.expired {
			release(c)
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, context.DeadlineExceeded)
		}
		return c, nil
	case <-ctx.Done():
		// The pipeline still owns c; it is dropped, not pooled.
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
	case <-s.stop:
		return nil, fmt.Errorf("%w: store closed", ErrUnavailable)
	}
}

func release(c *call) {
	c.ls, c.idx, c.err = nil, nil, nil
	callPool.Put(c)
}

// group is the limits of a check that live in one slot.
type group struct {
	idx  []int
	slot int
}

// Check implements Store.
func (s *Redis) Check(ctx context.Context, req *rules.CheckRequest, resp *rules.CheckResponse) error {
	(*s.overrides.Load()).apply(req)
	if len(req.Limits) == 0 {
		return errors.New("check: no limits")
	}
	resp.Decisions = append(resp.Decisions[:0], make([]rules.Decision, len(req.Limits))...)
	if s.split {
		if gs := groupBySlot(req.Limits); len(gs) > 1 {
			ctx, cancel := context.WithTimeout(ctx, s.timeout) // bounds the refunds too
			defer cancel()
			return s.checkGroups(ctx, req, gs, resp)
		}
	}
	c, err := s.run(ctx, "c", req.Limits, nil)
	if err != nil {
		return err
	}
	_, err = readGroup(c, nil, resp)
	release(c)
	return err
}

// checkCmd builds the EVALSHA of check.lua for the limits idx of ls (all when nil).
func checkCmd(ctx context.Context, mode string, ls []rules.LimitRequest, idx []int) *redis.Cmd {
	n := len(ls)
	if idx != nil {
		n = len(idx)
	}
	keys := make([]string, 0, 3*n)
	args := make([]any, 0, 4+3*n+9*n)
	args = append(args, "evalsha", checkScript.Hash(), 0, mode, n)
	for j := range n {
		i := j
		if idx != nil {
			i = idx[j]
		}
		l := &ls[i]
		sp := &l.Spec
		keys = append(keys, l.Key+algSuffix(sp.Algorithm))
		shadow := 0
		if l.Shadow {
			shadow = 1
		}
		args = append(args, int(sp.Algorithm), sp.Limit, sp.WindowMS, sp.Burst, sp.Cost, shadow)
		if p := sp.Penalty; p != nil && p.Enabled {
			args = append(args, p.DetectionWindowMS, p.ViolationThreshold, len(p.Multipliers))
			for _, m := range p.Multipliers {
				args = append(args, m)
			}
			keys = append(keys, l.Key+suffixViolations, l.Key+suffixBlock)
		} else {
			args = append(args, 0)
		}
	}
	// KEYS go between the key count and ARGV.
	args[2] = len(keys)
	full := make([]any, 0, len(args)+len(keys))
	full = append(full, args[:3]...)
	for _, k := range keys {
		full = append(full, k)
	}
	full = append(full, args[3:]...)
	return redis.NewCmd(ctx, full...)
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

// readGroup copies a check.lua answer into resp.Decisions (at idx when not
// nil) and returns the script's allowed flag.
func readGroup(c *call, idx []int, resp *rules.CheckResponse) (bool, error) {
	if c.err != nil {
		return false, c.err
	}
	v := c.vals
	n := len(resp.Decisions)
	if idx != nil {
		n = len(idx)
	}
	if len(v) != 2+5*n {
		return false, fmt.Errorf("redis script: unexpected answer (%d values)", len(v))
	}
	resp.NowMS = max(resp.NowMS, v[0])
	for j := range n {
		i := j
		if idx != nil {
			i = idx[j]
		}
		o := 2 + 5*j
		resp.Decisions[i] = rules.Decision{Allowed: v[o] == 1, Limit: v[o+1], Remaining: v[o+2], ResetMS: v[o+3], RetryAfterMS: v[o+4]}
	}
	allowed := v[1] == 1
	if idx == nil {
		resp.Allowed = allowed
	}
	return allowed, nil
}

// groupBySlot splits limits by Redis Cluster slot, keeping their order.
func groupBySlot(ls []rules.LimitRequest) []group {
	var gs []group
	for i := range ls {
		slot := Slot(ls[i].Key)
		j := 0
		for j < len(gs) && gs[j].slot != slot {
			j++
		}
		if j == len(gs) {
			gs = append(gs, group{slot: slot})
		}
		gs[j].idx = append(gs[j].idx, i)
	}
	return gs
}

// checkGroups decides a check whose keys span several slots: one script call
// per slot, each consuming only when its own limits allow; when another slot
// denied, the slots that consumed are refunded.
func (s *Redis) checkGroups(ctx context.Context, req *rules.CheckRequest, gs []group, resp *rules.CheckResponse) error {
	type result struct {
		c   *call
		err error
	}
	res := make([]result, len(gs))
	var wg sync.WaitGroup
	for g := range gs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[g].c, res[g].err = s.run(ctx, "c", req.Limits, gs[g].idx)
		}()
	}
	wg.Wait()
	resp.Allowed = true
	consumed := make([]bool, len(gs))
	var firstErr error
	for g := range gs {
		err := res[g].err
		ok := false
		if err == nil {
			ok, err = readGroup(res[g].c, gs[g].idx, resp)
			release(res[g].c)
		}
		if err != nil {
			firstErr = cmp(firstErr, err)
			resp.Allowed = false
			continue
		}
		consumed[g] = ok
		for _, i := range gs[g].idx {
			if !resp.Decisions[i].Allowed && !req.Limits[i].Shadow {
				resp.Allowed = false
			}
		}
	}
	if !resp.Allowed {
		for g := range gs {
			if consumed[g] {
				if err := s.refund(ctx, req.Limits, gs[g].idx, resp); err != nil {
					s.log.Error("refund failed; the limits of this slot stay consumed", "slot", gs[g].slot, "err", err)
				}
			}
		}
	}
	return firstErr
}

func cmp(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// refund gives back what the group idx consumed.
func (s *Redis) refund(ctx context.Context, ls []rules.LimitRequest, idx []int, resp *rules.CheckResponse) error {
	keys := make([]string, 0, len(idx))
	args := make([]any, 0, 1+3*len(idx))
	args = append(args, 0)
	for _, i := range idx {
		if !resp.Decisions[i].Allowed {
			continue
		}
		sp := &ls[i].Spec
		keys = append(keys, ls[i].Key+algSuffix(sp.Algorithm))
		args = append(args, int(sp.Algorithm), sp.Burst, sp.Cost)
	}
	args[0] = len(keys)
	if len(keys) == 0 {
		return nil
	}
	return refundScript.Run(ctx, s.c, keys, args...).Err()
}

// Slot is the Redis Cluster slot of key: CRC16 (XMODEM) of its hash tag, mod 16384.
func Slot(key string) int {
	tag := rules.HashTag(key)
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// Status implements Store.
func (s *Redis) Status(ctx context.Context, key string, spec rules.LimitSpec) (rules.Decision, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	spec.Cost = 0
	ls := []rules.LimitRequest{{Key: key, Spec: spec}}
	var resp rules.CheckResponse
	resp.Decisions = make([]rules.Decision, 1)
	c, err := s.run(ctx, "p", ls, nil)
	if err == nil {
		_, err = readGroup(c, nil, &resp)
		release(c)
	}
	if err != nil {
		return rules.Decision{}, 0, err
	}
	d := resp.Decisions[0]
	d.Allowed = d.Allowed && d.Remaining > 0
	return d, resp.NowMS, nil
}

// Reset implements Store. The keys of one base key share its hash tag, so
// one DEL per base key works on Redis Cluster too.
func (s *Redis) Reset(ctx context.Context, keys ...string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	p := s.c.Pipeline()
	for _, k := range keys {
		ks := make([]string, len(allSuffixes))
		for i, suf := range allSuffixes {
			ks[i] = k + suf
		}
		p.Del(ctx, ks...)
	}
	if _, err := p.Exec(ctx); err != nil {
		return storeErr(err)
	}
	return nil
}

type storedOverride struct {
	Override
	Strategy string `json:"strategy"`
}

func overrideField(user, endpoint string) string {
	b, _ := json.Marshal([2]string{user, endpoint})
	return string(b)
}

// SetOverride implements Store. The override and the version bump go in one
// MULTI, so a bridge that sees the new version reads the new override.
func (s *Redis) SetOverride(ctx context.Context, o Override) (Override, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	val, err := json.Marshal(storedOverride{o, o.Algorithm.String()})
	if err != nil {
		return Override{}, false, err
	}
	field := overrideField(o.User, o.Endpoint)
	var prevCmd *redis.StringCmd
	var verCmd *redis.IntCmd
	_, err = s.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		prevCmd = p.HGet(ctx, overridesKey, field)
		p.HSet(ctx, overridesKey, field, val)
		verCmd = p.HIncrBy(ctx, overridesKey, "version", 1)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Override{}, false, storeErr(err)
	}
	var prev Override
	had := false
	if raw, err := prevCmd.Bytes(); err == nil {
		prev, had = decodeOverride(raw)
	}
	s.mergeOverride(o, verCmd.Val())
	return prev, had, nil
}

// mergeOverride puts o in the local table at once, so the bridge that took
// the PUT applies it from the next check on.
func (s *Redis) mergeOverride(o Override, version int64) {
	for {
		old := s.overrides.Load()
		t := make(overrideTable, len(*old)+1)
		for k, v := range *old {
			t[k] = v
		}
		t[overrideKey{o.User, o.Endpoint}] = o
		if s.overrides.CompareAndSwap(old, &t) {
			break
		}
	}
	// Only a refresh that read the whole table may advance the version past
	// changes this bridge has not seen; one step ahead is ours.
	s.version.CompareAndSwap(version-1, version)
}

func decodeOverride(raw []byte) (Override, bool) {
	var so storedOverride
	if err := json.Unmarshal(raw, &so); err != nil {
		return Override{}, false
	}
	alg, ok := rules.ParseAlgorithm(so.Strategy)
	if !ok || so.Limit <= 0 || so.WindowMS <= 0 {
		return Override{}, false
	}
	so.Override.Algorithm = alg
	return so.Override, true
}

// Override implements Store.
func (s *Redis) Override(user, endpoint string) (Override, bool) {
	return (*s.overrides.Load()).lookup(user, endpoint)
}

func (s *Redis) refreshLoop(every time.Duration) {
	defer s.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := s.refresh(); err != nil {
			s.log.Warn("override refresh failed", "err", err)
		}
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

// refresh reads the overrides when their version changed: one HGET a
// second in steady state, so checks stay at one command each.
func (s *Redis) refresh() error {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	v, err := s.c.HGet(ctx, overridesKey, "version").Int64()
	if errors.Is(err, redis.Nil) {
		v, err = 0, nil
	}
	if err != nil {
		return err
	}
	if v == s.version.Load() {
		return nil
	}
	all, err := s.c.HGetAll(ctx, overridesKey).Result()
	if err != nil {
		return err
	}
	t := make(overrideTable, len(all))
	for f, raw := range all {
		if f == "version" {
			if n, err := strconv.ParseInt(raw, 10, 64); err == nil {
				v = n
			}
			continue
		}
		if o, ok := decodeOverride([]byte(raw)); ok {
			t[overrideKey{o.User, o.Endpoint}] = o
		} else {
			s.log.Warn("ignoring a malformed override", "field", f)
		}
	}
	s.overrides.Store(&t)
	s.version.Store(v)
	return nil
}

// Ping implements Store.
func (s *Redis) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return nil
}

// Close implements Store.
func (s *Redis) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.stop)
		s.wg.Wait()
		err = s.c.Close()
	})
	return err
}

// Client is the underlying go-redis client (tests, tools).
func (s *Redis) Client() redis.UniversalClient { return s.c }

var redisLogOnce sync.Once

// goRedisLog sends go-redis's own messages (one per failed dial during an
// outage) to the debug level; failed checks are logged by the bridge.
type goRedisLog struct{ l *slog.Logger }

func (g goRedisLog) Printf(ctx context.Context, format string, v ...any) {
	g.l.DebugContext(ctx, "go-redis: "+fmt.Sprintf(format, v...))
}
