package envoyhosts

import (
	"slices"
	"strings"
	"testing"
)

func TestHosts_Table(t *testing.T) {
	hosts := Hosts()
	if len(hosts) < 2 || hosts[0].Envoy != "1.33" || hosts[0].Releases() != "Envoy 1.33–1.38 (Istio 1.25–1.30)" || hosts[1].Releases() != "Envoy 1.39+ (Istio 1.31+)" {
		t.Fatalf("hosts: %+v", hosts)
	}
	// Envoy 1.33's WASI, as its host library c4d7bb0 registers it.
	want := []string{"args_get", "args_sizes_get", "clock_time_get", "environ_get", "environ_sizes_get",
		"fd_close", "fd_fdstat_get", "fd_fdstat_set_flags", "fd_prestat_dir_name", "fd_prestat_get",
		"fd_read", "fd_seek", "fd_write", "path_open", "poll_oneoff", "proc_exit", "random_get", "sched_yield"}
	for _, mod := range []string{"wasi_snapshot_preview1", "wasi_unstable"} {
		if got := hosts[0].Imports[mod]; !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", mod, got, want)
		}
	}
	// Each host provides at least what the one before it does.
	for i := 1; i < len(hosts); i++ {
		for mod, names := range hosts[i-1].Imports {
			for _, n := range names {
				if !hosts[i].Provides(mod, n) {
					t.Errorf("%s lacks %s.%s, which %s provides", hosts[i].Releases(), mod, n, hosts[i-1].Releases())
				}
			}
		}
	}
}

func TestLacking(t *testing.T) {
	got := Lacking([]string{"env.proxy_log", "wasi_snapshot_preview1.fd_write", "wasi_snapshot_preview1.path_filestat_get", "env.proxy_nothing"})
	if len(got) != 2 ||
		!strings.HasPrefix(got[0], "wasi_snapshot_preview1.path_filestat_get is not provided by Envoy 1.33–1.38 (Istio 1.25–1.30)") ||
		!strings.HasPrefix(got[1], "env.proxy_nothing is not provided by Envoy 1.33–1.38") {
		t.Fatalf("Lacking = %q", got)
	}
}
