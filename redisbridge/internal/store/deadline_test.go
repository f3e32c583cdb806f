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
// more numerous than the pipelines all fail with ErrUnavailable at their
// deadline, including those that queued behind busy pipelines; none waits
// for Redis to answer.
func TestRedis_SlowRedisFailsEveryCheckInTime(t *testing.T) {
	srv := redistest.Start(t)
	s, err := NewRedis(RedisOptions{URL: srv.URL, Timeout: 150 * time.Millisecond, Pipelines: 2, MaxBatch: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check := func(i int) error {
		req := rules.CheckRequest{Limits: []rules.LimitRequest{lim("rl:{u:slow"+strconv.Itoa(i)+"}:x", spec(rules.FixedWindow, 10, hour))}}
		var resp rules.CheckResponse
		return s.Check(context.Background(), time.Time{}, &req, &resp)
	}
	if err := check(0); err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	// Paused far longer than the checks may take. A check that waited for
	// Redis would only return once the watchdog below lifts the pause, and
	// then succeed: the test fails, it does not hang.
	if err := rc.Do(context.Background(), "CLIENT", "PAUSE", "60000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
		case <-time.After(20 * time.Second):
		}
		rc.Do(context.Background(), "CLIENT", "UNPAUSE")
	}()
	var wg sync.WaitGroup
	errs := make([]error, 100)
	for i := range errs {
		wg.Go(func() { errs[i] = check(i) })
	}
	wg.Wait()
	close(done)
	for i, err := range errs {
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
			t.Fatalf("check %d: %v, want ErrUnavailable at the deadline", i, err)
		}
	}
}

// isTimeout reports an I/O deadline (a batch in flight when its deadline
// passed) rather than a call dropped from the queue.
func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}
