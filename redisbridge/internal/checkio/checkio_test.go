package checkio

import (
	"testing"
	"time"
)

// ConnAge stays within a tenth of the age, and spreads over that range.
func TestConnAge(t *testing.T) {
	const d = time.Hour
	lo, hi := d, d
	for range 10_000 {
		a := ConnAge(d)
		if a < d-d/10 || a > d+d/10 {
			t.Fatalf("ConnAge(%v) = %v, beyond a tenth", d, a)
		}
		lo, hi = min(lo, a), max(hi, a)
	}
	if lo > d-d/20 || hi < d+d/20 {
		t.Errorf("10,000 ages from %v to %v: not spread over the tenth either side", lo, hi)
	}
	if a := ConnAge(time.Nanosecond); a != time.Nanosecond {
		t.Errorf("ConnAge(1ns) = %v", a)
	}
}
