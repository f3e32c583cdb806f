package pgtest

import (
	"context"
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
