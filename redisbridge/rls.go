package redisbridge

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/grpcwire"
	"github.com/sluicehq/sluice/redisbridge/internal/checkio"
	"github.com/sluicehq/sluice/redisbridge/internal/h2fast"
	"github.com/sluicehq/sluice/redisbridge/internal/rls"
	"github.com/sluicehq/sluice/rules"
)

// This file is Envoy's rate limit service (envoy.service.ratelimit.v3),
// which Envoy's own rate limit filter (envoy.filters.http.ratelimit), and
// the gateways built on it, call with a request's descriptors. Each
// descriptor finds its limit in the --rls-config files, as in
// envoyproxy/ratelimit; the limits of one call are then decided by the
// check core, together and all-or-nothing, as a fixed window per unit.

// rlsPath is the gRPC method's path (h2fast serves it too).
const rlsPath = h2fast.RLSPath

// gRPC status codes the service answers with.
const (
	grpcInvalidArgument = 3
	grpcNotFound        = 5
	grpcUnimplemented   = 12
	grpcUnavailable     = 14
	grpcUnauthenticated = 16
)

// rlsError is a call's failure: a gRPC status and its message.
type rlsError struct {
	code int
	msg  string
}

// handleRLS is ShouldRateLimit's net/http transport (h2, and h2c streams
// the fast path hands over): it checks what only net/http lets through
// (HTTP/1.1, another content type) and calls serveRLS, as the h2c fast
// path does for the calls it takes.
func (s *Server) handleRLS(w http.ResponseWriter, r *http.Request) {
	out := outPool.Get().(*checkio.Response)
	defer outPool.Put(out)
	out.Reset()
	if e := grpcTransport(r); e != nil {
		rlsFail(out, e)
	} else {
		bp := bufPool.Get().(*[]byte)
		defer bufPool.Put(bp)
		body, err := readAll(w, r, (*bp)[:0])
		*bp = body
		in := checkio.Request{Authorization: headerBytes(r, "Authorization"), RequestID: []byte(requestID(r)), Body: body, BodyErr: err,
			GRPCTimeout: headerBytes(r, "Grpc-Timeout")}
		s.serveRLS(r.Context(), &in, out)
	}
	writeResponse(w, out)
}

// serveRLS answers a ShouldRateLimit call, whatever transport brought it:
// the answer's message and the status in its trailers, or a status alone
// (trailers only) when the call fails.
func (s *Server) serveRLS(ctx context.Context, in *checkio.Request, out *checkio.Response) {
	start := time.Now()
	id := callID(in, out)
	var req rls.Request
	reply, e := s.shouldRateLimit(ctx, in, &req, id, start)
	if e != nil {
		rlsFail(out, e)
		return
	}
	res := s.rlsResponse(&req, reply)
	grpcAnswer(out, func(b []byte) []byte { return rls.AppendResponse(b, &res) })
	s.m.checkDur.Observe(time.Since(start).Seconds())
}

// rlsResponse is the answer to req, with the RateLimit headers and the
// dynamic metadata the settings ask for.
func (s *Server) rlsResponse(req *rls.Request, reply *rlsReply) rls.Response {
	res := rls.Response{Overall: reply.overall, Statuses: reply.statuses}
	if s.set.RLSResponseHeaders {
		res.Headers, res.HeaderNames = reply.closest(), s.rlsHeaders
	}
	if s.set.RLSResponseMetadata {
		res.Metadata = reply.metadata(req)
	}
	return res
}

// handleRLSJSON is POST /json's net/http transport: ShouldRateLimit in
// JSON, as envoyproxy/ratelimit serves it on its HTTP port, for callers
// without gRPC (serveRLSJSON).
func (s *Server) handleRLSJSON(w http.ResponseWriter, r *http.Request) {
	s.serveHTTP(w, r, (*Server).serveRLSJSON)
}

