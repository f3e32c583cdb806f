package proccpu

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// WakeRoundTrip has two threads wake each other n times through a pair of
// pipes, each blocked in read until the other writes, and returns the
// time and the process CPU (user and system) one round trip took: on two
// CPUs, or with both threads on one when oneCPU is set. Every request of
// a proxy that finds its threads asleep pays such wake-ups, once per hop
// between processes; on a virtual machine waking a CPU that idles costs
// far more than handing over on one CPU. Linux only.
func WakeRoundTrip(n int, oneCPU bool) (wall, cpu time.Duration, err error) {
	if n <= 0 {
		return 0, 0, errors.New("proccpu: WakeRoundTrip needs n > 0")
	}
	cpus, err := allowedCPUs(2)
	if err != nil {
		return 0, 0, err
	}
	switch {
	case oneCPU:
		cpus = []int{cpus[0], cpus[0]}
	case len(cpus) < 2:
		return 0, 0, errors.New("proccpu: two CPUs needed, this thread may run on one")
	}
	var ping, pong [2]int // blocking descriptors, outside Go's poller
	if err := unix.Pipe2(ping[:], unix.O_CLOEXEC); err != nil {
		return 0, 0, fmt.Errorf("proccpu: pipe: %w", err)
	}
	if err := unix.Pipe2(pong[:], unix.O_CLOEXEC); err != nil {
		unix.Close(ping[0])
		unix.Close(ping[1])
		return 0, 0, fmt.Errorf("proccpu: pipe: %w", err)
	}
	const warm = 1000
	echoed := make(chan error, 1)
	// Both sides run on goroutines that end locked to their threads, so
	// the threads pinned here end with them.
	go func() {
		runtime.LockOSThread()
		err := echo(cpus[1], ping[0], pong[1])
		unix.Close(pong[1]) // a sender still waiting reads the end of the pipe
		echoed <- err
	}()
	type result struct {
		wall, cpu time.Duration
		err       error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		var r result
		r.wall, r.cpu, r.err = send(cpus[0], n, warm, ping[1], pong[0])
		done <- r
	}()
	r := <-done
	unix.Close(ping[1]) // ends the echo: its read sees the end of the pipe
	eerr := <-echoed
	unix.Close(ping[0])
	unix.Close(pong[0])
	if eerr != nil {
		return 0, 0, eerr
	}
	if r.err != nil {
		return 0, 0, r.err
	}
	return r.wall / time.Duration(n), r.cpu / time.Duration(n), nil
}

// allowedCPUs returns the first n CPUs (or fewer) this thread may run on,
// at least one.
func allowedCPUs(n int) ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("proccpu: sched_getaffinity: %w", err)
	}
	var cpus []int
	for c := 0; c < 1024 && len(cpus) < n; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) == 0 {
		return nil, errors.New("proccpu: no CPU in this thread's affinity")
	}
	return cpus, nil
}

// WatchStalls spins a thread pinned to each of the first two CPUs this
// process may run on for span, reading the clock, and returns by CPU what
// each saw (Stalls) of jumps longer than over. It takes those CPUs whole
// for span: run it when nothing else is measured. Linux only.
func WatchStalls(span, over time.Duration) ([]Stalls, error) {
	cpus, err := allowedCPUs(2)
	if err != nil {
		return nil, err
	}
	type result struct {
		s   Stalls
		err error
	}
	results := make([]chan result, len(cpus))
	for i, cpu := range cpus {
		results[i] = make(chan result, 1)
		go func() {
			runtime.LockOSThread() // ends with the goroutine: the pinned thread goes with it
			if err := pin(cpu); err != nil {
				results[i] <- result{err: err}
				return
			}
			t0 := time.Now()
			results[i] <- result{s: watch(func() time.Duration { return time.Since(t0) }, span, over)}
		}()
	}
	out := make([]Stalls, len(cpus))
	var first error
	for i := range cpus {
		r := <-results[i]
		out[i] = r.s
		if r.err != nil && first == nil {
			first = r.err
		}
	}
	if first != nil {
		return nil, first
	}
	return out, nil
}

func pin(cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("proccpu: sched_setaffinity: %w", err)
	}
	return nil
}

// echo writes back each byte read until the pipe ends.
func echo(onCPU, in, out int) error {
	if err := pin(onCPU); err != nil {
		return err
	}
	b := []byte{0}
	for {
		if err := readByte(in, b); err == errEnded {
			return nil
		} else if err != nil {
			return err
		}
		if _, err := unix.Write(out, b); err != nil {
			return fmt.Errorf("proccpu: write: %w", err)
		}
	}
}

var errEnded = errors.New("proccpu: the other end of the pipe closed")

// readByte reads one byte into b, blocked until it comes; errEnded when
// the pipe has ended.
func readByte(fd int, b []byte) error {
	for {
		k, err := unix.Read(fd, b)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return fmt.Errorf("proccpu: read: %w", err)
		case k == 0:
			return errEnded
		}
		return nil
	}
}

// send makes warm round trips, then n timed ones.
func send(onCPU, n, warm, out, in int) (wall, used time.Duration, err error) {
	if err := pin(onCPU); err != nil {
		return 0, 0, err
	}
	b := []byte{0}
	var t0 time.Time
	var c0 time.Duration
	for i := range warm + n {
		if i == warm {
			if c0, err = selfCPU(); err != nil {
				return 0, 0, err
			}
			t0 = time.Now()
		}
		if _, err := unix.Write(out, b); err != nil {
			return 0, 0, fmt.Errorf("proccpu: write: %w", err)
		}
		if err := readByte(in, b); err != nil {
			return 0, 0, err
		}
	}
	wall = time.Since(t0)
	c1, err := selfCPU()
	if err != nil {
		return 0, 0, err
	}
	return wall, c1 - c0, nil
}

func selfCPU() (time.Duration, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("proccpu: getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
