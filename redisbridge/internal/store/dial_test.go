package store

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/tlsfiles/tlsfilestest"
)

// TestDialRedis: a connection to Redis reads and writes by raw system
// calls (it is no longer the net package's own type) and still exposes its
// socket, which go-redis's pool peeks before reusing a connection, also
// beneath TLS; TLS takes the address's host as the server name when the
// config has none, as go-redis's dialer does, without changing the config,
// and the timeout bounds the handshake too.
func TestDialRedis(t *testing.T) {
	ca := tlsfilestest.NewCA(t)
	certFile, keyFile := ca.Issue(t, t.TempDir(), "redis")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	// echo serves each connection by echoing what it reads, in TLS when
	// conf is set.
	echo := func(conf *tls.Config) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				if conf != nil {
					c = tls.Server(c, conf)
				}
				go func() { defer c.Close(); io.Copy(c, c) }()
			}
		}()
		return ln.Addr().String()
	}
	plain := echo(nil)
	secure := echo(&tls.Config{Certificates: []tls.Certificate{cert}})
	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	fromAddr := &tls.Config{RootCAs: ca.Pool}
	defer func() {
		if fromAddr.ServerName != "" {
			t.Errorf("the caller's TLS config was changed: server name %q", fromAddr.ServerName)
		}
	}()
	raw := runtime.GOOS == "linux"
	for _, tc := range []struct {
		name    string
		addr    string
		tlsConf *tls.Config
		timeout time.Duration
		ok      bool
	}{
		{"plain", plain, nil, time.Second, true},
		// Verifying 127.0.0.1 needs it as the server name: Go refuses a
		// handshake with neither a name nor InsecureSkipVerify.
		{"TLS, the server name from the address", secure, fromAddr, time.Second, true},
		{"TLS, the configured server name", secure, &tls.Config{RootCAs: ca.Pool, ServerName: "localhost"}, time.Second, true},
		{"TLS, a name the certificate lacks", secure, &tls.Config{RootCAs: ca.Pool, ServerName: "other.example"}, time.Second, false},
		{"TLS, an untrusted certificate", secure, &tls.Config{}, time.Second, false},
		{"TLS, no handshake within the timeout", silent.Addr().String(), &tls.Config{RootCAs: ca.Pool}, 100 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan struct{})
			var c net.Conn
			var err error
			go func() {
				defer close(done)
				c, err = dialRedis(context.Background(), tc.timeout, "tcp", tc.addr, tc.tlsConf)
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("dialRedis did not return")
			}
			if (err == nil) != tc.ok {
				t.Fatalf("dialRedis: %v, want success %v", err, tc.ok)
			}
			if err != nil {
				return
			}
			defer c.Close()
			sock := c
			if tc.tlsConf != nil {
				tc, ok := c.(*tls.Conn)
				if !ok {
					t.Fatalf("%T, want *tls.Conn", c)
				}
				sock = tc.NetConn()
			}
			if _, plainType := sock.(*net.TCPConn); plainType == raw {
				t.Errorf("the socket is %T; read and written raw: want %v", sock, raw)
			}
			if _, ok := sock.(syscall.Conn); !ok {
				t.Errorf("the socket (%T) has no SyscallConn", sock)
			}
			if _, err := c.Write([]byte("PING")); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 4)
			if _, err := io.ReadFull(c, got); err != nil || string(got) != "PING" {
				t.Errorf("echoed %q, %v", got, err)
			}
		})
	}
}
