package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/rules"
)

// TestStore_MemoryEqualsScript drives the memory store and check.lua on
// one clock with the same random checks (every algorithm, costs above the
// limit, log-only limits, penalties, keys repeated within a check, specs
// that change under a key, peeks, leases asked for, renewed and handed
// back (with the tags of earlier grants, and made-up ones), throttle
// limits that reserve slots ahead, alone and several in one check, and
// batches of these decided in one script call) and requires identical
// answers: every decision, remaining count, reset and retry time, lease
// granted and delay. The memory store decides a batch's checks one after the other
// at the batch's time.
func TestStore_MemoryEqualsScript(t *testing.T) {
	srv := redistest.Start(t)
	for seed := range uint64(6) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			compareStores(t, srv, seed, 600, false)
		})
	}
	// Every enforced limit throttled, the clock moving in small steps:
	// slots are reserved ahead, several limits of a check meet at one.
	for seed := uint64(100); seed < 104; seed++ {
		t.Run(fmt.Sprint("throttled seed ", seed), func(t *testing.T) {
			compareStores(t, srv, seed, 600, true)
		})
	}
}

// diffStep is one step of a comparison, kept to explain a difference.
type diffStep struct {
	now   int64
	req   rules.CheckRequest
	peek  bool
	batch int // the step's place in a batch (1, 2, ...), 0 outside one
}

func (s diffStep) String() string {
	var b strings.Builder
	verb := "check"
	if s.peek {
		verb = "peek"
	}
	if s.req.Op != rules.OpDecide {
		verb = s.req.Op.String()
	}
	if s.batch > 0 {
		verb = fmt.Sprintf("batch #%d: %s", s.batch, verb)
	}
	fmt.Fprintf(&b, "now %d %s", s.now, verb)
	for _, l := range s.req.Limits {
		fmt.Fprintf(&b, "\n    %s %s limit %d window %d burst %d cost %d log_only %v", l.Key, l.Spec.Algorithm,
			l.Spec.Limit, l.Spec.WindowMS, l.Spec.Burst, l.Spec.Cost, l.LogOnly)
		if l.Spec.Months > 0 {
			fmt.Fprintf(&b, " months %d", l.Spec.Months)
		}
		if l.Throttle {
			fmt.Fprintf(&b, " max_delay %d", l.MaxDelayMS)
		}
		if l.Fill {
			b.WriteString(" fill")
		}
		if l.Quota {
			b.WriteString(" quota")
		}
		if l.Spec.Lease.Size > 0 {
			fmt.Fprintf(&b, " lease %+v", l.Spec.Lease)
		}
		if l.Return.Units > 0 {
			fmt.Fprintf(&b, " return %+v", l.Return)
		}
		if p := l.Spec.Penalty; p != nil {
			fmt.Fprintf(&b, " penalty %d/%d×%v", p.DetectionWindowMS, p.ViolationThreshold, p.Multipliers)
		}
	}
	return b.String()
}

