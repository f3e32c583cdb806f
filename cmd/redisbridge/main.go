// Command redisbridge runs Sluice's check service. Settings come from flags
// and SLUICE_* environment variables; see docs/bridge.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluicehq/sluice/redisbridge"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "redisbridge:", err)
		os.Exit(1)
	}
}

func run() error {
	set, err := redisbridge.ParseSettings(os.Args[1:], os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		redisbridge.Usage(os.Stderr)
		return nil
	}
	if err != nil {
		return err
	}
	srv, err := redisbridge.New(set)
	if err != nil {
		return err
	}
	defer srv.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- srv.ListenAndServe() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	grace, cancel := context.WithTimeout(context.Background(), set.ShutdownGrace)
	defer cancel()
	if err := srv.Shutdown(grace); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return <-done
}
