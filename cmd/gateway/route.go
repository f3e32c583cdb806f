package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/wasmhost"
)

// route sends the requests it matches to its upstream, as an Envoy route
// does with its match and cluster. Its host and path are patterns in the
// plugin's own syntax (docs/config.md, "Value syntax"), matched by the
// same code.
type route struct {
	raw  string // as given: [HOST]PATH=URL[ timeout=DURATION][ rewrite=PATH][ host=HOST]
	host string // a host pattern; "" for every host
	path rules.PathPattern
	to   *url.URL
	// timeout is the route's own upstream timeout (0: none), as an
	// Envoy route's timeout; without one (hasTimeout false) the route
	// has --upstream-timeout.
	timeout    time.Duration
	hasTimeout bool
	// rewrite replaces the part of the path the route's path matched (all
	// of an exact path, the prefix of prefix:, the base of /base/**), as
	// an Envoy route's prefix_rewrite; "" keeps the path.
	rewrite string
	// hostRewrite is the Host the upstream gets, as an Envoy route's
	// host_rewrite_literal (an API served by name behind a shared
	// address); "" passes the client's.
	hostRewrite string
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
		return fmt.Errorf("%q: want [HOST]PATH=URL[ timeout=DURATION][ rewrite=PATH][ host=HOST]", v)
	}
	r := route{raw: v}
	target, opts, _ := strings.Cut(target, " ")
	for _, o := range strings.Fields(opts) {
		name, val, _ := strings.Cut(o, "=")
		switch name {
		case "timeout":
			d, err := time.ParseDuration(val)
			if err != nil || d < 0 {
				return fmt.Errorf("%q: timeout %q: want a duration, 0 for none (60s, 1m30s)", v, val)
			}
			r.timeout, r.hasTimeout = d, true
		case "rewrite":
			if err := validRewrite(val); err != nil {
				return fmt.Errorf("%q: rewrite %q: %w", v, val, err)
			}
			r.rewrite = val
		case "host":
			if val == "" || !httpguts.ValidHostHeader(val) {
				return fmt.Errorf("%q: host %q: want a host name, with a port or not", v, val)
			}
			r.hostRewrite = val
		default:
			return fmt.Errorf("%q: unknown option %q (a route takes timeout=DURATION, rewrite=PATH and host=HOST)", v, o)
		}
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
	if r.rewrite != "" && p.Kind != rules.PatternExact && p.Kind != rules.PatternPrefix && p.Kind != rules.PatternSubtree {
		return fmt.Errorf("%q: rewrite: the route's path must say which part is replaced: an exact path, prefix:/PATH or /PATH/**", v)
	}
	r.host, r.path, r.to = host, p, to
	*f = append(*f, r)
	return nil
}

// validRewrite checks a route's rewrite: a path, as it goes on the
// request line (percent-encoded), without a query.
func validRewrite(s string) error {
	if !strings.HasPrefix(s, "/") {
		return errors.New(`want a path starting with "/"`)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f || c == '?' || c == '#' {
			return errors.New("want a path without spaces, control bytes, a query or a fragment")
		}
	}
	if _, err := url.PathUnescape(s); err != nil {
		return err
	}
	return nil
}

// rewritten is r, whose request target is target, as the route sends it
// upstream: with the route's Host (hostRewrite), and with the part of its
// path the route matched replaced by its rewrite and the query kept, as
// Envoy's prefix_rewrite; Envoy puts the original target in
// x-envoy-original-path, and so does the gateway. A rewrite ending in "/"
// before a rest starting with one joins them with one slash. r's URL,
// which the access log reads, is left as it came; its headers get
// x-envoy-original-path, as Envoy's access log sees it.
func (rr *route) rewritten(r *http.Request, target string) *http.Request {
	out := new(http.Request)
	*out = *r
	if rr.hostRewrite != "" {
		out.Host = rr.hostRewrite
	}
	if rr.rewrite == "" {
		return out
	}
	path, query, hasQuery := strings.Cut(target, "?")
	rest := ""
	if rr.path.Kind != rules.PatternExact {
		rest = path[len(rr.path.Text):]
	}
	if strings.HasSuffix(rr.rewrite, "/") && strings.HasPrefix(rest, "/") {
		rest = rest[1:]
	}
	path = rr.rewrite + rest
	u := *r.URL
	u.RawPath = path
	if u.Path, _ = url.PathUnescape(path); u.Path == path {
		u.RawPath = ""
	}
	out.URL, out.RequestURI = &u, path
	if hasQuery {
		out.RequestURI += "?" + query
	}
	r.Header.Set("X-Envoy-Original-Path", target) // out shares r's headers
	return out
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
			if rr.rewrite != "" || rr.hostRewrite != "" {
				r = rr.rewritten(r, path)
			}
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