// compareStores runs steps random steps from seed against a fresh memory
// store and a fresh check.lua on srv.
//
// Redis expires keys in its own (real) time while the script runs on the
// test clock. The clock therefore moves on by at least the real time each
// step took, so Redis cannot drop a key before the memory store does with
// the same time to live, and before each step the keys the memory store
// has expired are deleted from Redis too (syncExpiry).
//
// With throttled, every limit that is not log_only is a throttle limit and
// the clock moves by at most a quarter of a second at a time, so limits
// stay exhausted and requests queue for slots.
func compareStores(t *testing.T, srv *redistest.Server, seed uint64, steps int, throttled bool) {
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	if err := rc.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	now := fakeNow()
	// Twenty seconds before a month ends: limits of calendar months see
	// one end.
	tm := time.Now().UTC()
	now.Store(time.Date(tm.Year(), tm.Month()+1, 1, 0, 0, 0, 0, time.UTC).UnixMilli() - 20_000)
	mem := NewMemory(MemoryOptions{Now: now.Load})
	rs, err := NewRedis(RedisOptions{URL: srv.URL, Timeout: 10 * time.Second, script: clockScript(t, now.Load)})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()

	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	// Each key has a spec most checks use; some checks change it.
	keys := make([]rules.LimitRequest, 5)
	for i := range keys {
		keys[i] = rules.LimitRequest{Key: fmt.Sprintf("rl:{u:diff}:k%d", i), Rule: "r", Spec: randomSpec(rng)}
		keys[i].LogOnly = rng.IntN(5) == 0
		if !keys[i].LogOnly && (throttled || rng.IntN(3) == 0) {
			keys[i].Throttle, keys[i].MaxDelayMS = true, []int64{0, 300, 2500, 30_000}[rng.IntN(4)]
			if throttled {
				keys[i].MaxDelayMS = []int64{0, 2500, 30_000, 30_000}[rng.IntN(4)]
				if keys[i].Spec.Algorithm == rules.SlidingWindow { // never throttled
					keys[i].Spec.Algorithm = []rules.Algorithm{rules.TokenBucket, rules.SlidingLog, rules.FixedWindow}[rng.IntN(3)]
				}
				if rng.IntN(4) != 0 { // a penalty's block keeps a key refused
					keys[i].Spec.Penalty = nil
				}
			}
		}
	}
	var history []diffStep
	ctx := context.Background()
	last := time.Now()
	// Leases granted so far: their returns hand back what either store
	// still holds, or nothing any more.
	var grants []grantSeen
	newStep := func(batch int) diffStep {
		n := 1 + rng.IntN(3)
		req := rules.CheckRequest{Limits: make([]rules.LimitRequest, n)}
		switch rng.IntN(10) {
		case 0:
			req.Op = rules.OpRenew
		case 1:
			req.Op = rules.OpReturn
		}
		for i := range req.Limits {
			l := keys[rng.IntN(len(keys))]
			if rng.IntN(10) == 0 {
				l.Spec = randomSpec(rng)
			}
			// The rate limit service's: quota_mode, and budgets and their
			// peeks.
			l.Quota = rng.IntN(6) == 0
			if rng.IntN(6) == 0 {
				l.Fill = true
				switch rng.IntN(3) {
				case 0:
					l.Spec.Cost = 0
				case 1:
					l.Spec.Cost = 1 + rng.Int64N(2*max(l.Spec.Limit, l.Spec.Burst)+1)
				}
			}
			if rng.IntN(3) == 0 {
				for _, g := range grants[max(0, len(grants)-8):] {
					if g.key == l.Key {
						l.Return = rules.LeaseReturn{Tag: g.tag, Granted: g.units, Units: rng.Int64N(g.units + 1)}
					}
				}
			} else if rng.IntN(20) == 0 {
				g := 1 + rng.Int64N(5)
				l.Return = rules.LeaseReturn{Tag: rng.Int64N(3) - 1 + now.Load()/l.Spec.WindowMS, Granted: g, Units: rng.Int64N(g + 1)}
			}
			// Calendar months, where the wire takes them.
			if l.Spec.Algorithm == rules.FixedWindow && !l.Throttle && l.Spec.Lease.Size == 0 && l.Return == (rules.LeaseReturn{}) && rng.IntN(3) == 0 {
				l.Spec.Months = []int64{1, 12}[rng.IntN(2)]
				l.Spec.WindowMS = l.Spec.Months * rules.MonthMS
			}
			req.Limits[i] = l
		}
		return diffStep{now: now.Load(), req: req, peek: req.Op == rules.OpDecide && rng.IntN(8) == 0, batch: batch}
	}
	delayed := 0
	defer func() { t.Logf("%d leases granted, %d checks delayed, %d steps", len(grants), delayed, steps) }()
	seen := func(req *rules.CheckRequest, resp *rules.CheckResponse) {
		if resp.DelayMS > 0 {
			delayed++
		}
		for i, d := range resp.Decisions {
			if d.Lease.Units > 0 {
				grants = append(grants, grantSeen{req.Limits[i].Key, d.Lease.Tag, d.Lease.Units})
			}
		}
	}
	for step := 0; step < steps; {
		elapsed := time.Since(last)
		last = time.Now()
		move := randomStep(rng)
		if throttled {
			move %= 250
		}
		now.Add(int64(elapsed/time.Millisecond) + 1 + move)
		syncExpiry(t, mem, rc, now.Load())
		if rng.IntN(3) == 0 {
			// A batch: what a pipeline sends when checks queued while it
			// was busy, the same keys again and again.
			batch := make([]diffStep, 2+rng.IntN(7))
			for i := range batch {
				batch[i] = newStep(i + 1)
			}
			history = append(history, batch...)
			compareBatch(t, step, mem, rs, batch, history, seen)
			step += len(batch)
			continue
		}
		st := newStep(0)
		history = append(history, st)
		step++
		if st.peek {
			l := st.req.Limits[0]
			dm, errM := mem.Peek(ctx, time.Time{}, &l)
			dr, errR := rs.Peek(ctx, time.Time{}, &l)
			if errM != nil || errR != nil {
				t.Fatalf("step %d: peek: memory %v, redis %v", step, errM, errR)
			}
			if dm != dr {
				t.Fatalf("step %d: peeks differ:\nmemory %+v\nscript %+v\n%s", step, dm, dr, explain(history))
			}
			continue
		}
		var rm, rr rules.CheckResponse
		reqM, reqR := st.req, st.req
		reqM.Limits, reqR.Limits = slices.Clone(st.req.Limits), slices.Clone(st.req.Limits)
		if err := mem.Check(ctx, time.Time{}, &reqM, &rm); err != nil {
			t.Fatalf("step %d: memory: %v", step, err)
		}
		if err := rs.Check(ctx, time.Time{}, &reqR, &rr); err != nil {
			t.Fatalf("step %d: redis: %v", step, err)
		}
		if rm.Allowed != rr.Allowed || rm.NowMS != rr.NowMS || rm.DelayMS != rr.DelayMS || !slices.Equal(rm.Decisions, rr.Decisions) {
			t.Fatalf("step %d: answers differ:\nmemory %+v\nscript %+v\n%s", step, rm, rr, explain(history))
		}
		seen(&st.req, &rm)
	}
}

