// Command redisbridge runs Sluice's check service. Settings come from flags
// and SLUICE_* environment variables; see docs/bridge.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/redisbridge"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "redisbridge:", err)
		os.Exit(1)
	}
}

func run() error {
	args := os.Args[1:]
	if filepath.Base(os.Args[0]) == "ratelimit" {
		// Run as envoyproxy/ratelimit's binary (the image's
		// /bin/ratelimit), by a deployment that gives it that service's
		// variables and no flags: Envoy Gateway's.
		args = append([]string{"--envoy-ratelimit-env"}, args...)
	}
	set, err := redisbridge.ParseSettings(args, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		redisbridge.Usage(os.Stderr)
		return nil
	}
	if err != nil {
		return err
	}
	if set.ValidateOnly {
		if err := set.CheckFiles(); err != nil {
			return err
		}
		fmt.Fprintln(os.Stderr, "redisbridge: settings valid")
		return nil
	}
	srv, err := redisbridge.New(set)
	if err != nil {
		return err
	}
	defer srv.Close()
	ln, err := srv.Listen() // before the probes answer: ready means checks are accepted
	if err != nil {
		return err
	}
	defer ln.Close() // when the start fails below; Serve closes it otherwise
	for _, addr := range set.HealthAddrs() {
		// Listened on before serving, so a port in use stops the start:
		// without it the probes would fail with nothing saying why.
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("--health-listen: %w", err)
		}
		health := &http.Server{Handler: srv.HealthHandler(), ReadHeaderTimeout: 5 * time.Second}
		defer health.Close()
		go health.Serve(ln)
	}
	if set.DebugListen != "" {
		go serveDebug(set.DebugListen, srv.RLSConfigHandler())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP) // reread --rls-config, the TLS pair and the client CAs; the server logs how that went
	defer signal.Stop(hup)
	var watch <-chan time.Time // reread the files that changed
	if (set.RLSConfig != "" || set.TLSCert != "") && set.Watch > 0 {
		t := time.NewTicker(set.Watch)
		defer t.Stop()
		watch = t.C
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
wait:
	for {
		select {
		case err := <-done:
			return err
		case <-hup:
			_ = srv.Reload()
		case <-watch:
			_ = srv.ReloadChanged()
		case <-ctx.Done():
			break wait
		}
	}
	grace, cancel := context.WithTimeout(context.Background(), set.ShutdownGrace)
	defer cancel()
	if err := srv.Shutdown(grace); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return <-done
}

// serveDebug serves the pprof handlers, and the rate limit service's
// limits at /rlconfig as envoyproxy/ratelimit's debug port does, on their
// own listener, so neither is ever reachable through the check port.
func serveDebug(addr string, rlconfig http.Handler) {
	mux := http.NewServeMux()
	mux.Handle("GET /rlconfig", rlconfig)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	if err := http.ListenAndServe(addr, mux); err != nil {
		fmt.Fprintln(os.Stderr, "redisbridge: --debug-listen:", err)
	}
}