// serveRLSJSON answers a ShouldRateLimit call in protobuf's JSON mapping:
// decided as a gRPC call is, with --check-token, and answered in the same
// mapping with 200, or 429 when refused. Its errors are the bridge's
// envelope: a request that does not read is a 400 naming the field at
// fault, a store that does not answer a 503 (envoyproxy/ratelimit answers
// both 400, with no body to speak of).
func (s *Server) serveRLSJSON(ctx context.Context, in *checkio.Request, out *checkio.Response) {
	start := time.Now()
	id, ok := s.admit(in, out)
	if !ok {
		return
	}
	if s.rls.Load() == nil { // whatever the body: it would not be read
		rlsJSONError(s.noRLSConfig()).writeTo(out, id)
		return
	}
	var req rls.Request
	if err := rls.DecodeJSONRequest(in.Body, &req); err != nil {
		s.m.checkInvalid.Inc()
		var je *rls.JSONError
		if errors.As(err, &je) {
			invalid(codeInvalidInput, je.Field, je.Reason).writeTo(out, id)
		} else {
			invalid(codeInvalidInput, "body", err.Error()).writeTo(out, id)
		}
		return
	}
	reply, e := s.decideRLS(ctx, &req, id, start.Add(s.set.RedisTimeout))
	if e != nil {
		rlsJSONError(e).writeTo(out, id)
		return
	}
	res := s.rlsResponse(&req, reply)
	out.Status = http.StatusOK
	if reply.overall == rls.CodeOverLimit {
		out.Status = http.StatusTooManyRequests
	}
	out.Set("Content-Type", "application/json")
	out.Body = rls.AppendResponseJSON(out.Body, &res)
	s.m.checkDur.Observe(time.Since(start).Seconds())
}

// RLSConfigHandler answers with the rate limit service's limits in force,
// a line each, as envoyproxy/ratelimit's /rlconfig on its debug port
// does (rls.Config.Dump); 404 without --rls-config.
func (s *Server) RLSConfigHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cfg := s.rls.Load()
		if cfg == nil {
			e := s.noRLSConfig()
			http.Error(w, e.msg, rlsJSONError(e).status) // 404, or 503 while --rls-xds has given none yet
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, cfg.Dump())
	})
}

// rlsJSONError is the bridge's envelope for a call /json could not
// decide: 404 without --rls-config, 503 while the store does not answer,
// 400 for the rest, which the call is at fault for.
func rlsJSONError(e *rlsError) *apiError {
	switch e.code {
	case grpcUnimplemented:
		return &apiError{http.StatusNotFound, codeNotFound, "path", e.msg}
	case grpcUnavailable:
		return &apiError{http.StatusServiceUnavailable, codeServiceUnavailable, "", e.msg}
	}
	return invalid(codeInvalidInput, "body", e.msg)
}

// healthPath is the gRPC health service's Check, which Envoy's
// grpc_health_check calls on a cluster's hosts.
const healthPath = "/grpc.health.v1.Health/Check"

// rlsService is the rate limit service's name, as a health check asks
// about it.
const rlsService = "envoy.service.ratelimit.v3.RateLimitService"

// handleHealth answers grpc.health.v1.Health/Check: SERVING while the
// store answers and the rate limit service has a configuration to decide
// by (rlsWaiting), else NOT_SERVING; for the server ("") and,
// with --rls-config, for the rate limit service; NOT_FOUND for any other
// service, as the health protocol says. So an Envoy cluster that checks
// the bridge with grpc_health_check, as clusters of envoyproxy/ratelimit
// often do, finds it healthy.
func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	out := outPool.Get().(*checkio.Response)
	defer outPool.Put(out)
	out.Reset()
	defer writeResponse(w, out)
	if e := grpcTransport(r); e != nil {
		rlsFail(out, e)
		return
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	body, err := readAll(w, r, (*bp)[:0])
	*bp = body
	if err != nil {
		rlsFail(out, &rlsError{grpcInvalidArgument, "reading the request: " + err.Error()})
		return
	}
	msg, e := grpcMessage(body)
	if e != nil {
		rlsFail(out, e)
		return
	}
	service, err := rls.DecodeHealthRequest(msg)
	switch {
	case err != nil:
		rlsFail(out, &rlsError{grpcInvalidArgument, "the request message: " + err.Error()})
		return
	case service != "" && (service != rlsService || !s.servesRLS()):
		rlsFail(out, &rlsError{grpcNotFound, "unknown service " + service})
		return
	}
	health := rls.Serving
	if err := s.store.Ping(r.Context()); err != nil {
		s.storeFailed("ping", err)
		health = rls.NotServing
	}
	if s.rlsWaiting() {
		health = rls.NotServing
	}
	grpcAnswer(out, func(b []byte) []byte { return rls.AppendHealthResponse(b, health) })
}

