package store

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/rules"
)

// scriptTimeLines are the lines of check.lua that read Redis TIME.
const scriptTimeLines = "local t = call('TIME')\nlocal now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)\n" +
	"local stamp = t[1] .. format('%06d', tonumber(t[2])) -- TIME in us: the members this call adds\n"

// clockScript is check.lua taking its time from its last argument, now(),
// instead of Redis TIME: the production script but for those lines, so a
// test can run it and the memory store on one clock. Test builds only.
func clockScript(t testing.TB, now func() int64) *luaScript {
	t.Helper()
	if strings.Count(checkLua, scriptTimeLines) != 1 {
		t.Fatalf("check.lua no longer reads TIME as\n%s", scriptTimeLines)
	}
	sc := newLuaScript(strings.Replace(checkLua, scriptTimeLines,
		"local now = tonumber(ARGV[#ARGV])\nlocal stamp = format('%d000', now)\n", 1))
	sc.clock = now
	return sc
}

// fakeNow is a clock in unix ms that moves only when told.
func fakeNow() *atomic.Int64 {
	var now atomic.Int64
	now.Store(1_700_000_000_123)
	return &now
}

// TestRedis_TimeFromRedis: the production script takes the time from
// Redis TIME, never from the bridge.
func TestRedis_TimeFromRedis(t *testing.T) {
	srv := redistest.Start(t)
	s, err := NewRedis(RedisOptions{URL: srv.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	redisNow := func() int64 {
		tm, err := rc.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMilli()
	}
	before := redisNow()
	req := rules.CheckRequest{Limits: []rules.LimitRequest{lim("rl:{u:time}:x", spec(rules.FixedWindow, 5, hour))}}
	var resp rules.CheckResponse
	if err := s.Check(context.Background(), time.Time{}, &req, &resp); err != nil {
		t.Fatal(err)
	}
	if after := redisNow(); resp.NowMS < before || resp.NowMS > after {
		t.Fatalf("now_ms %d, want Redis TIME between %d and %d", resp.NowMS, before, after)
	}
}
