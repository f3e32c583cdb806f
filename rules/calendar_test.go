package rules

import (
	"testing"
	"time"
)

func TestLimitSpec_FixedWindowIndex(t *testing.T) {
	at := func(s string) int64 {
		t.Helper()
		tm, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMilli()
	}
	tests := []struct {
		name        string
		spec        LimitSpec
		now         string
		start, ends string
	}{
		{"a month", LimitSpec{Months: 1}, "2026-11-29T14:00:00Z", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z"},
		{"the last ms of January", LimitSpec{Months: 1}, "2027-01-31T23:59:59.999Z", "2027-01-01T00:00:00Z", "2027-02-01T00:00:00Z"},
		{"the first ms of February", LimitSpec{Months: 1}, "2027-02-01T00:00:00Z", "2027-02-01T00:00:00Z", "2027-03-01T00:00:00Z"},
		{"a leap February", LimitSpec{Months: 1}, "2028-02-29T12:00:00Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z"},
		{"December", LimitSpec{Months: 1}, "2026-12-31T23:59:59.999Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"a quarter", LimitSpec{Months: 3}, "2026-05-17T08:00:00Z", "2026-04-01T00:00:00Z", "2026-07-01T00:00:00Z"},
		{"the last quarter", LimitSpec{Months: 3}, "2026-11-29T00:00:00Z", "2026-10-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"half a year", LimitSpec{Months: 6}, "2026-07-01T00:00:00Z", "2026-07-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"a year", LimitSpec{Months: 12}, "2100-03-01T00:00:00Z", "2100-01-01T00:00:00Z", "2101-01-01T00:00:00Z"},
		{"January 1970", LimitSpec{Months: 1}, "1970-01-15T00:00:00Z", "1970-01-01T00:00:00Z", "1970-02-01T00:00:00Z"},
		{"an hour, from the epoch", LimitSpec{WindowMS: 3600_000}, "2026-11-29T14:30:00Z", "2026-11-29T14:00:00Z", "2026-11-29T15:00:00Z"},
		{"a week, from the epoch (a Thursday)", LimitSpec{WindowMS: 7 * 86400_000}, "2026-11-29T14:30:00Z", "2026-11-26T00:00:00Z", "2026-12-03T00:00:00Z"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			idx := tc.spec.FixedWindowIndex(at(tc.now))
			if got, want := tc.spec.FixedWindowStart(idx), at(tc.start); got != want {
				t.Errorf("start %s, want %s", time.UnixMilli(got).UTC(), tc.start)
			}
			if got, want := tc.spec.FixedWindowStart(idx+1), at(tc.ends); got != want {
				t.Errorf("end %s, want %s", time.UnixMilli(got).UTC(), tc.ends)
			}
		})
	}
}