// rlsFail makes out the trailers-only answer of a failed call.
func rlsFail(out *checkio.Response, e *rlsError) {
	out.Status = http.StatusOK
	out.Set("Content-Type", "application/grpc")
	out.Set("Grpc-Status", strconv.Itoa(e.code))
	out.Set("Grpc-Message", grpcwire.Message([]byte(e.msg)))
}

// reloadRLS reads --rls-config again; unless always, only when a file
// was added, removed or changed since it last looked. Calls decided
// meanwhile use the configuration they started with; a configuration
// refused leaves the running one in place, and the error says why (files
// refused, or a directory that could not be read, are logged once, not
// at every look). Counters are kept: a limit whose number changed goes
// on from its count, one whose unit changed starts a counter of its own.
func (s *Server) reloadRLS(always bool) error {
	if s.set.RLSConfig == "" {
		return nil
	}
	s.rlsMu.Lock()
	defer s.rlsMu.Unlock()
	files, err := rls.ReadFiles(s.set.RLSConfig)
	if err != nil {
		err = fmt.Errorf("--rls-config: %w", err)
	}
	if !s.rlsSeen.Note(files, err) && !always {
		return nil
	}
	var cfg *rls.Config
	if err == nil {
		cfg, err = s.set.parseRLS(files)
	}
	if err != nil {
		s.log.Error("rate limit service configuration refused; the running one stays", "err", err)
		return err
	}
	s.rls.Store(cfg)
	s.log.Info("rate limit service configuration reloaded", "file", s.set.RLSConfig, "domains", cfg.Domains())
	return nil
}

// watchXDS runs the --rls-xds client until ctx ends: each response's
// RateLimitConfig resources replace the configuration, as an edited
// --rls-config does; a response refused leaves the running one in place,
// and the server is told why (a NACK) as well as the log.
func (s *Server) watchXDS(ctx context.Context, tlsConfig *tls.Config) {
	u, _ := url.Parse(s.set.RLSXDS) // checked by Validate, as are the two below
	md, _ := s.set.xdsNodeMetadata()
	headers, _ := s.set.xdsHeaders()
	ads := &rls.ADS{URL: u, TLS: tlsConfig, NodeID: s.set.RLSXDSNodeID, NodeMetadata: md, Headers: headers,
		TypeURL: rls.XDSTypeURL, Logger: s.log,
		Apply: func(version string, resources [][]byte) error {
			s.rlsMu.Lock()
			defer s.rlsMu.Unlock()
			cfg, err := rls.ParseXDS(resources, s.set.RLSMergeDomainConfig)
			if err != nil {
				s.m.rlsConfigUpdates.WithLabelValues("refused").Inc()
				return fmt.Errorf("--rls-xds: %w", err)
			}
			s.rls.Store(cfg)
			s.m.rlsConfigUpdates.WithLabelValues("applied").Inc()
			s.log.Info("rate limit service configuration from the xDS server", "server", s.set.RLSXDS, "version", version, "domains", cfg.Domains())
			return nil
		}}
	ads.Run(ctx)
}

// rlsReply is a call's answer.
type rlsReply struct {
	overall  rls.Code
	statuses []rls.Status
}

// metadata is the answer's dynamic metadata: req's, and the metadata of
// the limits that were not over, merged in the descriptors' order (a
// descriptor not decided carries no limit, and so none).
func (r *rlsReply) metadata(req *rls.Request) *rls.Metadata {
	m := &rls.Metadata{Request: req}
	for i := range r.statuses {
		if st := &r.statuses[i]; st.Code == rls.CodeOK && st.Limit != nil && st.Limit.Metadata != nil {
			m.Merged = rls.MergeMetadata(m.Merged, st.Limit.Metadata)
		}
	}
	return m
}

// closest is the status the answer's RateLimit headers speak of, as
// envoyproxy/ratelimit picks it: the last over its limit, else the first
// with the least remaining; nil when no descriptor has a limit.
func (r *rlsReply) closest() *rls.Status {
	var c *rls.Status
	for i := range r.statuses {
		st := &r.statuses[i]
		switch {
		case st.Limit == nil:
		case st.Code == rls.CodeOverLimit:
			c = st
		case c == nil || c.Code != rls.CodeOverLimit && st.Remaining < c.Remaining:
			c = st
		}
	}
	return c
}

