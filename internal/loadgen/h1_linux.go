package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
	"unsafe"
)

// The HTTP/1.1 client is one event loop over all its connections, on
// sockets of its own (not Go's network poller): a request is one write,
// an answer one read where it fits in one, and epoll says which
// connections have an answer, many per wait. So the generator costs the
// machine about what redis-benchmark's event loop costs it, where a
// goroutine per connection paid, per request, a read that finds nothing,
// a park and a wake-up of its own: on a machine it shares with the
// server it measures, that was CPU taken from the server. Paced requests
// go out when due to the microsecond (epoll_pwait2), where the Go
// runtime's timers wake an idle process to the millisecond and sent them
// in bursts.

// h1conn is one connection of the event loop.
type h1conn struct {
	fd      int
	reqs    [][]byte // its prebuilt requests, by body
	buf     []byte   // read, not yet parsed
	pending []byte   // the unwritten rest of the request in flight
	out     bool     // registered for EPOLLOUT
	busy    bool     // a request is in flight
	start   time.Time
	lat     []time.Duration
}

func runH1(ctx context.Context, o Options) (Result, error) {
	reqs := o.requests()
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return Result{}, fmt.Errorf("loadgen: epoll: %w", err)
	}
	defer syscall.Close(ep)
	conns := make([]*h1conn, o.Conns)
	defer func() {
		for _, c := range conns {
			if c != nil {
				syscall.Close(c.fd)
			}
		}
	}()
	for i := range conns {
		fd, err := dialRaw(o.Addr)
		if err != nil {
			return Result{}, fmt.Errorf("loadgen: dial: %w", err)
		}
		conns[i] = &h1conn{fd: fd, reqs: reqs[i%len(reqs)], buf: make([]byte, 0, 16<<10),
			lat: make([]time.Duration, 0, o.N/len(conns)+1)}
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(i)}
		if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return Result{}, fmt.Errorf("loadgen: epoll: %w", err)
		}
	}
	check := o.checker()
	var (
		next, done int
		idle       = make([]int, 0, len(conns)) // free connections, oldest first (paced)
		events     = make([]syscall.EpollEvent, len(conns))
	)
	send := func(i int) error {
		c := conns[i]
		c.busy, c.pending, c.start = true, c.reqs[next%len(c.reqs)], time.Now()
		next++
		return c.flush(ep, i)
	}
	cpu0 := processCPU()
	t0 := time.Now()
	due := func(i int) time.Time { return t0.Add(time.Duration(float64(i) * float64(time.Second) / o.Rate)) }
	var runErr error
	if o.Rate > 0 {
		for i := range conns {
			idle = append(idle, i)
		}
	} else {
		for i := range conns {
			if next < o.N {
				if runErr = send(i); runErr != nil {
					break
				}
			}
		}
	}
	for runErr == nil && done < o.N && ctx.Err() == nil {
		wait := 100 * time.Millisecond // ctx is looked at between waits
		if o.Rate > 0 && len(idle) > 0 && next < o.N {
			if d := time.Until(due(next)); d > 0 {
				wait = min(wait, d)
			} else {
				i := idle[0]
				idle = append(idle[:0], idle[1:]...)
				runErr = send(i)
				continue
			}
		}
		n, err := epollWait(ep, events, wait)
		if err != nil {
			runErr = fmt.Errorf("loadgen: epoll: %w", err)
			break
		}
		for _, ev := range events[:n] {
			i := int(ev.Fd)
			c := conns[i]
			if ev.Events&syscall.EPOLLOUT != 0 && len(c.pending) > 0 {
				if runErr = c.flush(ep, i); runErr != nil {
					break
				}
			}
			if ev.Events&(syscall.EPOLLIN|syscall.EPOLLERR|syscall.EPOLLHUP) == 0 {
				continue
			}
			a, err := c.read()
			if err != nil {
				runErr = err
				break
			}
			if a.size == 0 {
				continue // the answer is not all there yet
			}
			done++
			if err := check(a.status, a.body); err != nil {
				runErr = err
				break
			}
			c.buf = c.buf[:copy(c.buf, c.buf[a.size:])]
			switch {
			case o.Rate > 0:
				idle = append(idle, i)
			case next < o.N:
				runErr = send(i)
			}
			if runErr != nil {
				break
			}
		}
	}
	lat := make([][]time.Duration, len(conns))
	for i, c := range conns {
		lat[i] = c.lat
	}
	return result(ctx, t0, cpu0, lat, runErr)
}

