package store

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/rules"
)

// RedisOptions configure a Redis store.
type RedisOptions struct {
	// URL is redis://, rediss://, redis+sentinel://, rediss+sentinel://,
	// redis+cluster:// or rediss+cluster:// (docs/bridge.md).
	URL      string
	PoolSize int           // connections per node, default 10 per CPU (go-redis)
	Timeout  time.Duration // dial, read and write timeout; also bounds a check
	// Pipelines is how many pipelines may be in flight at once; requests that
	// arrive meanwhile wait and go out together in the next one. Default 2.
	Pipelines int
	MaxBatch  int // checks per pipeline, default 128 (or CallChecks if larger)
	// CallChecks is how many of a pipeline's checks one script call
	// decides at most (default 128): each check is still decided
	// all-or-nothing, in arrival order. 1 sends a script call per check.
	CallChecks int
	Logger     *slog.Logger
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
	script     *luaScript    // the check script (tests: a variant on a test clock)
	beforeExec func([]*call) // tests: called with each batch before it is sent
}

// Redis keeps counters in Redis (single, Sentinel or Cluster).
type Redis struct {
	c          redis.UniversalClient
	cluster    bool
	split      bool
	timeout    time.Duration
	log        *slog.Logger
	script     *luaScript
	callMax    int // checks per script call
	in         chan *call
	direct     *redis.Options // single Redis: pipelines use connections of their own (direct.go)
	idleCheck  time.Duration  // see directConn.idleCheck
	beforeExec func([]*call)
	stop       chan struct{}
	wg         sync.WaitGroup
	closeOnce  sync.Once
}

// NewRedis connects lazily: a Redis that is down at start makes checks fail
// until it is up, it does not stop the bridge.
func NewRedis(o RedisOptions) (*Redis, error) {
	c, cluster, single, err := newClient(o)
	if err != nil {
		return nil, err
	}
	if o.Pipelines <= 0 {
		o.Pipelines = 2
	}
	if o.CallChecks <= 0 {
		o.CallChecks = 128
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = max(128, o.CallChecks)
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.script == nil {
		o.script = checkScript
	}
	s := &Redis{
		c: c, cluster: cluster, split: cluster || o.splitSlots, timeout: o.Timeout, log: o.Logger,
		script: o.script, callMax: o.CallChecks, in: make(chan *call, 4096), stop: make(chan struct{}),
		beforeExec: o.beforeExec,
	}
	if single != nil && !o.viaGoRedis {
		s.direct = single
		s.idleCheck = o.idleCheck
		if s.idleCheck <= 0 {
			s.idleCheck = defaultIdleCheck
		}
	}
	redisLogOnce.Do(func() { redis.SetLogger(goRedisLog{o.Logger}) })
	for range o.Pipelines {
		s.wg.Add(1)
		go s.pipeline(o.MaxBatch)
	}
	return s, nil
}

// call is one check waiting for a pipeline.
type call struct {
	scriptCall
	deadline time.Time // the pipeline drops the call once it is past
	expired  bool      // set by the pipeline: dropped, never sent
	vals     []int64   // the script's answer, or
	err      error     // why there is none
	done     chan struct{}
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// pipeline sends queued checks: it takes one, adds whatever else is
// waiting (up to max), and sends them all in one round trip, in as few
// script calls as it may (see groups). With several of these running, a
// pipeline fills while the others wait for Redis.
func (s *Redis) pipeline(maxBatch int) {
	defer s.wg.Done()
	var d *directConn
	if s.direct != nil {
		d = &directConn{opt: s.direct, timeout: s.timeout, idleCheck: s.idleCheck, script: s.script}
		defer d.close()
	}
	batch := make([]*call, 0, maxBatch)
	var gb groupBuf
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
			if s.beforeExec != nil {
				s.beforeExec(batch)
			}
			groups := s.groups(batch, &gb)
			if d != nil {
				d.exec(groups, batchDeadline(batch))
			} else {
				s.exec(groups, batchDeadline(batch))
			}
			for i, c := range batch {
				c.done <- struct{}{}
				batch[i] = nil
			}
		}
	}
}

// groupBuf is the storage groups reuses from one batch to the next.
type groupBuf struct {
	groups [][]*call
	calls  []*call
	slots  []int
}

// groups splits a batch, in arrival order, into the checks each script
// call decides: at most callMax, and on Redis Cluster all of one slot
// (a script's keys must share one; every check's do, see Check). The
// checks of a group keep their arrival order.
func (s *Redis) groups(batch []*call, gb *groupBuf) [][]*call {
	gb.groups, gb.slots = gb.groups[:0], gb.slots[:0]
	if !s.split {
		for len(batch) > 0 {
			n := min(len(batch), s.callMax)
			gb.groups = append(gb.groups, batch[:n:n])
			batch = batch[n:]
		}
		return gb.groups
	}
	// Stable by slot: a group's checks stay in arrival order.
	gb.calls = append(gb.calls[:0], batch...)
	for _, c := range gb.calls {
		gb.slots = append(gb.slots, Slot(c.limit(0).Key))
	}
	sort.Stable(bySlot{gb.calls, gb.slots})
	for i := 0; i < len(gb.calls); {
		j := i + 1
		for j < len(gb.calls) && gb.slots[j] == gb.slots[i] && j-i < s.callMax {
			j++
		}
		gb.groups = append(gb.groups, gb.calls[i:j:j])
		i = j
	}
	return gb.groups
}

