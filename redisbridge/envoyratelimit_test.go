package redisbridge

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/internal/nettest"
)

// envoyRatelimit is envoyproxy/ratelimit's service at the commit the
// bridge is compared with (the bridge table's rows, and the long test
// that sends both the same calls): the newest the Go module proxy serves.
const envoyRatelimit = "github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36"

// envoyRatelimitBinary builds envoyRatelimit from the Go module proxy;
// Go's build cache makes every build after the first a link.
func envoyRatelimitBinary(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	cmd := exec.Command("go", "install", envoyRatelimit)
	cmd.Env = append(os.Environ(), "GOBIN="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go install %s: %v\n%s", envoyRatelimit, err, out)
	}
	return filepath.Join(dir, "service_cmd")
}

// envoyRatelimitProcess is a running envoyproxy/ratelimit service.
type envoyRatelimitProcess struct {
	grpc, http string // addresses: the rate limit service, and its HTTP port (POST /json)
	debug      string // its debug port (/rlconfig)
	pid        int
	env        []string // its variables, NAME=VALUE
}

// startEnvoyRatelimit starts envoyproxy/ratelimit's service (bin) on
// Redis at redisAddr (or where env's REDIS_URL says, when it is "") with
// the configuration files (by name) and the variables env, and returns it
// once its health service says SERVING.
func startEnvoyRatelimit(tb testing.TB, bin, redisAddr string, files map[string]string, env ...string) envoyRatelimitProcess {
	tb.Helper()
	dir := tb.TempDir()
	writeFiles(tb, filepath.Join(dir, "ratelimit", "config"), files)
	addrs := nettest.FreeAddrs(tb, 3)
	grpcAddr, httpAddr, debugAddr := addrs[0], addrs[1], addrs[2]
	port := func(a string) string { return a[strings.LastIndexByte(a, ':')+1:] }
	cmd := exec.Command(bin)
	if redisAddr != "" {
		env = append([]string{"REDIS_URL=" + redisAddr}, env...)
	}
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "USE_STATSD=false", "LOG_LEVEL=error",
		"REDIS_SOCKET_TYPE=tcp",
		"RUNTIME_ROOT=" + dir, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + port(grpcAddr), "HOST=127.0.0.1", "PORT=" + port(httpAddr),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + port(debugAddr)}, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	tb.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); <-exited })
	health := healthpb.NewHealthClient(grpcConn(tb, grpcAddr))
	for deadline := time.Now().Add(30 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && r.Status == healthpb.HealthCheckResponse_SERVING {
			return envoyRatelimitProcess{grpc: grpcAddr, http: httpAddr, debug: debugAddr, pid: cmd.Process.Pid, env: cmd.Env}
		}
		select {
		case <-exited:
			tb.Fatalf("envoyproxy/ratelimit exited: %s", out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			tb.Fatalf("envoyproxy/ratelimit does not answer: %v, %v\n%s", r, err, out.String())
		}
	}
}

// writeFiles writes files (contents by name) into dir, which it makes.
func writeFiles(tb testing.TB, dir string, files map[string]string) {
	tb.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
}