// grantSeen is a lease either store granted, kept to hand it back later.
type grantSeen struct {
	key        string
	tag, units int64
}

// compareBatch has rs decide the steps of batch in one script call, in
// order, and mem one after the other, and requires the same answers.
func compareBatch(t *testing.T, step int, mem *Memory, rs *Redis, batch, history []diffStep, seen func(*rules.CheckRequest, *rules.CheckResponse)) {
	t.Helper()
	ctx := context.Background()
	cs := make([]*call, len(batch))
	for i, st := range batch {
		cs[i] = &call{done: make(chan struct{}, 1)}
		if st.peek {
			cs[i].scriptCall = peekCall(&st.req.Limits[0])
		} else {
			req := st.req
			req.Limits = slices.Clone(st.req.Limits)
			cs[i].scriptCall = scriptCall{mode: opMode(&req), ls: req.Limits}
		}
	}
	decideInOneCall(rs, cs)
	for i, st := range batch {
		if st.peek {
			l := st.req.Limits[0]
			dm, errM := mem.Peek(ctx, time.Time{}, &l)
			dr, errR := cs[i].peekResult()
			if errM != nil || errR != nil {
				t.Fatalf("step %d: peek: memory %v, redis %v", step+i, errM, errR)
			}
			if dm != dr {
				t.Fatalf("step %d: peeks differ:\nmemory %+v\nscript %+v\n%s", step+i, dm, dr, explain(history))
			}
			continue
		}
		var rm, rr rules.CheckResponse
		req := st.req
		req.Limits = slices.Clone(st.req.Limits)
		if err := mem.Check(ctx, time.Time{}, &req, &rm); err != nil {
			t.Fatalf("step %d: memory: %v", step+i, err)
		}
		rr.Decisions = make([]rules.Decision, len(req.Limits))
		if _, err := cs[i].result(&rr); err != nil {
			t.Fatalf("step %d: redis: %v", step+i, err)
		}
		if rm.Allowed != rr.Allowed || rm.NowMS != rr.NowMS || rm.DelayMS != rr.DelayMS || !slices.Equal(rm.Decisions, rr.Decisions) {
			t.Fatalf("step %d: answers differ:\nmemory %+v\nscript %+v\n%s", step+i, rm, rr, explain(history))
		}
		seen(&st.req, &rm)
	}
}