type bySlot struct {
	calls []*call
	slots []int
}

func (b bySlot) Len() int           { return len(b.calls) }
func (b bySlot) Less(i, j int) bool { return b.slots[i] < b.slots[j] }
func (b bySlot) Swap(i, j int) {
	b.calls[i], b.calls[j] = b.calls[j], b.calls[i]
	b.slots[i], b.slots[j] = b.slots[j], b.slots[i]
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

// checkCmd is the go-redis command of a check.lua call deciding cs.
func (s *Redis) checkCmd(ctx context.Context, cs []*call, eval bool) *redis.Cmd {
	var args goRedisArgs
	writeCheck(&args, s.script, cs, eval, &specTable{})
	return redis.NewCmd(ctx, args...)
}

// exec sends the script calls of groups through go-redis (Cluster,
// Sentinel), which splits the pipeline per node.
func (s *Redis) exec(groups [][]*call, deadline time.Time) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	cmds := make([]*redis.Cmd, len(groups))
	p := s.c.Pipeline()
	for i, g := range groups {
		cmds[i] = s.checkCmd(ctx, g, false)
		_ = p.Process(ctx, cmds[i])
	}
	_, _ = p.Exec(ctx) // errors are read per command
	if s.cluster {
		s.reloadOnNodeError(ctx, cmds)
	}
	// A Redis that restarted or flushed its scripts answers NOSCRIPT: send
	// those calls again as EVAL, which caches the script on whichever node
	// the call lands.
	var again []int
	for i, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		p = s.c.Pipeline()
		for _, i := range again {
			cmds[i] = s.checkCmd(ctx, groups[i], true)
			_ = p.Process(ctx, cmds[i])
		}
		_, _ = p.Exec(ctx)
	}
	for i, g := range groups {
		err := cmds[i].Err()
		if err == nil || isRedisError(err) {
			if err = readCheckReply(&goRedisReply{v: cmds[i].Val(), err: err}, g); err != nil {
				err = fmt.Errorf("redis script: unexpected answer (%w)", err)
			}
		} else {
			err = storeErr(err)
		}
		if err != nil {
			for _, c := range g {
				c.vals, c.err = c.vals[:0], err
			}
		}
	}
}

func isRedisError(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}

// goRedisReply is a reply go-redis read, as a replyReader.
type goRedisReply struct {
	v   any
	err error // the error reply instead
	i   int
}

func (g *goRedisReply) array() (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	a, ok := g.v.([]any)
	if !ok {
		return 0, fmt.Errorf("%w: %T", errProtocol, g.v)
	}
	return len(a), nil
}