// flush writes what is left of the request in flight, and has epoll watch
// for room in the socket's buffer while some is left.
func (c *h1conn) flush(ep, i int) error {
	for len(c.pending) > 0 {
		n, err := syscall.Write(c.fd, c.pending)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return c.watchOut(ep, i, true)
		case err != nil:
			return fmt.Errorf("loadgen: write: %w", err)
		}
		c.pending = c.pending[n:]
	}
	return c.watchOut(ep, i, false)
}

func (c *h1conn) watchOut(ep, i int, on bool) error {
	if c.out == on {
		return nil
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(i)}
	if on {
		ev.Events |= syscall.EPOLLOUT
	}
	c.out = on
	if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_MOD, c.fd, &ev); err != nil {
		return fmt.Errorf("loadgen: epoll: %w", err)
	}
	return nil
}

// read reads once (epoll is level-triggered: what is left is reported
// again) and returns the answer to the request in flight once the buffer
// holds all of it (size 0 until then). Its body is valid until the next
// read.
func (c *h1conn) read() (answer, error) {
	if len(c.buf) == cap(c.buf) {
		c.buf = append(c.buf, 0)[:len(c.buf)] // grow: an answer larger than the buffer
	}
	n, err := syscall.Read(c.fd, c.buf[len(c.buf):cap(c.buf)])
	switch {
	case err == syscall.EAGAIN || err == syscall.EINTR:
		return answer{}, nil
	case err != nil:
		return answer{}, fmt.Errorf("loadgen: read: %w", err)
	case n == 0:
		return answer{}, errors.New("loadgen: read: the server closed the connection")
	}
	c.buf = c.buf[:len(c.buf)+n]
	a, err := parseResponse(c.buf)
	switch {
	case err != nil:
		return answer{}, fmt.Errorf("loadgen: read: %w", err)
	case a.size > 0 && !c.busy:
		return answer{}, errors.New("loadgen: read: an answer to no request")
	case a.size > 0 && len(c.pending) > 0:
		return answer{}, errors.New("loadgen: read: an answer before the whole request was sent")
	case a.size > 0:
		c.lat = append(c.lat, time.Since(c.start))
		c.busy = false
	}
	return a, nil
}

// dialRaw connects a blocking TCP socket to addr, then makes it
// non-blocking for the event loop.
func dialRaw(addr string) (int, error) {
	ta, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return -1, err
	}
	var sa syscall.Sockaddr
	family := syscall.AF_INET
	if ip4 := ta.IP.To4(); ip4 != nil {
		sa = &syscall.SockaddrInet4{Port: ta.Port, Addr: [4]byte(ip4)}
	} else {
		family = syscall.AF_INET6
		sa = &syscall.SockaddrInet6{Port: ta.Port, Addr: [16]byte(ta.IP.To16())}
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, syscall.IPPROTO_TCP)
	if err != nil {
		return -1, err
	}
	// A blocking connect gives up after SO_SNDTIMEO.
	tv := syscall.NsecToTimeval(int64(10 * time.Second))
	if err = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_SNDTIMEO, &tv); err == nil {
		for {
			if err = syscall.Connect(fd, sa); err != syscall.EINTR {
				break
			}
		}
	}
	if err == nil { // as Go's net package sets it
		err = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	}
	if err == nil {
		err = syscall.SetNonblock(fd, true)
	}
	if err != nil {
		syscall.Close(fd)
		return -1, err
	}
	return fd, nil
}

// sysEpollPwait2 is epoll_pwait2's number, the same on every Linux
// architecture (it came after their tables were unified).
const sysEpollPwait2 = 441

// epollWait waits up to d for events, to the microsecond where the kernel
// has epoll_pwait2 (5.11), else to the millisecond, rounded up.
func epollWait(ep int, events []syscall.EpollEvent, d time.Duration) (int, error) {
	for {
		ts := syscall.NsecToTimespec(int64(d))
		n, _, errno := syscall.Syscall6(sysEpollPwait2, uintptr(ep), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)),
			uintptr(unsafe.Pointer(&ts)), 0, 0)
		switch errno {
		case 0:
			return int(n), nil
		case syscall.EINTR:
			continue
		case syscall.ENOSYS:
			n, err := syscall.EpollWait(ep, events, int((d+time.Millisecond-1)/time.Millisecond))
			if err == syscall.EINTR {
				continue
			}
			return n, err
		}
		return 0, errno
	}
}
