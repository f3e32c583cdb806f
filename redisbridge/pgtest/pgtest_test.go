package pgtest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

func TestServer_KillRestartKeepsCommits(t *testing.T) {
	s := Shared(t)
	url := s.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "CREATE TABLE x (n int); INSERT INTO x VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	s.Kill()
	if _, err := pgx.Connect(ctx, url); err == nil {
		t.Fatal("connected to a killed server")
	}
	s.Restart(t)
	c, err = pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT n FROM x").Scan(&n); err != nil || n != 42 {
		t.Fatalf("after restart: %d %v", n, err)
	}
}

func TestServer_DatabasesAreSeparate(t *testing.T) {
	s := Shared(t)
	a, b := s.NewDatabase(t), s.NewDatabase(t)
	if a == b {
		t.Fatalf("same database twice: %s", a)
	}
	ctx := context.Background()
	ca, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close(ctx)
	if _, err := ca.Exec(ctx, "CREATE TABLE only_a (n int)"); err != nil {
		t.Fatal(err)
	}
	cb, err := pgx.Connect(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close(ctx)
	if _, err := cb.Exec(ctx, "SELECT * FROM only_a"); err == nil {
		t.Error("table of database a seen in b")
	}
}

// A server whose port is taken between the pick and postgres's bind (by
// another test process starting its own, say) starts on another port.
func TestStart_PortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().(*net.TCPAddr).Port
	pick := freePort
	picks := 0
	freePort = func() (int, error) {
		if picks++; picks == 1 {
			return taken, nil
		}
		return pick()
	}
	defer func() { freePort = pick }()
	s := Start(t)
	if s.Port == taken || picks != 2 {
		t.Fatalf("started on port %d after %d picks; %d was taken", s.Port, picks, taken)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
}