// shouldRateLimit reads the call's request into req, decides it as the
// check id, and makes its answer.
func (s *Server) shouldRateLimit(ctx context.Context, in *checkio.Request, req *rls.Request, id string, start time.Time) (*rlsReply, *rlsError) {
	if in.BodyErr != nil {
		s.m.checkInvalid.Inc()
		return nil, &rlsError{grpcInvalidArgument, "reading the request: " + in.BodyErr.Error()}
	}
	if e := s.authorizeCheck(in.Authorization); e != nil {
		return nil, &rlsError{grpcUnauthenticated, e.reason}
	}
	if e := readGRPCRequest(in.Body, req); e != nil {
		s.m.checkInvalid.Inc()
		return nil, e
	}
	deadline := start.Add(s.set.RedisTimeout)
	if d, ok := grpcTimeout(in.GRPCTimeout); ok && start.Add(d).Before(deadline) {
		deadline = start.Add(d)
	}
	return s.decideRLS(ctx, req, id, deadline)
}

// decideRLS decides the ShouldRateLimit request req as the check id, by
// deadline, and makes its answer, whatever form the request came in.
func (s *Server) decideRLS(ctx context.Context, req *rls.Request, id string, deadline time.Time) (*rlsReply, *rlsError) {
	plan, e := s.rlsPlan(req)
	if e != nil {
		s.m.checkInvalid.Inc()
		return nil, e
	}
	plan.check.RequestID = id
	reply := &rlsReply{overall: rls.CodeOK, statuses: make([]rls.Status, len(req.Descriptors))}
	for i := range reply.statuses {
		reply.statuses[i].Code = rls.CodeOK
	}
	for _, i := range plan.unlimited {
		reply.statuses[i].Remaining = math.MaxUint32 // as envoyproxy/ratelimit says it
	}
	// A limit of 0 refuses the call, as in envoyproxy/ratelimit, and then
	// nothing is counted: the other descriptors are not decided, so their
	// statuses carry no limit. In shadow mode it is reported only; in
	// quota mode, it is a quota limit that is over, and the call's other
	// quota limits, if it has any, decide. Its reset is the end of its
	// window, as there, by the bridge's clock: no store call is made.
	refused := false
	for _, z := range plan.zero {
		st := &reply.statuses[z.descriptor]
		st.Limit, st.UntilReset = z.limit, untilWindowEnd(z.limit, s.nowMS())
		if !z.limit.ShadowMode {
			st.Code = rls.CodeOverLimit // said even under --rls-shadow-mode
		}
		if z.limit.ShadowMode || s.set.RLSShadowMode {
			s.m.decision("log_only_denied", rules.FixedWindow, z.limit.MetricName()).Inc()
			continue
		}
		s.m.decision("denied", rules.FixedWindow, z.limit.MetricName()).Inc()
		if !z.quota || !plan.hasQuota() {
			refused = true
		}
	}
	if refused {
		reply.overall = rls.CodeOverLimit
		s.m.checkDenied.Inc()
		return reply, nil
	}
	if len(plan.check.Limits) == 0 {
		return reply, nil
	}
	if s.spent != nil && s.refuseSpent(plan, reply) {
		return reply, nil
	}
	var resp rules.CheckResponse
	if err := s.decide(ctx, deadline, &plan.check, &resp); err != nil {
		return nil, &rlsError{grpcUnavailable, storeError(err).reason}
	}
	if !resp.Allowed {
		reply.overall = rls.CodeOverLimit
	}
	for i, d := range resp.Decisions {
		l, lr := plan.limits[i], &plan.check.Limits[i]
		untilReset := untilWindowEnd(l, resp.NowMS)
		remaining := plan.statuses(i, &d, resp.Allowed, func(descriptor int, l *rls.Limit, over bool, remaining int64) {
			st := &reply.statuses[descriptor]
			st.Limit, st.UntilReset = l, untilReset
			st.Remaining = uint32(min(max(remaining, 0), l.RequestsPerUnit, 1<<32-1))
			if over && !l.ShadowMode {
				st.Code = rls.CodeOverLimit
			}
		})
		if s.spent != nil && remaining <= 0 && refusesAlone(lr) && untilReset > 0 {
			s.spent.add(lr.Key, lr.Spec.Limit, untilReset)
		}
	}
	return reply, nil
}

