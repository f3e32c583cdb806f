package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSplitRouteMatch(t *testing.T) {
	for _, tt := range []struct{ in, host, path string }{
		{"/api/**", "", "/api/**"},
		{"prefix:/v", "", "prefix:/v"},
		{"api.example.com/v2/**", "api.example.com", "/v2/**"},
		{"*.example.com/", "*.example.com", "/"},
		{"api.example.comprefix:/v", "api.example.com", "prefix:/v"},
		{"[2001:db8::1]/x", "[2001:db8::1]", "/x"},
		{"api.example.com", "api.example.com", ""},
		{"/a/prefix:/b", "", "/a/prefix:/b"},
	} {
		if host, path := splitRouteMatch(tt.in); host != tt.host || path != tt.path {
			t.Errorf("%q: %q %q, want %q %q", tt.in, host, path, tt.host, tt.path)
		}
	}
}

// Requests go to the upstream of the first route that matches their
// authority and path, in the order given, else to --upstream; with no
// --upstream, Envoy's 404 (flag NR, gRPC's UNIMPLEMENTED to a gRPC
// client).
func TestNewHandler_Routes(t *testing.T) {
	upstream := func(name string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s %s", name, r.URL.RequestURI())
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	a, b, c, d := upstream("a"), upstream("b"), upstream("c"), upstream("d")
	var routes routeFlag
	for _, r := range []string{"/api/**=" + a, "admin.example.com/**=" + b, "prefix:/static=" + b, "*.example.com/v2/*/items=" + c} {
		if err := routes.Set(r); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		host, path string
		want       string // the answer: upstream and path, or "404"
	}{
		{"gw", "/api/x?q=1", "a /api/x?q=1"},
		{"gw", "/api", "a /api"},
		{"admin.example.com:8080", "/api/x", "a /api/x"}, // the first route that matches
		{"admin.example.com", "/other", "b /other"},
		{"ADMIN.example.com.", "/other", "b /other"},
		{"gw", "/static.css", "b /static.css"},
		{"x.example.com", "/v2/7/items", "c /v2/7/items"},
		{"example.com", "/v2/7/items", "404"}, // *.example.com is its subdomains
		{"gw", "/apix", "404"},                // /api/** ends at a segment
		{"x.example.com", "/v2/7/8/items", "404"},
	}
	for _, fallback := range []string{"", d} {
		t.Run("fallback "+fallback, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "access.log")
			format, _ := accessFormatFrom("%REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_FLAGS% %UPSTREAM_HOST%\n", "")
			alog, err := openAccessLog(path, format, discardLogger())
			if err != nil {
				t.Fatal(err)
			}
			var up *url.URL
			if fallback != "" {
				up = mustURL(t, fallback)
			}
			h, served := whenServed(newHandler(up, nil, alog, discardLogger(), settings{routes: routes}))
			gw := serveGateway(t, h)
			var wantLog []string
			for _, tc := range cases {
				req, _ := http.NewRequest("GET", "http://"+gw+tc.path, nil)
				req.Host = tc.host
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				<-served
				want, status, flag := tc.want, 200, "-"
				if want == "404" && fallback == "" {
					want, status, flag = "", 404, "NR"
				} else if want == "404" {
					want = "d " + tc.path
				}
				to := "-" // the upstream host in the log
				if want != "" {
					to = strings.TrimPrefix(map[byte]string{'a': a, 'b': b, 'c': c, 'd': d}[want[0]], "http://")
				}
				if res.StatusCode != status || string(body) != want {
					t.Errorf("%s %s: %d %q, want %d %q", tc.host, tc.path, res.StatusCode, body, status, want)
				}
				wantLog = append(wantLog, fmt.Sprintf("%s %d %s %s", tc.path, status, flag, to))
			}
			// A gRPC client gets gRPC's answer to a path no route has.
			req, _ := http.NewRequest("POST", "http://"+gw+"/pkg.Svc/Call", strings.NewReader("\x00\x00\x00\x00\x00"))
			req.Header.Set("Content-Type", "application/grpc")
			if res, err := http.DefaultClient.Do(req); err != nil {
				t.Fatal(err)
			} else if res.Body.Close(); fallback == "" && (res.StatusCode != 200 || res.Header.Get("Grpc-Status") != "12") {
				t.Errorf("gRPC with no route: %d grpc-status %q, want 200 and 12 (UNIMPLEMENTED)", res.StatusCode, res.Header.Get("Grpc-Status"))
			}
			<-served
			if err := alog.Close(); err != nil {
				t.Fatal(err)
			}
			data, _ := os.ReadFile(path)
			lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
			if got := strings.Join(lines[:len(lines)-1], "\n"); got != strings.Join(wantLog, "\n") {
				t.Errorf("access log:\n%s\nwant:\n%s", got, strings.Join(wantLog, "\n"))
			}
		})
	}
}