func (g *goRedisReply) elem() (int64, string, bool, error) {
	a := g.v.([]any)
	if g.i >= len(a) {
		return 0, "", false, errProtocol
	}
	g.i++
	switch v := a[g.i-1].(type) {
	case int64:
		return v, "", false, nil
	case string:
		return 0, v, true, nil
	}
	return 0, "", false, fmt.Errorf("%w: %T", errProtocol, a[g.i-1])
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

// run has a pipeline make the call sc and waits for the answer, until
// the earliest of deadline, ctx's deadline and the store's timeout; the
// pipeline enforces it (one timer per batch, not one per check). The
// caller reads c.vals and c.err, then releases c.
func (s *Redis) run(ctx context.Context, deadline time.Time, sc scriptCall) (*call, error) {
	c := callPool.Get().(*call)
	c.scriptCall, c.expired, c.err = sc, false, nil
	c.deadline = time.Now().Add(s.timeout)
	if !deadline.IsZero() && deadline.Before(c.deadline) {
		c.deadline = deadline
	}
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
	c.scriptCall, c.err = scriptCall{}, nil
	callPool.Put(c)
}

// result reads c's answer into resp and releases c.
func (c *call) result(resp *rules.CheckResponse) (bool, error) {
	defer release(c)
	if c.err != nil {
		return false, c.err
	}
	return c.readReply(c.vals, resp)
}

// group is the limits of a check that live in one slot.
type group struct {
	idx  []int
	slot int
}

// Check implements Store.
func (s *Redis) Check(ctx context.Context, deadline time.Time, req *rules.CheckRequest, resp *rules.CheckResponse) error {
	if len(req.Limits) == 0 {
		return errors.New("check: no limits")
	}
	resp.Decisions = append(resp.Decisions[:0], make([]rules.Decision, len(req.Limits))...)
	mode := opMode(req)
	if s.split {
		if gs := groupBySlot(req.Limits); len(gs) > 1 {
			if deadline.IsZero() {
				deadline = time.Now().Add(s.timeout)
			}
			ctx, cancel := context.WithDeadline(ctx, deadline) // bounds the refunds too
			defer cancel()
			return s.checkGroups(ctx, req, gs, mode, resp)
		}
	}
	c, err := s.run(ctx, deadline, scriptCall{mode: mode, ls: req.Limits})
	if err != nil {
		return err
	}
	_, err = c.result(resp)
	return err
}

// opMode readies req for check.lua and returns the script's mode for it:
// a renewal is decided at cost 0, a return only peeks (and hands back).
func opMode(req *rules.CheckRequest) scriptMode {
	switch req.Op {
	case rules.OpRenew:
		for i := range req.Limits {
			req.Limits[i].Spec.Cost = 0
		}
	case rules.OpReturn:
		return modePeek
	}
	return modeCheck
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
// denied, the slots that consumed are refunded. Such a request is never
// leased: a refund gives back what the request took, not a lease. Nor is
// it delayed: the slots cannot agree on one time to reserve at, so its
// throttle limits take it now or deny it. Its quota limits, which deny
// only all together, are decided as log-only in their slots, and the
// check as a whole here. Renewals and returns are not decisions of a
// request: their slots are not refunded.
func (s *Redis) checkGroups(ctx context.Context, req *rules.CheckRequest, gs []group, mode scriptMode, resp *rules.CheckResponse) error {
	ls := req.Limits
	if req.Op == rules.OpDecide {
		for i := range req.Limits {
			req.Limits[i].Spec.Lease = rules.Lease{}
			req.Limits[i].MaxDelayMS = 0
		}
		cloned := false
		for i := range req.Limits {
			if req.Limits[i].InQuota() {
				if !cloned {
					ls, cloned = slices.Clone(req.Limits), true
				}
				ls[i].Quota, ls[i].LogOnly = false, true
			}
		}
	}
	type result struct {
		c   *call
		err error
	}
	res := make([]result, len(gs))
	var wg sync.WaitGroup
	for g := range gs {
		wg.Go(func() {
			res[g].c, res[g].err = s.run(ctx, time.Time{}, scriptCall{mode: mode, ls: ls, idx: gs[g].idx})
		})
	}
	wg.Wait()
	resp.Allowed = true
	consumed := make([]bool, len(gs))
	var firstErr error
	quotas, quotaOK := false, false
	for g := range gs {
		err := res[g].err
		ok := false
		if err == nil {
			ok, err = res[g].c.result(resp)
		}
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			resp.Allowed = false
			continue
		}
		consumed[g] = ok
		for _, i := range gs[g].idx {
			l, d := &req.Limits[i], &resp.Decisions[i]
			switch {
			case l.InQuota():
				quotas = true
				quotaOK = quotaOK || d.Allowed
			case !d.Allowed && !l.LogOnly:
				resp.Allowed = false
			}
		}
	}
	if quotas && !quotaOK {
		resp.Allowed = false
	}
	if !resp.Allowed && req.Op == rules.OpDecide {
		for g := range gs {
			if consumed[g] {
				if err := s.refund(ctx, req.Limits, gs[g].idx, resp.Decisions); err != nil {
					s.log.Error("refund failed; the limits of this slot stay consumed", "slot", gs[g].slot, "err", err)
				}
			}
		}
	}
	return firstErr
}

// refund gives back what the limits idx of ls consumed.
func (s *Redis) refund(ctx context.Context, ls []rules.LimitRequest, idx []int, ds []rules.Decision) error {
	var args goRedisArgs
	if !writeRefund(&args, ls, idx, ds) {
		return nil
	}
	err := s.c.Do(ctx, args...).Err()
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "EVAL", refundScript.src
		err = s.c.Do(ctx, args...).Err()
	}
	return err
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

// Peek implements Store.
func (s *Redis) Peek(ctx context.Context, deadline time.Time, l *rules.LimitRequest) (rules.Decision, error) {
	c, err := s.run(ctx, deadline, peekCall(l))
	if err != nil {
		return rules.Decision{}, err
	}
	return c.peekResult()
}

// peekCall is the script's check that peeks at l: l at cost 0, as a
// request it would refuse or take now sees it (a throttle limit too).
func peekCall(l *rules.LimitRequest) scriptCall {
	ls := []rules.LimitRequest{*l}
	ls[0].Spec.Cost = 0
	ls[0].Spec.Lease, ls[0].Return = rules.Lease{}, rules.LeaseReturn{}
	ls[0].Throttle, ls[0].Fill = false, false
	return scriptCall{mode: modePeek, ls: ls}
}

// peekResult reads the answer of a peekCall and releases c. Allowed says
// whether one more unit would pass.
func (c *call) peekResult() (rules.Decision, error) {
	resp := rules.CheckResponse{Decisions: make([]rules.Decision, 1)}
	if _, err := c.result(&resp); err != nil {
		return rules.Decision{}, err
	}
	d := resp.Decisions[0]
	d.Allowed = d.Allowed && d.Remaining > 0
	return d, nil
}

// Reset implements Store. The keys of one base key share its hash tag, so
// one DEL works on Redis Cluster too.
func (s *Redis) Reset(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	ks := make([]string, len(allSuffixes))
	for i, suf := range allSuffixes {
		ks[i] = key + suf
	}
	if err := s.c.Del(ctx, ks...).Err(); err != nil {
		return storeErr(err)
	}
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
