// Package pgtest runs a throwaway PostgreSQL server for tests: initdb in a
// temporary directory, postgres on a free loopback port, never a system
// service. A test package shares one server (Shared, stopped by Main) and
// gives each test a database of its own (NewDatabase), which is much
// faster than a server per test.
//
// PostgreSQL refuses to run as root, and tests here run as root: then
// initdb and postgres run as the user nobody, in a directory handed to it.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// BinDir returns the directory of Debian's initdb and postgres, which are
// not on PATH (/usr/lib/postgresql/<major>/bin; the highest major wins).
func BinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return major(dirs[i]) < major(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "postgres")); err == nil {
			return dirs[i], nil
		}
	}
	if p, err := exec.LookPath("postgres"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("pgtest: no postgres under /usr/lib/postgresql/*/bin or on PATH (make deps installs Debian's postgresql)")
}

func major(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// Server is a running PostgreSQL server with a superuser "postgres" that
// needs no password, on 127.0.0.1 only.
type Server struct {
	Addr string // 127.0.0.1:port
	Port int

	bin  string
	dir  string // root of the server's files
	data string
	cred *syscall.Credential // nil when not root
	seq  atomic.Int64
	// prefix begins its databases' names: the digits of its temporary
	// directory's name, which no other server running has. A killed
	// server's port may be taken by another test process's server, and
	// a client still dialing it must then find no database of its name
	// there (not a t1 of the other's, which would take its writes).
	prefix string

	mu     sync.Mutex // guards cmd: fault tests stop the server from other goroutines
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd exits
}

// Start starts a server of its own for t, stopped when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Remove)
	return s
}

var shared struct {
	once sync.Once
	s    *Server
	err  error
}

// Shared returns the server the tests of this package share, starting it
// on first use. Call Main from the package's TestMain to stop it.
func Shared(t testing.TB) *Server {
	t.Helper()
	shared.once.Do(func() { shared.s, shared.err = start() })
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.s
}

// Main runs the tests and then removes the shared server, if one started.
func Main(m *testing.M) {
	code := m.Run()
	RemoveShared()
	os.Exit(code)
}

// RemoveShared removes the shared server, if one started: for a TestMain
// that does more than Main.
func RemoveShared() {
	if shared.s != nil {
		shared.s.Remove()
	}
}

func start() (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, data: filepath.Join(dir, "data"), prefix: "t" + strings.TrimPrefix(filepath.Base(dir), "pgtest-") + "_"}
	fail := func(err error) (*Server, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("nobody")
		if err != nil {
			return fail(fmt.Errorf("pgtest: running as root needs the user nobody to run postgres as: %w", err))
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		// MkdirTemp made dir 0700; nobody must reach its data directory.
		if err := os.Chmod(dir, 0o755); err != nil {
			return fail(err)
		}
	}
	if err := os.Mkdir(s.data, 0o700); err != nil {
		return fail(err)
	}
	if s.cred != nil {
		if err := os.Chown(s.data, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return fail(err)
		}
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", s.data, "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
	initdb.Dir = s.data
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("pgtest: initdb: %v\n%s", err, out))
	}
	if err := s.pickPort(); err != nil {
		return fail(err)
	}
	if err := s.launch(true); err != nil {
		return fail(err)
	}
	return s, nil
}

// freePort returns a loopback port that is free now. Another process may
// take it before postgres binds it: the first launch then picks again.
var freePort = func() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: no free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) pickPort() error {
	port, err := freePort()
	if err != nil {
		return err
	}
	s.Port = port
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	return nil
}

// launch starts postgres on the data directory and waits until it
// accepts connections. fsync is off: tests kill the server, never the
// machine, so what a commit wrote is in the kernel's page cache and
// survives; synchronous_commit stays on, so an acknowledged commit is
// never lost to a killed server. The first launch of a server moves to
// another port when its own was taken before postgres bound it (test
// packages start servers at once); a restart keeps its port.
func (s *Server) launch(first bool) error {
	deadline := time.Now().Add(30 * time.Second)
	for moves := 0; ; {
		logged := fileSize(s.logPath())
		exited, err := s.startOnce()
		if err != nil {
			return err
		}
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			c, err := pgx.Connect(ctx, s.URL("postgres"))
			if err == nil {
				c.Close(ctx)
				cancel()
				return nil
			}
			cancel()
			if time.Now().After(deadline) {
				s.Kill()
				log, _ := os.ReadFile(s.logPath())
				return fmt.Errorf("pgtest: postgres on %s not ready: %v\n%s", s.Addr, err, log)
			}
			select {
			case <-exited:
				// After a kill, backends of the killed server may still
				// hold its shared memory for a moment; postgres refuses to
				// start until they are gone. Try again.
				s.mu.Lock()
				s.cmd = nil
				s.mu.Unlock()
			case <-time.After(20 * time.Millisecond):
				continue
			}
			break
		}
		if first && moves < 5 && portTaken(s.logPath(), logged) {
			moves++
			if err := s.pickPort(); err != nil {
				return err
			}
			continue
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// portTaken tells whether postgres wrote, past offset from of its log,
// that it could not bind its port.
func portTaken(path string, from int64) bool {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < from {
		return false
	}
	return strings.Contains(string(b[from:]), "Address already in use")
}

// logPath is the file postgres writes its log to, across restarts.
func (s *Server) logPath() string { return filepath.Join(s.dir, "postgres.log") }

// startOnce starts postgres; exited is closed when it exits.
func (s *Server) startOnce() (exited chan struct{}, err error) {
	logf, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), "-D", s.data, "-p", strconv.Itoa(s.Port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=300",
		"-c", "shared_buffers=16MB", "-c", "log_min_messages=warning")
	cmd.Dir = s.data
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so Kill takes every backend with the
	// postmaster; and killed with the test process if that dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgtest: start postgres: %w", err)
	}
	exited = make(chan struct{})
	s.mu.Lock()
	s.cmd = cmd
	s.exited = exited
	s.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	return exited, nil
}

// URL is the connection URL of database db.
func (s *Server) URL(db string) string {
	return "postgres://postgres@" + s.Addr + "/" + db + "?sslmode=disable"
}

// NewDatabase creates an empty database for t and returns its URL. It is
// dropped when t ends.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	name := s.prefix + strconv.FormatInt(s.seq.Add(1), 10)
	if err := s.exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(func() { _ = s.exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)") })
	return s.URL(name)
}

func (s *Server) exec(sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, sql)
	return err
}

// Kill kills the server and all its backends at once, as a crash would.
// Its data stays; Restart starts it again. Killing twice is harmless.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
	s.cmd = nil
}

// Restart starts a killed server again on the same port and data; it
// recovers from its write-ahead log as after a crash.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Kill()
	if err := s.launch(false); err != nil {
		t.Fatal(err)
	}
}

// Remove kills the server and deletes its files.
func (s *Server) Remove() {
	s.Kill()
	_ = os.RemoveAll(s.dir)
}
