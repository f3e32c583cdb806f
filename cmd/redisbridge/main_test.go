package main

import (
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
	cmd := exec.Command(os.Args[0], "--listen", nettest.FreeAddr(t), "--debug-listen", debug, "--rls-config", config,
		"--watch", "20ms", "--audit-log", filepath.Join(dir, "audit.log"), "--log-level", "error")
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-exited
	}()
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