// The route is chosen by the :path the plugin left, as Envoy chooses it
// after a filter changed the request's headers.
func TestRouter_PathThePluginLeft(t *testing.T) {
	var routes routeFlag
	if err := routes.Set("/new/**=http://127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	var got string
	rt := &router{routes: routes, handlers: []http.Handler{http.HandlerFunc(func(http.ResponseWriter, *http.Request) { got = "routed" })}}
	r := httptest.NewRequest("GET", "/old/x", nil)
	r.RequestURI = "/new/x" // as wasmhost.Middleware sets it when the plugin replaced :path
	rec := httptest.NewRecorder()
	rt.ServeHTTP(rec, r)
	if got != "routed" {
		t.Errorf("answered %d, want the /new/** route", rec.Code)
	}
}

func TestRouteFlag_Set(t *testing.T) {
	for _, tc := range []struct {
		in         string
		timeout    time.Duration
		hasTimeout bool
	}{
		{"/a/**=http://x", 0, false},
		{"/a/**=http://x timeout=90s", 90 * time.Second, true},
		{"/a/**=http://x  timeout=1m30s ", 90 * time.Second, true},
		{"/a/**=http://x timeout=0", 0, true},
		{"/a/**=http://x rewrite=/b timeout=5s", 5 * time.Second, true},
	} {
		var f routeFlag
		if err := f.Set(tc.in); err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if r := f[0]; r.timeout != tc.timeout || r.hasTimeout != tc.hasTimeout || r.to.String() != "http://x" || r.raw != tc.in {
			t.Errorf("%q: timeout %v (given %v), to %s, raw %q; want %v (%v)", tc.in, r.timeout, r.hasTimeout, r.to, r.raw, tc.timeout, tc.hasTimeout)
		}
	}
}

// A route's rewrite= replaces the part of the path its path matched, and
// keeps the rest and the query, as Envoy's prefix_rewrite; the upstream
// gets the original target in X-Envoy-Original-Path. Its host= is the Host
// the upstream gets, as Envoy's host_rewrite_literal. A route without
// either passes the path and the client's Host as they came.
func TestNewHandler_RouteRewrite(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s from %q", r.Host, r.RequestURI, r.Header.Get("X-Envoy-Original-Path"))
	}))
	t.Cleanup(srv.Close)
	var f routeFlag
	for _, r := range []string{"prefix:/api/v1=URL rewrite=/v1", "/old/**=URL rewrite=/new", "/root/**=URL rewrite=/",
		"/exact=URL rewrite=/other", "/keep/**=URL", "/ext/**=URL host=api.example.com", "/both/**=URL rewrite=/v2 host=b.example:8443"} {
		if err := f.Set(strings.Replace(r, "URL", srv.URL, 1)); err != nil {
			t.Fatal(err)
		}
	}
	gw := serveGateway(t, newHandler(nil, nil, nil, discardLogger(), settings{routes: f}))
	for _, tc := range []struct{ path, want string }{
		{"/api/v1/items?x=1", `client.example /v1/items?x=1 from "/api/v1/items?x=1"`},
		{"/api/v1x", `client.example /v1x from "/api/v1x"`}, // a raw prefix, as Envoy's
		{"/old", `client.example /new from "/old"`},
		{"/old/a/b", `client.example /new/a/b from "/old/a/b"`},
		{"/old/a%2Fb%20c", `client.example /new/a%2Fb%20c from "/old/a%2Fb%20c"`},
		{"/root/a?q", `client.example /a?q from "/root/a?q"`},
		{"/root", `client.example / from "/root"`},
		{"/exact?q=2", `client.example /other?q=2 from "/exact?q=2"`},
		{"/keep/x", `client.example /keep/x from ""`},
		{"/ext/a?q", `api.example.com /ext/a?q from ""`},
		{"/both/a", `b.example:8443 /v2/a from "/both/a"`},
	} {
		req, _ := http.NewRequest("GET", "http://"+gw+tc.path, nil)
		req.Host = "client.example"
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if string(b) != tc.want {
			t.Errorf("%s: upstream got %s, want %s", tc.path, b, tc.want)
		}
	}
}

// A route's timeout= replaces --upstream-timeout for the requests it
// routes, the others keep it: a route's shorter one answers 504 while
// --upstream-timeout (a minute) is far off, and a route's longer one, or
// its 0 (none), waits for an upstream that answers after a request with
// --upstream-timeout's 200 ms, sent later, got its 504.
func TestNewHandler_RouteTimeout(t *testing.T) {
	arrived := make(chan string, 4)
	release := make(chan struct{})
	u := startRawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request, _ []byte) bool {
		arrived <- req.URL.Path
		select {
		case <-release:
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate")
		case <-t.Context().Done():
		}
		return false
	})
	up := mustURL(t, "http://"+u.addr)
	gateway := func(timeout time.Duration, routes ...string) string {
		var f routeFlag
		for _, r := range routes {
			if err := f.Set(strings.Replace(r, "URL", up.String(), 1)); err != nil {
				t.Fatal(err)
			}
		}
		return serveGateway(t, newHandler(up, nil, nil, discardLogger(), settings{upstreamTimeout: timeout, routes: f}))
	}
	get := func(addr, path string) string {
		res, err := (&http.Client{Timeout: 30 * time.Second}).Get("http://" + addr + path) // the test's own bound
		if err != nil {
			return err.Error()
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return fmt.Sprintf("%d %s", res.StatusCode, b)
	}

	short := gateway(time.Minute, "/short/**=URL timeout=200ms")
	if got := get(short, "/short/x"); got != "504 upstream request timeout" {
		t.Errorf("a route's 200 ms under a --upstream-timeout of 1m: %s, want 504", got)
	}
	<-arrived

	long := gateway(200*time.Millisecond, "/long/**=URL timeout=1m", "/none/**=URL timeout=0")
	answers := make(chan string, 2)
	for _, path := range []string{"/long/x", "/none/x"} {
		go func() { answers <- path + ": " + get(long, path) }()
		<-arrived // at the upstream before the request below leaves
	}
	if got := get(long, "/other"); got != "504 upstream request timeout" {
		t.Errorf("no route, --upstream-timeout 200ms: %s, want 504", got)
	}
	<-arrived
	close(release)
	for range 2 {
		if got := <-answers; !strings.HasSuffix(got, ": 200 late") {
			t.Errorf("%s, want 200 late", got)
		}
	}
}
