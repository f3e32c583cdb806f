package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/wasmhost"
)

// route sends the requests it matches to its upstream, as an Envoy route
// does with its match and cluster. Its host and path are patterns in the
// plugin's own syntax (docs/config.md, "Value syntax"), matched by the
// same code.
type route struct {
	raw  string // as given: [HOST]PATH=URL[ timeout=DURATION]
	host string // a host pattern; "" for every host
	path rules.PathPattern
	to   *url.URL
	// timeout is the route's own upstream timeout (0: none), as an
	// Envoy route's timeout; without one (hasTimeout false) the route
	// has --upstream-timeout.
	timeout    time.Duration
	hasTimeout bool
}

// routeFlag is --route, repeatable: the routes in the order given.
type routeFlag []route

func (f *routeFlag) String() string {
	var parts []string
	for _, r := range *f {
		parts = append(parts, r.raw)
	}
	return strings.Join(parts, ",")
}

func (f *routeFlag) Set(v string) error {
	match, target, ok := strings.Cut(v, "=")
	if !ok || match == "" {
		return fmt.Errorf("%q: want [HOST]PATH=URL[ timeout=DURATION]", v)
	}
	r := route{raw: v}
	target, opts, _ := strings.Cut(target, " ")
	for _, o := range strings.Fields(opts) {
		name, val, _ := strings.Cut(o, "=")
		if name != "timeout" {
			return fmt.Errorf("%q: unknown option %q (a route takes timeout=DURATION)", v, o)
		}
		d, err := time.ParseDuration(val)
		if err != nil || d < 0 {
			return fmt.Errorf("%q: timeout %q: want a duration, 0 for none (60s, 1m30s)", v, val)
		}
		r.timeout, r.hasTimeout = d, true
	}
	host, path := splitRouteMatch(match)
	host = strings.ToLower(host) // as the plugin's match.hosts
	if host != "" {
		if err := rules.ValidHostPattern(host); err != nil {
			return fmt.Errorf("%q: host: %w", v, err)
		}
	}
	p, err := rules.ParsePathPattern(path)
	if err != nil {
		return fmt.Errorf("%q: path: %w", v, err)
	}
	to, err := upstreamURL(target)
	if err != nil {
		return fmt.Errorf("%q: %w", v, err)
	}
	r.host, r.path, r.to = host, p, to
	*f = append(*f, r)
	return nil
}

func (*routeFlag) repeatable() {}

// splitRouteMatch splits a route's [HOST]PATH: a host holds no "/", so
// the path starts at the first "/", or at "prefix:" when that comes
// first.
func splitRouteMatch(m string) (host, path string) {
	if strings.HasPrefix(m, "/") || strings.HasPrefix(m, "prefix:") {
		return "", m
	}
	i := strings.IndexByte(m, '/')
	if j := strings.Index(m, "prefix:/"); j >= 0 && (i < 0 || j < i) {
		i = j
	}
	if i < 0 {
		return m, "" // ParsePathPattern says what is missing
	}
	return m[:i], m[i:]
}

// upstreamURL is the URL of an upstream (--upstream, or a --route's).
func upstreamURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("%q is not an http(s) URL", s)
	}
	return u, nil
}

// errNoUpstream: neither --upstream nor a --route says where requests go.
var errNoUpstream = errors.New("--upstream or --route is required")

// router sends each request to the first route that matches its
// :authority and :path (as the plugin left them), and the others to
// fallback (--upstream). With no fallback, a request no route matches
// gets Envoy's answer when no route matches: 404 with no body, response
// flag NR (source/common/router/router.cc, Filter::decodeHeaders).
type router struct {
	routes   []route
	handlers []http.Handler // by route
	fallback http.Handler   // nil: none
}

func (rt *router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := wasmhost.RequestPath(r)
	for i := range rt.routes {
		rr := &rt.routes[i]
		if (rr.host == "" || rules.MatchHost(rr.host, r.Host)) && rr.path.Match(path) {
			rt.handlers[i].ServeHTTP(w, r)
			return
		}
	}
	if rt.fallback != nil {
		rt.fallback.ServeHTTP(w, r)
		return
	}
	if e := accessEntryOf(w); e != nil {
		e.flags = "NR"
	}
	wasmhost.WriteLocalResponse(w, r, &wasmhost.LocalResponse{Status: http.StatusNotFound, GrpcStatus: -1})
}
