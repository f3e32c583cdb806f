package main

import (
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/nettest"
	"github.com/sluicehq/sluice/internal/tlsfiles/tlsfilestest"
)

// runMainEnv makes this test binary run the command (main) instead of
// the tests, for tests of the process as it is started.
const runMainEnv = "SLUICE_TEST_RUN_REDISBRIDGE"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// The running command reads --rls-config again when its file changes,
// without a signal (--watch), as a Kubernetes ConfigMap's
// update needs; its debug port's /rlconfig shows the limits in force.
func TestRun_WatchesRLSConfig(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "ratelimit.yaml")
	write := func(per string) {
		t.Helper()
		if err := os.WriteFile(config, []byte("domain: d\ndescriptors: [{key: k, rate_limit: {unit: hour, requests_per_unit: "+per+"}}]"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("1")
	debug := nettest.FreeAddr(t)
	exited, stderr := startMain(t, "--listen", nettest.FreeAddr(t), "--debug-listen", debug, "--rls-config", config,
		"--watch", "20ms", "--audit-log", filepath.Join(dir, "audit.log"), "--log-level", "error")
	// awaitLimits waits until /rlconfig shows per requests an hour, or
	// the process ends, or the test's own bound passes.
	awaitLimits := func(per string) {
		t.Helper()
		want := "d.k: unit=HOUR requests_per_unit=" + per + ", shadow_mode: false, quota_mode: false\n"
		var got string
		for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			select {
			case err := <-exited:
				t.Fatalf("the bridge exited: %v\n%s", err, stderr.String())
			default:
			}
			res, err := http.Get("http://" + debug + "/rlconfig")
			if err != nil {
				continue // not listening yet
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if got = string(b); got == want {
				return
			}
		}
		t.Fatalf("/rlconfig %q, want %q", got, want)
	}
	awaitLimits("1")
	write("7")
	awaitLimits("7")
}

// startMain runs the command with args and stops it when t ends; exited
// gets its end.
func startMain(t *testing.T, args ...string) (exited <-chan error, stderr *strings.Builder) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	stderr = new(strings.Builder)
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- cmd.Wait()
		close(done) // the cleanup's wait ends too when a test took the error
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-done
	})
	return done, stderr
}

// With mutual TLS on its listener, the bridge's probes and metrics are on
// --health-listen in plain HTTP, and nothing else is: a check there is
// not served. The listener itself refuses a client without a certificate.
// It listens on --listen before the probes answer. A --health-listen port
// in use stops the start, naming the flag.
func TestRun_HealthListen(t *testing.T) {
	dir := t.TempDir()
	ca := tlsfilestest.NewCA(t)
	cert, key := ca.Issue(t, dir, "bridge")
	clientCA := filepath.Join(dir, "clients.pem")
	ca.WriteCert(t, clientCA)
	addrs := nettest.FreeAddrs(t, 2)
	listen, health := addrs[0], addrs[1]
	exited, stderr := startMain(t, "--listen", listen, "--health-listen", health, "--tls-cert", cert, "--tls-key", key,
		"--tls-client-ca", clientCA, "--audit-log", filepath.Join(dir, "audit.log"), "--log-level", "error")
	get := func(method, path string) (int, string, error) {
		req, _ := http.NewRequest(method, "http://"+health+path, strings.NewReader("{}"))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b), nil
	}
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		select {
		case err := <-exited:
			t.Fatalf("the bridge exited: %v\n%s", err, stderr.String())
		default:
		}
		if _, _, err := get("GET", "/healthz"); err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatal("--health-listen never answered")
		}
	}
	// Once the probes answer, --listen accepts: the handshake is what
	// fails, not the connection.
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}}
	defer tr.CloseIdleConnections()
	if res, err := (&http.Client{Transport: tr}).Get("https://" + listen + "/healthz"); err == nil {
		res.Body.Close()
		t.Errorf("--listen without a client certificate: %d, want a failed handshake", res.StatusCode)
	} else if errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("--listen refused the connection while --health-listen answered: %v", err)
	}
	for _, tt := range []struct {
		method, path string
		status       int
		has          string
	}{
		{"GET", "/healthz", 200, `"ok"`},
		{"GET", "/readyz", 200, `"ready"`},
		{"GET", "/healthcheck", 200, `"ready"`},
		{"GET", "/metrics", 200, "sluice_bridge_checks_total"},
		{"POST", "/v1/rate-limit/check", 404, "no such endpoint"},
	} {
		status, body, err := get(tt.method, tt.path)
		if err != nil || status != tt.status || !strings.Contains(body, tt.has) {
			t.Errorf("%s %s on --health-listen: %d %.80q %v, want %d with %q", tt.method, tt.path, status, body, err, tt.status, tt.has)
		}
	}

	exited, stderr = startMain(t, "--listen", nettest.FreeAddr(t), "--health-listen", health, "--audit-log", filepath.Join(dir, "audit2.log"))
	select {
	case err := <-exited:
		if err == nil || !strings.Contains(stderr.String(), "redisbridge: --health-listen: listen tcp "+health) {
			t.Errorf("a second bridge on the same --health-listen: %v, %s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Error("a second bridge on the same --health-listen started")
	}
}
