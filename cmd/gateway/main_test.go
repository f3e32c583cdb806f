package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	devnull, _ := os.Open(os.DevNull)
	defer devnull.Close()
	tests := []struct {
		args []string
		err  string
	}{
		{[]string{"--upstream", "http://127.0.0.1:9000", "--cluster", "b=http://127.0.0.1:8081", "--strip-header", "x-user-id"}, ""},
		{[]string{}, "--upstream is required"},
		{[]string{"--upstream", "ftp://x"}, "not an http(s) URL"},
		{[]string{"--upstream", "http://x", "--cluster", "nameonly"}, "NAME=URL"},
		{[]string{"--upstream", "http://x", "--cluster", "b=localhost:1"}, "not an http(s) URL"},
		{[]string{"--upstream", "http://x", "--workers", "0"}, "--workers 0"},
		{[]string{"--upstream", "http://x", "--strip-header", "bad header"}, "not a header name"},
	}
	for _, tc := range tests {
		s, err := parseFlags(tc.args, devnull)
		if tc.err == "" {
			if err != nil || s.clusters["b"] != "http://127.0.0.1:8081" || len(s.strip) != 1 {
				t.Errorf("%v: %v %+v", tc.args, err, s)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.err)
		}
	}
}

func TestHeaderHandling(t *testing.T) {
	var got http.Header
	h := stripHeaders(appendXFF(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r.Header.Clone() })), []string{"X-User-Id"})
	req := httptest.NewRequest("GET", "/", nil)
	req.RemoteAddr = "198.51.100.4:5555"
	req.Header.Set("X-User-Id", "someone-else")
	req.Header.Set("X-Forwarded-For", "6.6.6.6")
	h.ServeHTTP(httptest.NewRecorder(), req)
	if got.Get("X-User-Id") != "" {
		t.Error("client-sent identity header reached the plugin")
	}
	// The peer is appended last, so trusted_proxy_depth 1 picks it, not the spoofed entry.
	if xff := got.Get("X-Forwarded-For"); xff != "6.6.6.6, 198.51.100.4" {
		t.Errorf("X-Forwarded-For: %q", xff)
	}
}
