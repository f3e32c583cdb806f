// Package proccpu reads how much CPU another process used, for benchmarks
// that run the product as processes of their own (a bridge, gateways).
package proccpu

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// Of returns the user+system CPU time of process pid from /proc (Linux),
// in clock ticks of 10 ms.
func Of(pid int) (time.Duration, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from after it (state is the first, utime the 12th, stime the 13th).
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 || i+2 > len(raw) {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := bytes.Fields(raw[i+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	ut, err1 := strconv.ParseInt(string(f[11]), 10, 64)
	st, err2 := strconv.ParseInt(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// Machine returns the time every CPU of the machine spent busy (neither
// idle nor waiting for I/O) and in all, summed over CPUs, from /proc/stat
// (Linux), in clock ticks of 10 ms: busy/total over an interval is how
// loaded the machine was, kernel work outside any process included. Time a
// virtual machine's hypervisor gave to others (steal) is in neither.
func Machine() (busy, total time.Duration, err error) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := bytes.Cut(raw, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 6 || string(f[0]) != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected format")
	}
	var idle int64
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: unexpected format")
		}
		// Steal is not ours; guest time (the fields after it) is also
		// counted in user time.
		if i >= 7 {
			break
		}
		total += time.Duration(n) * 10 * time.Millisecond
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	return total - time.Duration(idle)*10*time.Millisecond, total, nil
}

// Switches returns how many times the machine's CPUs have switched from
// one thread to another since boot (/proc/stat's ctxt, Linux). Over an
// interval, per request, it counts the hand-offs a request cost every
// process it passed through, and the kernel: on a virtual machine each
// is a wake-up of another CPU or a thread put to sleep.
func Switches() (int64, error) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	for line := range bytes.SplitSeq(raw, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("ctxt ")); ok {
			n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/stat: unexpected ctxt %q", v)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("/proc/stat: no ctxt line")
}

// Stalls is what a thread that never blocks saw of its CPU over Span:
// how often the clock jumped by more than the threshold between two reads
// in a row (Count), the time those jumps took in all (Lost), and the
// longest (Longest). On a machine of its own a spinning thread sees
// none; on a virtual machine the hypervisor and the guest kernel's own
// threads take its CPU away for milliseconds at a time, and every process
// a request passes through can be caught in such a gap.
type Stalls struct {
	Span, Lost, Longest time.Duration
	Count               int
}

// watch reads now, a monotonic clock, until span has passed, and sums the
// steps longer than over.
func watch(now func() time.Duration, span, over time.Duration) Stalls {
	t0 := now()
	last := t0
	var s Stalls
	for last-t0 < span {
		t := now()
		if d := t - last; d > over {
			s.Count++
			s.Lost += d
			s.Longest = max(s.Longest, d)
		}
		last = t
	}
	s.Span = last - t0
	return s
}
