// Package redistest runs a throwaway redis-server for tests: on a free
// loopback port, with no persistence, in a temporary directory, stopped when
// the test ends.
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
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
	dir  string
	port int
	cmd  *exec.Cmd
}

// Start starts a redis-server and stops it when t ends. It fails the test
// when redis-server is missing: install it (Debian package redis-server).
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	if _, err := exec.LookPath(Binary); err != nil {
		t.Fatalf("redistest: %s not found (apt-get install redis-server): %v", Binary, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: no free port: %v", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := &Server{t: t, dir: t.TempDir(), port: port}
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	s.URL = "redis://" + s.Addr + "/0"
	s.start(args)
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start(extra []string) {
	s.t.Helper()
	args := append([]string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--logfile", "", "--loglevel", "warning",
	}, extra...)
	s.cmd = exec.Command(Binary, args...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("redistest: start redis-server: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := ping(s.Addr); err == nil {
			return
		} else if time.Now().After(deadline) {
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
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart starts an empty redis-server on the same port.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start(nil)
}