// refuseSpent refuses the call, as its store call would, when one of its
// limits that can refuse it alone has nothing left by the over-limit
// cache. As with a limit of 0, nothing is counted, and the statuses of
// the other descriptors carry no limit.
func (s *Server) refuseSpent(plan *rlsPlanned, reply *rlsReply) bool {
	for i := range plan.check.Limits {
		lr := &plan.check.Limits[i]
		if !refusesAlone(lr) {
			continue
		}
		if until, ok := s.spent.spent(lr.Key, lr.Spec.Limit); ok {
			plan.listings(i, func(descriptor int, l *rls.Limit, _ int64) {
				st := &reply.statuses[descriptor]
				st.Code, st.Limit, st.UntilReset = rls.CodeOverLimit, l, until
			})
			reply.overall = rls.CodeOverLimit
			s.m.decision("denied", rules.FixedWindow, lr.Rule).Inc()
			s.m.checkDenied.Inc()
			s.m.overLimitCacheHits.Inc()
			return true
		}
	}
	return false
}

// untilWindowEnd is the time from now (unix ms) to the end of l's
// window, which ends on a multiple of its length from the epoch.
func untilWindowEnd(l *rls.Limit, now int64) time.Duration {
	window := l.WindowMS()
	return time.Duration(window-now%window) * time.Millisecond
}

// nowMS is the bridge's clock in unix ms: Settings.Now, or the system's.
func (s *Server) nowMS() int64 {
	if s.set.Now != nil {
		return s.set.Now()
	}
	return time.Now().UnixMilli()
}

// refusesAlone tells whether a limit with nothing left refuses its call
// by itself: not log-only, and not one of the call's quota limits. Only
// such limits are kept in, and refuse from, the over-limit cache.
func refusesAlone(lr *rules.LimitRequest) bool { return !lr.LogOnly && !lr.Quota }

// rlsPlanned is a call's check: the limits its descriptors have, and for
// each, the descriptors it is of.
type rlsPlanned struct {
	check  rules.CheckRequest
	limits []*rls.Limit
	// descriptor is, by limit, the first descriptor of the call that
	// counts in it; more are the others, when several descriptors make
	// one counter (mergeListings), in the call's order.
	descriptor []int
	more       []listing
	zero       []zeroLimit // limits of 0, which refuse every call
	unlimited  []int       // the descriptors whose limit is unlimited
}

// listing is a descriptor that counts in limit of (an index of the
// check's limits) beside its first: its own limit and cost.
type listing struct {
	of, descriptor int
	limit          *rls.Limit
	cost           int64
}

// listings calls f with each descriptor that counts in limit i, its own
// limit and its cost, in the call's order.
func (p *rlsPlanned) listings(i int, f func(descriptor int, l *rls.Limit, cost int64)) {
	first := p.check.Limits[i].Spec.Cost
	for _, m := range p.more {
		if m.of == i {
			first -= m.cost
		}
	}
	f(p.descriptor[i], p.limits[i], first)
	for _, m := range p.more {
		if m.of == i {
			f(m.descriptor, m.limit, m.cost)
		}
	}
}

// statuses works out, from limit i's decision d in a call allowed or
// not, the status of each descriptor that counts in it, and gives each
// to set: its limit, whether it is over, and what that limit has left.
// It returns what limit i has left after the call.
//
// Descriptors of one counter take from it one after another, as
// envoyproxy/ratelimit counts them: the second finds what the first
// left, each against its own limit. A call refused took nothing, and
// each of them then says what its limit has, or that it is over when it
// and those before it cost more. A limit over says 0 left, as there, even
// when it had less left than the call's cost. A budget's or a peek's
// decision (Fill, never merged) says what it had.
func (p *rlsPlanned) statuses(i int, d *rules.Decision, allowed bool, set func(descriptor int, l *rls.Limit, over bool, remaining int64)) int64 {
	lr := &p.check.Limits[i]
	if lr.Fill {
		remaining := d.Remaining
		switch {
		case !d.Allowed:
			remaining = 0
		case allowed:
			remaining -= lr.Taken(d)
		}
		set(p.descriptor[i], p.limits[i], !d.Allowed, remaining)
		return remaining
	}
	// An allowed decision says what the limit would have after the call,
	// whether or not the call took it; one refused what it has.
	taken := d.Allowed && allowed
	had := d.Remaining
	if d.Allowed {
		had += lr.Spec.Cost
	}
	before := lr.Spec.Limit - had // the count before the call
	var cost int64
	p.listings(i, func(descriptor int, l *rls.Limit, c int64) {
		cost += c
		switch {
		case taken:
			set(descriptor, l, false, l.RequestsPerUnit-before-cost)
		case before+cost > l.RequestsPerUnit:
			set(descriptor, l, true, 0)
		default:
			set(descriptor, l, false, l.RequestsPerUnit-before)
		}
	})
	if taken {
		return d.Remaining
	}
	return had
}