// decideInOneCall has rs decide cs in one script call, in order, as a
// pipeline does with the checks that queued while it was busy.
func decideInOneCall(rs *Redis, cs []*call) {
	d := &directConn{opt: rs.direct, timeout: rs.timeout, idleCheck: rs.idleCheck, script: rs.script}
	defer d.close()
	d.exec([][]*call{cs}, time.Now().Add(rs.timeout))
}

// syncExpiry deletes from Redis the keys the memory store has expired on
// the test clock, and fails the test if Redis has lost a key the memory
// store still holds: its expiry came first on a clock that runs slower.
func syncExpiry(t *testing.T, mem *Memory, rc *redis.Client, now int64) {
	t.Helper()
	live := map[string]bool{}
	for i := range mem.shards {
		for k, e := range mem.shards[i].m {
			if e.expireAt > now {
				live[k] = true
			}
		}
	}
	ctx := context.Background()
	inRedis, err := rc.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range inRedis {
		if !live[k] {
			if err := rc.Del(ctx, k).Err(); err != nil {
				t.Fatal(err)
			}
		}
		delete(live, k)
	}
	for k := range live {
		t.Fatalf("%s: expired in Redis, still held by the memory store", k)
	}
}

// explain lists the last steps before a difference.
func explain(h []diffStep) string {
	var b strings.Builder
	b.WriteString("last steps:")
	for _, s := range h[max(0, len(h)-12):] {
		b.WriteString("\n  " + s.String())
	}
	return b.String()
}

// randomSpec returns a limit spec with small numbers, so that limits are
// reached, windows pass and penalties block within a few hundred checks.
// Windows are at least a second: see compareStores on expiry.
func randomSpec(rng *rand.Rand) rules.LimitSpec {
	algs := []rules.Algorithm{rules.TokenBucket, rules.SlidingWindow, rules.SlidingLog, rules.FixedWindow}
	s := rules.LimitSpec{
		Algorithm: algs[rng.IntN(len(algs))],
		Limit:     1 + rng.Int64N(6),
		WindowMS:  []int64{1000, 2500, 7000, 60_000}[rng.IntN(4)],
		Cost:      1,
	}
	if rng.IntN(4) == 0 { // rates that are not round: refills and weights in fractions
		s.Limit, s.WindowMS = 1+rng.Int64N(1000), 1000+rng.Int64N(89_000)
	}
	s.Burst = s.Limit + rng.Int64N(3)
	if rng.IntN(4) == 0 {
		s.Cost = 1 + rng.Int64N(s.Limit+2) // sometimes above the limit
	}
	if rng.IntN(3) == 0 {
		p := &rules.Penalty{Enabled: true, DetectionWindowMS: []int64{5000, 60_000}[rng.IntN(2)], ViolationThreshold: 1 + rng.Int64N(3)}
		for range 1 + rng.IntN(3) {
			p.Multipliers = append(p.Multipliers, 1+rng.Int64N(4))
		}
		s.Penalty = p
	}
	// Leases on some limits (with a penalty too: the stores must both
	// refuse to grant them), sizes up to the capacity and beyond it.
	if rng.IntN(4) != 0 {
		s.Lease = rules.Lease{Size: 1 + rng.Int64N(max(s.Limit, s.Burst)+2), TTLMS: []int64{1, 200, 1500, 30_000, 60_000}[rng.IntN(5)]}
	}
	return s
}

// randomStep is how far the clock moves between two checks, beyond the
// real time that passed: often not at all (same millisecond), up to two
// minutes (windows and penalties pass).
func randomStep(rng *rand.Rand) int64 {
	switch r := rng.IntN(10); {
	case r < 3:
		return 0
	case r < 7:
		return rng.Int64N(500)
	case r < 9:
		return 500 + rng.Int64N(4500)
	default:
		return 5000 + rng.Int64N(115_000)
	}
}
