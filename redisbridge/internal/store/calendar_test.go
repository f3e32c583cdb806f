package store

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules"
)

// utcMS is s (RFC 3339) in unix ms.
func utcMS(t *testing.T, s string) int64 {
	t.Helper()
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMilli()
}

func monthsSpec(limit, months int64) rules.LimitSpec {
	s := spec(rules.FixedWindow, limit, months*rules.MonthMS)
	s.Months = months
	return s
}

// A fixed window of calendar months ends on the 1st at 00:00 UTC, however
// long its month, in both stores: its count, reset, retry and expiry.
func TestStore_CalendarMonths(t *testing.T) {
	for _, h := range harnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			l := lim("rl:{u:cal}:monthly", monthsSpec(2, 1))
			h.now.Store(utcMS(t, "2027-01-31T23:59:59.998Z"))
			feb, mar := utcMS(t, "2027-02-01T00:00:00Z"), utcMS(t, "2027-03-01T00:00:00Z")
			for i, want := range []int64{1, 0} {
				if d := h.check(t, l).Decisions[0]; !d.Allowed || d.Remaining != want || d.ResetMS != feb {
					t.Fatalf("check %d in January: %+v, want allowed, %d left, reset %d", i, d, want, feb)
				}
			}
			if d := h.check(t, l).Decisions[0]; d.Allowed || d.RetryAfterMS != 2 || d.ResetMS != feb {
				t.Fatalf("third in January: %+v, want denied, retry 2 ms", d)
			}
			if ttl := h.keys(t)["rl:{u:cal}:monthly:fm"]; ttl <= feb-h.now.Load() || ttl > feb-h.now.Load()+1000 {
				t.Errorf("January's key lives %d ms, want until a second past its window", ttl)
			}
			h.sleep(2)
			if d := h.check(t, l).Decisions[0]; !d.Allowed || d.Remaining != 1 || d.ResetMS != mar {
				t.Fatalf("first in February: %+v, want allowed, 1 left, reset %d", d, mar)
			}
			// A quarter that holds a leap day: February 29 is in it.
			q := lim("rl:{u:cal}:quarterly", monthsSpec(5, 3))
			h.now.Store(utcMS(t, "2028-02-29T12:00:00Z"))
			if d := h.check(t, q).Decisions[0]; !d.Allowed || d.ResetMS != utcMS(t, "2028-04-01T00:00:00Z") {
				t.Fatalf("a quarter: %+v, want reset on April 1", d)
			}
			// A window of an hour beside it keeps to the epoch's hours.
			hr := lim("rl:{u:cal}:hourly", spec(rules.FixedWindow, 5, hour))
			if d := h.check(t, hr).Decisions[0]; d.ResetMS != utcMS(t, "2028-02-29T13:00:00Z") {
				t.Fatalf("an hour: %+v", d)
			}
		})
	}
}

// check.lua reckons calendar months as the rules package does (time.Date)
// at random times from 1970 to 2400: leap years, and 2100, which is not.
func TestRedis_CalendarMonthsAsRules(t *testing.T) {
	h := redisHarness(t, false)
	rng := rand.New(rand.NewPCG(1, 2))
	end := utcMS(t, "2400-12-31T23:59:59.999Z")
	for i := range 400 {
		now := rng.Int64N(end)
		switch i % 4 { // near the end of a month, where an off-by-one shows
		case 0:
			tm := time.UnixMilli(now).UTC()
			now = time.Date(tm.Year(), tm.Month()+1, 1, 0, 0, 0, 0, time.UTC).UnixMilli() - rng.Int64N(2)
		case 1:
			tm := time.UnixMilli(now).UTC()
			now = time.Date(tm.Year(), tm.Month(), 1, 0, 0, 0, 0, time.UTC).UnixMilli()
		}
		months := []int64{1, 2, 3, 4, 6, 12}[rng.IntN(6)]
		s := monthsSpec(10, months)
		h.now.Store(now)
		d := h.check(t, lim("rl:{u:cal}:r"+time.UnixMilli(now).UTC().Format(time.RFC3339Nano), s)).Decisions[0]
		if want := s.FixedWindowStart(s.FixedWindowIndex(now) + 1); d.ResetMS != want {
			t.Fatalf("%s, %d months: reset %s, want %s", time.UnixMilli(now).UTC(), months,
				time.UnixMilli(d.ResetMS).UTC(), time.UnixMilli(want).UTC())
		}
	}
}