// errNoRLSConfig answers every call of a bridge without --rls-config
// or --rls-xds.
var errNoRLSConfig = &rlsError{grpcUnimplemented, "no rate limit service configuration (--rls-config)"}

// errRLSConfigPending answers the calls of a bridge whose --rls-xds
// server has not given it a configuration yet.
var errRLSConfigPending = &rlsError{grpcUnavailable, "no rate limit service configuration from the xDS server yet (--rls-xds)"}

// noRLSConfig is the answer to a call while there is no configuration.
func (s *Server) noRLSConfig() *rlsError {
	if s.set.RLSXDS != "" {
		return errRLSConfigPending
	}
	return errNoRLSConfig
}

// rlsWaiting tells that the rate limit service has no configuration to
// decide calls by: none yet from --rls-xds, when every call fails, or
// with --rls-ready-needs-config, one without a domain.
func (s *Server) rlsWaiting() bool {
	if !s.servesRLS() {
		return false
	}
	cfg := s.rls.Load()
	return cfg == nil || (s.set.RLSReadyNeedsConfig && !cfg.HasDomains())
}

// servesRLS tells whether the bridge serves the rate limit service:
// with a configuration from files or from an xDS server.
func (s *Server) servesRLS() bool { return s.set.RLSConfig != "" || s.set.RLSXDS != "" }

// zeroLimit is a limit of 0 and the descriptor it is of.
type zeroLimit struct {
	limit      *rls.Limit
	descriptor int
	quota      bool // in quota mode
}

// rlsPlan finds the limit of each of req's descriptors and makes the
// check of those that count: not unlimited, not replaced by another
// limit of the call (a limit's replaces).
func (s *Server) rlsPlan(req *rls.Request) (*rlsPlanned, *rlsError) {
	cfg := s.rls.Load()
	if cfg == nil {
		return nil, s.noRLSConfig()
	}
	if len(req.Descriptors) > rules.MaxLimitsPerCheck {
		return nil, &rlsError{grpcInvalidArgument, fmt.Sprintf("more than %d descriptors", rules.MaxLimitsPerCheck)}
	}
	hits := int64(max(req.HitsAddend, 1))
	p := &rlsPlanned{}
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		if d.NegativeHits {
			return nil, &rlsError{grpcInvalidArgument, fmt.Sprintf("descriptors[%d]: is_negative_hits is not supported", i)}
		}
		var l *rls.Limit
		if o := d.Override; o != nil && cfg.HasDomain(req.Domain) {
			// The limit the caller gives (Envoy's limit override), as
			// envoyproxy/ratelimit takes it for a configured domain.
			if o.Unit.WindowMS() == 0 || o.RequestsPerUnit == 0 {
				return nil, &rlsError{grpcInvalidArgument, fmt.Sprintf("descriptors[%d].limit: requests_per_unit and unit are required", i)}
			}
			if o.HasUnitMultiplier && (o.UnitMultiplier == 0 || int64(o.UnitMultiplier) > rules.MaxWindowMS/o.Unit.WindowMS()) {
				return nil, &rlsError{grpcInvalidArgument, fmt.Sprintf("descriptors[%d].limit.unit_multiplier: must be at least 1, and the window at most %d days", i, rules.MaxWindowMS/86_400_000)}
			}
			l = &rls.Limit{Place: req.Domain + ".override", RequestsPerUnit: int64(o.RequestsPerUnit), Unit: o.Unit, UnitMultiplier: o.UnitMultiplier}
		} else {
			l = cfg.Match(req.Domain, d.Entries)
		}
		if l == nil {
			continue
		}
		if l.Unlimited {
			p.unlimited = append(p.unlimited, i)
			continue
		}
		cost := hits
		if d.HasHitsAddend { // 0: a peek
			cost = int64(min(d.HitsAddend, rules.MaxLimitValue))
		}
		key := rlsKey(req.Domain, d.Entries, l)
		if len(key) > rules.MaxKeyLen {
			return nil, &rlsError{grpcInvalidArgument, fmt.Sprintf("descriptors[%d]: its entries make a key longer than %d bytes", i, rules.MaxKeyLen)}
		}
		p.limits = append(p.limits, l)
		p.descriptor = append(p.descriptor, i)
		p.check.Limits = append(p.check.Limits, rules.LimitRequest{
			Key: key, Rule: l.MetricName(), LogOnly: l.ShadowMode || s.set.RLSShadowMode,
			Spec: rules.LimitSpec{Algorithm: rules.FixedWindow, Limit: l.RequestsPerUnit, WindowMS: l.WindowMS(), Burst: l.RequestsPerUnit, Cost: cost},
			// A budget takes what it has left when a call costs more; a
			// peek (cost 0) only asks whether anything is left. Both are
			// refused once nothing is.
			Fill:  l.Budget || cost == 0,
			Quota: l.Quota || s.set.RLSQuotaMode,
		})
	}
	p.dropReplaced()
	p.takeZeros()
	p.mergeListings()
	return p, nil
}

