package proccpu

import (
	"os"
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
