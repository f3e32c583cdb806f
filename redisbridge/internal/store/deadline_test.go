package store

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/rules"
)

// TestRedis_SlowRedisFailsEveryCheckInTime: with Redis paused, checks far
// more numerous than the pipelines all fail with ErrUnavailable within
// about the timeout, including those that queued behind busy pipelines.
func TestRedis_SlowRedisFailsEveryCheckInTime(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 150 * time.Millisecond
	s, err := NewRedis(RedisOptions{URL: srv.URL, Timeout: timeout, Pipelines: 2, MaxBatch: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check := func(i int) error {
		req := rules.CheckRequest{Limits: []rules.LimitRequest{lim("rl:{u:slow"+strconv.Itoa(i)+"}:x", spec(rules.FixedWindow, 10, hour))}}
		var resp rules.CheckResponse
		return s.Check(context.Background(), &req, &resp)
	}
	if err := check(0); err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	if err := rc.Do(context.Background(), "CLIENT", "PAUSE", "1500", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 100)
	took := make([]time.Duration, len(errs))
	for i := range errs {
		wg.Go(func() {
			t0 := time.Now()
			errs[i] = check(i)
			took[i] = time.Since(t0)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("check %d: %v, want ErrUnavailable", i, err)
		}
		if took[i] > timeout+250*time.Millisecond {
			t.Fatalf("check %d took %v, want about the %v timeout", i, took[i], timeout)
		}
	}
}