// mergeListings makes the limits of one counter one limit that costs
// what they cost together, so that the call counts each of its
// descriptors (the script call decides a key once however often a check
// lists it). The limits of one counter may differ in number and shadow
// mode (a limit override of a configured descriptor, which is never in
// shadow mode): the merged limit lets the call through when each that is
// enforced fits, after those before it, under its own, min(limit of each
// + the cost of those after it). Budgets, peeks and quota limits, whose
// decisions say more than what is left, are not merged.
func (p *rlsPlanned) mergeListings() {
	if len(p.check.Limits) < 2 {
		return
	}
	// keep moves the limits it keeps to the front as it goes: the first
	// kept of them are where the scan finds them. A call has a few
	// descriptors (rules.MaxLimitsPerCheck at most): a scan costs less
	// than a map.
	kept := 0
	p.keep(func(i int) bool {
		lr := &p.check.Limits[i]
		for j := 0; j < kept && !lr.Fill && !lr.Quota; j++ {
			m := &p.check.Limits[j]
			if m.Key != lr.Key {
				continue
			}
			if !sameCounter(m, lr) {
				break
			}
			// The limit the listings so far leave, each one's grown by
			// lr's cost, and lr's own; only enforced listings hold the
			// call back, so a log-only one counts only among log-only.
			switch {
			case !m.LogOnly && lr.LogOnly:
				m.Spec.Limit += lr.Spec.Cost
			case m.LogOnly && !lr.LogOnly:
				m.Spec.Limit, m.LogOnly = lr.Spec.Limit, false
			default:
				m.Spec.Limit = min(m.Spec.Limit+lr.Spec.Cost, lr.Spec.Limit)
			}
			m.Spec.Burst, m.Spec.Cost = m.Spec.Limit, m.Spec.Cost+lr.Spec.Cost
			p.more = append(p.more, listing{j, p.descriptor[i], p.limits[i], lr.Spec.Cost})
			return false
		}
		kept++
		return true
	})
}

// sameCounter tells whether a and b are limits of one counter that may
// be merged: alike but for their number, cost and shadow mode.
func sameCounter(a, b *rules.LimitRequest) bool {
	x, y := *a, *b
	x.Spec.Limit, x.Spec.Burst, x.Spec.Cost, x.LogOnly, x.Rule = 0, 0, 0, false, ""
	y.Spec.Limit, y.Spec.Burst, y.Spec.Cost, y.LogOnly, y.Rule = 0, 0, 0, false, ""
	return x == y
}

// hasQuota tells whether the check has a quota limit that can refuse it
// (one in shadow mode cannot).
func (p *rlsPlanned) hasQuota() bool {
	for i := range p.check.Limits {
		if p.check.Limits[i].InQuota() {
			return true
		}
	}
	return false
}

// dropReplaced takes out the limits that another limit of the call
// replaces.
func (p *rlsPlanned) dropReplaced() {
	replaced := map[string]bool{}
	for _, l := range p.limits {
		for _, name := range l.Replaces {
			replaced[name] = true
		}
	}
	if len(replaced) > 0 {
		p.keep(func(i int) bool { return p.limits[i].Name == "" || !replaced[p.limits[i].Name] })
	}
}

