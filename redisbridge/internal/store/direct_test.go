package store

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/rules"
)

// TestRedis_DirectAuthAndDB: the store's own connections authenticate and
// select the database of the URL, as go-redis's do.
func TestRedis_DirectAuthAndDB(t *testing.T) {
	srv := redistest.Start(t)
	// After the start: redistest's readiness probe does not authenticate.
	if err := redis.NewClient(&redis.Options{Addr: srv.Addr}).ConfigSet(context.Background(), "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, url string }{
		{"password", "redis://:s3cret@" + srv.Addr + "/3"},
		{"default user", "redis://default:s3cret@" + srv.Addr + "/3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewRedis(RedisOptions{URL: tc.url, Timeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if s.direct == nil {
				t.Fatal("single Redis not on direct connections")
			}
			key := "rl:{u:auth-" + tc.name + "}:x"
			req := rules.CheckRequest{Limits: []rules.LimitRequest{lim(key, spec(rules.FixedWindow, 5, hour))}}
			var resp rules.CheckResponse
			if err := s.Check(context.Background(), time.Time{}, &req, &resp); err != nil || !resp.Allowed || resp.Decisions[0].Remaining != 4 {
				t.Fatalf("%+v %v", resp, err)
			}
			rc := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "s3cret", DB: 3})
			defer rc.Close()
			if n, err := rc.Exists(context.Background(), key+":fw").Result(); err != nil || n != 1 {
				t.Fatalf("counter not in db 3: %d %v", n, err)
			}
		})
	}
	s, err := NewRedis(RedisOptions{URL: "redis://:wrong@" + srv.Addr + "/0", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	req := rules.CheckRequest{Limits: []rules.LimitRequest{lim("rl:{u:x}:x", spec(rules.FixedWindow, 5, hour))}}
	var resp rules.CheckResponse
	if err := s.Check(context.Background(), time.Time{}, &req, &resp); err == nil {
		t.Fatal("wrong password accepted")
	}
}

// TestWriteCheck_TransportsAgree: the RESP the direct path writes carries
// exactly the arguments go-redis is given, for EVALSHA and EVAL, with and
// without the test clock, for one check and for batches.
func TestWriteCheck_TransportsAgree(t *testing.T) {
	pen := spec(rules.SlidingLog, 3, hour)
	pen.Penalty = &rules.Penalty{Enabled: true, DetectionWindowMS: 60_000, ViolationThreshold: 2, Multipliers: []int64{2, 4}}
	ls := []rules.LimitRequest{lim("rl:{u:a}:x", spec(rules.TokenBucket, 10, 1000)), lim("rl:{u:a}:y", pen), lim("rl:{g}:z", spec(rules.FixedWindow, 1, 1))}
	ls[2].LogOnly = true
	for _, sc := range []*luaScript{checkScript, clockScript(t, func() int64 { return 42 })} {
		for _, batch := range [][]*call{
			{{scriptCall: scriptCall{mode: modeCheck, ls: ls}}},
			{{scriptCall: scriptCall{mode: modeCheck, ls: ls, idx: []int{1, 2}}}},
			{{scriptCall: scriptCall{mode: modePeek, ls: ls[:1]}}, {scriptCall: scriptCall{mode: modeCheck, ls: ls}},
				{scriptCall: scriptCall{mode: modeCheck, ls: ls, idx: []int{1}}}},
		} {
			for _, eval := range []bool{false, true} {
				var rw respWriter
				writeCheck(&rw, sc, batch, eval, &specTable{})
				var args goRedisArgs
				writeCheck(&args, sc, batch, eval, &specTable{})
				exp := appendCommand(nil, goRedisStrings(t, args)...)
				if !bytes.Equal(rw.w, exp) {
					t.Fatalf("%d checks, eval %v:\n got %q\nwant %q", len(batch), eval, rw.w, exp)
				}
			}
		}
	}
}

func goRedisStrings(t *testing.T, args []any) []string {
	var out []string
	for i, a := range args {
		switch v := a.(type) {
		case string:
			out = append(out, v)
		case int64:
			out = append(out, strconv.FormatInt(v, 10))
		default:
			t.Fatalf("arg %d: %T", i, a)
		}
	}
	return out
}

// FuzzDirect_ReadCheckReply: any bytes from the connection give each
// check of a batch an answer or an error, or fail the stream, never
// panic; what is read, written back as Redis would, reads back the same.
func FuzzDirect_ReadCheckReply(f *testing.F) {
	for _, s := range []string{
		"*13\r\n:7\r\n:1\r\n:1\r\n:2\r\n:3\r\n:4\r\n:5\r\n$9\r\nWRONGTYPE\r\n:0\r\n:0\r\n:0\r\n:0\r\n:0\r\n",
		"-NOSCRIPT No matching script\r\n", "*1\r\n$1\r\nx\r\n", "*-1\r\n", ":5\r\n", "*2\r\n:1\r\n",
	} {
		f.Add([]byte(s))
	}
	one := rules.LimitRequest{Key: "k", Spec: spec(rules.FixedWindow, 1, 1)}
	batch := func() []*call {
		return []*call{{scriptCall: scriptCall{ls: []rules.LimitRequest{one}}}, {scriptCall: scriptCall{ls: []rules.LimitRequest{one}}}}
	}
	read := func(b []byte) ([]*call, error) {
		cs := batch()
		return cs, readCheckReply(&directConn{r: bufio.NewReader(bytes.NewReader(b))}, cs)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cs, err := read(b)
		if err != nil {
			return
		}
		var w []byte
		text := func(err error) string { // as Redis sent it
			var re replyError
			if !errors.As(err, &re) {
				t.Fatalf("%v: not an error reply", err)
			}
			return string(re)
		}
		if len(cs[0].vals) == 0 { // an error reply for the whole call
			w = fmt.Appendf(w, "-%s\r\n", text(cs[0].err))
		} else {
			w = fmt.Appendf(w, "*%d\r\n:%d\r\n", 1+len(cs)*(1+replyPerLimit), cs[0].vals[0])
			for _, c := range cs {
				if c.err != nil {
					msg := text(c.err)
					w = fmt.Appendf(w, "$%d\r\n%s\r\n", len(msg), msg)
				} else {
					w = fmt.Appendf(w, ":%d\r\n", c.vals[1])
				}
				for _, v := range c.vals[2:] {
					w = fmt.Appendf(w, ":%d\r\n", v)
				}
			}
		}
		again, err := read(w)
		if err != nil {
			t.Fatalf("%q read back: %v", w, err)
		}
		for i := range cs {
			if !slices.Equal(cs[i].vals, again[i].vals) || fmt.Sprint(cs[i].err) != fmt.Sprint(again[i].err) {
				t.Fatalf("check %d: %v %v, read back as %v %v", i, cs[i].vals, cs[i].err, again[i].vals, again[i].err)
			}
		}
	})
}

