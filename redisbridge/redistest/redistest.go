// Package redistest runs a throwaway redis-server for tests: on a free
// loopback port, with no persistence, in a temporary directory, stopped when
// the test ends.
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Binary is the redis-server the tests start.
var Binary = "/usr/bin/redis-server"

// Server is a running redis-server.
type Server struct {
	Addr string // 127.0.0.1:port
	URL  string // redis://127.0.0.1:port/0

	t    testing.TB
	mu   sync.Mutex // guards cmd: fault tests stop servers from other goroutines
	dir  string
	port int
	cmd  *exec.Cmd
	// exited yields cmd's exit (a goroutine waits for it from the start).
	exited <-chan error
	args   []string // extra arguments, kept for Restart
	conf   string   // config file given first (sentinels), or ""
}

// Start starts a redis-server and stops it when t ends. It fails the test
// when redis-server is missing: install it (Debian package redis-server).
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	if _, err := exec.LookPath(Binary); err != nil {
		t.Fatalf("redistest: %s not found (apt-get install redis-server): %v", Binary, err)
	}
	s := newServer(t, args)
	s.startFirst()
	t.Cleanup(s.Stop)
	return s
}

// newServer picks a free port and a directory for a server not yet started.
func newServer(t testing.TB, args []string) *Server {
	t.Helper()
	s := &Server{t: t, dir: t.TempDir(), args: args}
	s.pickPort()
	return s
}

// pickPort gives s a port that is free now; a cluster node also needs its
// bus port, 10000 above, free. Another process may take either before the
// server binds it: startFirst then picks again.
func (s *Server) pickPort() {
	s.t.Helper()
	cluster := slices.Contains(s.args, "--cluster-enabled")
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			s.t.Fatalf("redistest: no free port: %v", err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		free := true
		if cluster {
			bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
			if free = err == nil; free {
				bus.Close()
			}
		}
		ln.Close()
		if free {
			s.port = port
			s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			s.URL = "redis://" + s.Addr + "/0"
			return
		}
	}
	s.t.Fatal("redistest: no free port with a free cluster bus port")
}

// startFirst starts a server that was never started: on a port taken
// between pickPort and the server's bind, it picks another and tries
// again (a sentinel's port is in its file, written for the first).
func (s *Server) startFirst() {
	s.t.Helper()
	for try := 0; ; try++ {
		out, taken := s.tryStart()
		if !taken {
			return
		}
		if try == 4 || s.conf != "" {
			s.t.Fatalf("redistest: redis-server on %s: its port was taken: %s", s.Addr, out)
		}
		s.pickPort()
	}
}

// start starts the server on its port (again, for Restart).
func (s *Server) start() {
	s.t.Helper()
	if out, taken := s.tryStart(); taken {
		s.t.Fatalf("redistest: redis-server on %s exited before it was ready: its port was taken: %s", s.Addr, out)
	}
}

// tryStart starts the server and waits until it answers; taken reports
// that it exited because its port (or bus port) was in use, with its
// output. Any other failure fails the test.
func (s *Server) tryStart() (out string, taken bool) {
	s.t.Helper()
	var args []string
	if s.conf != "" {
		args = []string{s.conf, "--sentinel"}
	} else {
		// A master otherwise holds a replica's first sync 5 s for more
		// replicas to share it (repl-diskless-sync-delay); every cluster,
		// Sentinel start and failover in the tests waited for it.
		args = append([]string{
			"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", s.dir, "--logfile", "", "--loglevel", "warning", "--repl-diskless-sync-delay", "0",
		}, s.args...)
	}
	cmd := exec.Command(Binary, args...)
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("redistest: start redis-server: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	// A loaded machine can take a while to start a process; a server that
	// exits (its port taken meanwhile, say) fails at once with its output.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := ping(s.Addr)
		if err == nil {
			return "", false
		}
		select {
		case werr := <-exited:
			s.mu.Lock()
			s.cmd = nil
			s.mu.Unlock()
			if strings.Contains(stderr.String(), "Address already in use") {
				return stderr.String(), true
			}
			s.t.Fatalf("redistest: redis-server on %s exited before it was ready (%v): %s", s.Addr, werr, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			s.Stop()
			s.t.Fatalf("redistest: redis-server on %s not ready: %v", s.Addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// Stop kills redis-server; its data is lost. Stopping twice is harmless.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Restart starts redis-server again on the same port, with the same
// arguments. Its data is lost; a cluster node keeps its nodes.conf and
// rejoins its cluster.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}

// Running reports whether the server was started and not stopped.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}