// takeZeros moves the limits of 0 out of the check: no count decides
// them.
func (p *rlsPlanned) takeZeros() {
	p.keep(func(i int) bool {
		if p.limits[i].RequestsPerUnit == 0 {
			p.zero = append(p.zero, zeroLimit{p.limits[i], p.descriptor[i], p.check.Limits[i].Quota})
			return false
		}
		return true
	})
}

// keep keeps the limits (with their descriptors and checks) that ok
// reports true for, by index, in order.
func (p *rlsPlanned) keep(ok func(i int) bool) {
	n := 0
	for i, l := range p.limits {
		if ok(i) {
			p.limits[n], p.descriptor[n], p.check.Limits[n] = l, p.descriptor[i], p.check.Limits[i]
			n++
		}
	}
	p.limits, p.descriptor, p.check.Limits = p.limits[:n], p.descriptor[:n], p.check.Limits[:n]
}

// rlsKey is the counter key of a descriptor's limit l: the domain and the
// entries, each written as the plugin's keys write identifiers (verbatim
// when short and safe, else hashed), so no entry can reach into
// another's part; an entry l shares is written with its wildcard
// (Limit.Shared). The hash tag is the whole descriptor, and the unit
// (with its multiplier) follows, so a limit whose unit changed starts a
// counter of its own.
func rlsKey(domain string, entries []rls.Entry, l *rls.Limit) string {
	b := append(make([]byte, 0, 64), "rls:{"...)
	b = rules.AppendID(b, domain)
	for i, e := range entries {
		value := e.Value
		if i < len(l.Shared) && l.Shared[i] != "" {
			value = l.Shared[i]
		}
		b = rules.AppendID(append(b, ':'), e.Key)
		b = rules.AppendID(append(b, ':'), value)
	}
	b = append(append(b, "}:"...), l.Unit.String()...)
	if l.UnitMultiplier > 1 {
		b = strconv.AppendUint(append(b, 'x'), uint64(l.UnitMultiplier), 10)
	}
	return string(b)
}

// readGRPCRequest reads body, one uncompressed gRPC message, into req.
func readGRPCRequest(body []byte, req *rls.Request) *rlsError {
	msg, e := grpcMessage(body)
	if e != nil {
		return e
	}
	if err := rls.DecodeRequest(msg, req); err != nil {
		return &rlsError{grpcInvalidArgument, "the request message: " + err.Error()}
	}
	return nil
}

// grpcTransport refuses what only net/http lets through to a gRPC
// method: HTTP/1.1, and a content type that is not gRPC's.
func grpcTransport(r *http.Request) *rlsError {
	if r.ProtoMajor != 2 {
		return &rlsError{grpcUnimplemented, "gRPC needs HTTP/2"}
	}
	if ct := r.Header.Get("Content-Type"); !h2fast.IsGRPC(ct) {
		return &rlsError{grpcInvalidArgument, fmt.Sprintf("content type %q is not application/grpc", ct)}
	}
	return nil
}

// grpcMessage is the message of a unary call's body: one message,
// uncompressed, after its five bytes of flag and length.
func grpcMessage(body []byte) ([]byte, *rlsError) {
	if len(body) < 5 || int(binary.BigEndian.Uint32(body[1:5])) != len(body)-5 {
		return nil, &rlsError{grpcInvalidArgument, "the request is not one gRPC message"}
	}
	if body[0] != 0 {
		return nil, &rlsError{grpcUnimplemented, "compressed messages are not supported"}
	}
	return body[5:], nil
}

// grpcAnswer makes out a unary call's answer: one uncompressed message,
// which appendMsg writes, then grpc-status 0 in the trailers.
func grpcAnswer(out *checkio.Response, appendMsg func([]byte) []byte) {
	out.Status = http.StatusOK
	out.Set("Content-Type", "application/grpc")
	frame := appendMsg(append(out.Body[:0], 0, 0, 0, 0, 0))
	binary.BigEndian.PutUint32(frame[1:5], uint32(len(frame)-5))
	out.Body = frame
	out.SetTrailer("Grpc-Status", "0")
}

// grpcTimeout reads a grpc-timeout header: up to 8 digits and a unit.
func grpcTimeout(v []byte) (time.Duration, bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseInt(string(v[:len(v)-1]), 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	var unit time.Duration
	switch v[len(v)-1] { // a switch, not a map built for every call
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, false
	}
	return time.Duration(n) * unit, true
}