// TestRedis_DirectIdleConnectionClosed: Redis closing idle connections
// (its timeout setting, a proxy) does not fail the next checks.
func TestRedis_DirectIdleConnectionClosed(t *testing.T) {
	srv := redistest.Start(t)
	// Every batch probes its connection first: what is tested is that a
	// closed connection is found and replaced, not the idle time.
	s, err := NewRedis(RedisOptions{URL: srv.URL, Timeout: time.Second, Pipelines: 2, idleCheck: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check := func() error {
		req := rules.CheckRequest{Limits: []rules.LimitRequest{lim("rl:{u:idle}:x", spec(rules.FixedWindow, 100, hour))}}
		var resp rules.CheckResponse
		return s.Check(context.Background(), time.Time{}, &req, &resp)
	}
	var wg sync.WaitGroup
	for range 20 { // open both pipelines' connections
		wg.Go(func() { check() })
	}
	wg.Wait()
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	for round := range 3 {
		if err := rc.Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			if err := check(); err != nil {
				t.Fatalf("round %d, check %d after the idle connections were closed: %v", round, i, err)
			}
		}
	}
}

// TestRedis_DirectAfterRestart: after a Redis restart every pipeline's
// connection is stale; none of them may fail a check once Redis is back.
func TestRedis_DirectAfterRestart(t *testing.T) {
	srv := redistest.Start(t)
	s, err := NewRedis(RedisOptions{URL: srv.URL, Timeout: time.Second, Pipelines: 4, idleCheck: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check := func(i int) error {
		req := rules.CheckRequest{Limits: []rules.LimitRequest{lim("rl:{u:restart"+strconv.Itoa(i)+"}:x", spec(rules.TokenBucket, 100, hour))}}
		var resp rules.CheckResponse
		return s.Check(context.Background(), time.Time{}, &req, &resp)
	}
	var wg sync.WaitGroup
	for i := range 64 { // open every pipeline's connection
		wg.Go(func() { check(i) })
	}
	wg.Wait()
	srv.Restart()
	for i := range 12 {
		if err := check(i); err != nil {
			t.Fatalf("check %d after the restart: %v", i, err)
		}
	}
}
