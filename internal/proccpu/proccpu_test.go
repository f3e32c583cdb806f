package proccpu

import (
	"os"
	"runtime"
	"testing"
	"time"
)

// This process's own CPU time, read as another's, grows with work.
func TestOf(t *testing.T) {
	before, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
	}
	after, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Errorf("CPU time %v, then %v after 50 ms of work", before, after)
	}
	if _, err := Of(-1); err == nil {
		t.Error("no error for a process that does not exist")
	}
}

// Work in this process shows as machine time busy, and busy time never
// exceeds the time that passed on every CPU.
func TestMachine(t *testing.T) {
	busy0, total0, err := Machine()
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
	}
	busy1, total1, err := Machine()
	if err != nil {
		t.Fatal(err)
	}
	if busy1 <= busy0 || total1 <= total0 {
		t.Errorf("busy %v → %v, total %v → %v after 50 ms of work", busy0, busy1, total0, total1)
	}
	if busy1-busy0 > total1-total0 || busy1 > total1 {
		t.Errorf("busy %v of %v", busy1-busy0, total1-total0)
	}
}

// A thread that sleeps with nothing else to run leaves its CPU: every
// sleep is at least one context switch. The sleeps are long enough for
// the Go runtime to park its thread rather than spin through them: 1 µs
// sleeps came to 198 switches for 200 once on a busy machine.
func TestSwitches(t *testing.T) {
	before, err := Switches()
	if err != nil {
		t.Fatal(err)
	}
	const sleeps = 200
	for range sleeps {
		time.Sleep(100 * time.Microsecond)
	}
	after, err := Switches()
	if err != nil {
		t.Fatal(err)
	}
	if after-before < sleeps {
		t.Errorf("%d context switches over %d sleeps", after-before, sleeps)
	}
}

// Two threads wake each other on two CPUs and on one; a round trip takes
// some time and some CPU, far less than a second on any machine.
func TestWakeRoundTrip(t *testing.T) {
	for _, oneCPU := range []bool{false, true} {
		wall, cpu, err := WakeRoundTrip(2000, oneCPU)
		if err != nil {
			t.Fatalf("one CPU %v: %v", oneCPU, err)
		}
		if wall <= 0 || wall > time.Second || cpu <= 0 || cpu > time.Second {
			t.Errorf("one CPU %v: round trip %v, CPU %v", oneCPU, wall, cpu)
		}
		t.Logf("one CPU %v: round trip %v, CPU %v", oneCPU, wall, cpu)
	}
	if _, _, err := WakeRoundTrip(0, false); err == nil {
		t.Error("no error for 0 round trips")
	}
}

// The clock's steps longer than the threshold are the stalls; watching
// ends at the first read a span after the start.
func TestWatch(t *testing.T) {
	us := time.Microsecond
	for _, tc := range []struct {
		name  string
		reads []time.Duration // what the clock returns, in order
		want  Stalls
	}{
		{"none", []time.Duration{0, 200 * us, 400 * us, 600 * us, 800 * us, 1000 * us}, Stalls{Span: 1000 * us}},
		{"one", []time.Duration{0, 200 * us, 700 * us, 900 * us, 1100 * us}, Stalls{Span: 1100 * us, Lost: 500 * us, Longest: 500 * us, Count: 1}},
		{"at the threshold, not over", []time.Duration{0, 300 * us, 600 * us, 900 * us, 1200 * us}, Stalls{Span: 1200 * us}},
		{"the last read past the span", []time.Duration{0, 50 * us, 3000 * us}, Stalls{Span: 3000 * us, Lost: 2950 * us, Longest: 2950 * us, Count: 1}},
		{"several", []time.Duration{0, 500 * us, 510 * us, 2510 * us}, Stalls{Span: 2510 * us, Lost: 2500 * us, Longest: 2000 * us, Count: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i := 0
			now := func() time.Duration {
				if i == len(tc.reads) {
					t.Fatalf("read %d times, %d readings", i+1, len(tc.reads))
				}
				i++
				return tc.reads[i-1]
			}
			if got := watch(now, 1000*us, 300*us); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if i != len(tc.reads) {
				t.Errorf("read the clock %d times, want %d", i, len(tc.reads))
			}
		})
	}
}

// A thread spins on each of up to two CPUs for the span asked; what it
// lost fits in what it watched.
func TestWatchStalls(t *testing.T) {
	const span = 50 * time.Millisecond
	got, err := WatchStalls(span, 100*time.Microsecond)
	if err != nil {
		t.Fatal(err)
	}
	if want := min(runtime.NumCPU(), 2); len(got) != want {
		t.Fatalf("%d CPUs watched, want %d", len(got), want)
	}
	for i, s := range got {
		if s.Span < span || s.Span > span+time.Second || s.Lost > s.Span || s.Longest > s.Lost ||
			(s.Count == 0) != (s.Lost == 0) || s.Count > 0 && s.Longest <= 100*time.Microsecond {
			t.Errorf("CPU %d: %+v", i, s)
		}
		t.Logf("CPU %d: %+v", i, s)
	}
}
