package redisbridge

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/sluicehq/sluice/internal/inproc"
	"github.com/sluicehq/sluice/redisbridge/internal/checkio"
	"github.com/sluicehq/sluice/redisbridge/internal/store"
	"github.com/sluicehq/sluice/rules"
)

// This file is the check core: POST /v1/rate-limit/check, whatever
// transport brought it. net/http (handleCheck) and the HTTP/1.1 fast path
// (internal/h1fast) each read their transport into a checkio.Request and
// call serveCheck, as does a gateway that embeds the bridge (embedded); a
// further transport does the same.

// serveCheck is the check core, a checkio.Handler for every transport. The body is a check in the wire
// format, or, when it has no "limits", a REST check (user_id, endpoint).
func (s *Server) serveCheck(ctx context.Context, in *checkio.Request, out *checkio.Response) {
	start := time.Now()
	id, ok := s.admit(in, out)
	if !ok {
		return
	}
	deadline := start.Add(s.set.RedisTimeout)
	req, err := rules.DecodeCheckRequest(in.Body)
	if err != nil {
		if isRESTCheck(in.Body) {
			s.restCheck(ctx, deadline, in.Body, id, out)
		} else {
			s.m.checkInvalid.Inc()
			wireError(err).writeTo(out, id)
		}
		s.m.checkDur.Observe(time.Since(start).Seconds())
		return
	}
	if req.RequestID == "" {
		req.RequestID = id
	}
	resp := respPool.Get().(*rules.CheckResponse)
	defer respPool.Put(resp)
	if err := s.decide(ctx, deadline, &req, resp); err != nil {
		storeError(err).writeTo(out, id)
		return
	}
	out.Status = http.StatusOK
	out.Set("Content-Type", "application/json")
	if i := mostRestrictive(&req, resp); i >= 0 {
		setLimitHeaders(out, &resp.Decisions[i], req.Limits[i].Spec.Algorithm)
	}
	out.Body = rules.AppendCheckResponse(out.Body, resp)
	s.m.checkDur.Observe(time.Since(start).Seconds())
}

var respPool = sync.Pool{New: func() any { return new(rules.CheckResponse) }}

// isRESTCheck tells a REST check (a JSON object without "limits") from a
// wire check the decoder refused.
func isRESTCheck(body []byte) bool {
	if !gjson.ValidBytes(body) {
		return false
	}
	root := gjson.ParseBytes(body)
	return root.IsObject() && !root.Get("limits").Exists()
}

// decide applies overrides to req, runs it against the store by deadline
// (--redis-timeout after the check arrived) and counts it. resp is reset
// first, so callers may reuse it.
func (s *Server) decide(ctx context.Context, deadline time.Time, req *rules.CheckRequest, resp *rules.CheckResponse) error {
	*resp = rules.CheckResponse{Decisions: resp.Decisions[:0]}
	s.overrides.Apply(req)
	t0 := time.Now()
	err := s.store.Check(ctx, deadline, req, resp)
	s.m.storeCheck.Observe(time.Since(t0).Seconds())
	if err != nil {
		s.m.checkError.Inc()
		s.storeFailed("check", err)
		return err
	}
	for i := range req.Limits {
		if n := req.Limits[i].Return.Units; n > 0 {
			s.m.unitsReturned.Add(float64(n))
		}
		if n := resp.Decisions[i].Lease.Units; n > 0 {
			s.m.leaseGrants.Inc()
			s.m.unitsGranted.Add(float64(n))
		}
	}
	// Renewals and returns decide no request: counted apart.
	switch req.Op {
	case rules.OpRenew:
		s.m.renewals.Inc()
		return nil
	case rules.OpReturn:
		s.m.returns.Inc()
		return nil
	}
	switch {
	case resp.Allowed && resp.DelayMS > 0:
		s.m.checkThrottled.Inc()
		s.m.delays.Observe(float64(resp.DelayMS) / 1000)
	case resp.Allowed:
		s.m.checkAllowed.Inc()
	default:
		s.m.checkDenied.Inc()
	}
	for i := range resp.Decisions {
		res := "allowed"
		switch {
		case !resp.Decisions[i].Allowed && req.Limits[i].LogOnly:
			res = "log_only_denied"
		case !resp.Decisions[i].Allowed:
			res = "denied"
		case resp.Allowed && resp.DelayMS > 0 && req.Limits[i].Throttle:
			res = "throttled"
		}
		s.m.decision(res, req.Limits[i].Spec.Algorithm, req.Limits[i].Rule).Inc()
		if nearLimit(&req.Limits[i], &resp.Decisions[i], s.set.NearLimitRatio) {
			s.m.near(req.Limits[i].Spec.Algorithm, req.Limits[i].Rule).Inc()
		}
	}
	return nil
}

// nearLimit tells whether decision d of limit l left more than ratio of
// the limit used: more than floor(limit × ratio) units, envoyproxy/
// ratelimit's near-limit threshold. Only a decision that took units
// counts; a refusal is over, not near.
func nearLimit(l *rules.LimitRequest, d *rules.Decision, ratio float64) bool {
	taken := l.Taken(d)
	if taken <= 0 {
		return false
	}
	left := d.Remaining
	if l.Fill { // its Remaining is what it had before
		left -= taken
	}
	return d.Limit-left > int64(math.Floor(float64(d.Limit)*ratio))
}

// mostRestrictive picks the decision the headers describe: a denying
// enforced limit first, else the one with the least remaining. Log-only
// limits count only when every limit is log-only.
func mostRestrictive(req *rules.CheckRequest, resp *rules.CheckResponse) int {
	best := -1
	worse := func(i, j int) bool { // is i more restrictive than j
		a, b := &resp.Decisions[i], &resp.Decisions[j]
		if a.Allowed != b.Allowed {
			return !a.Allowed
		}
		if a.Remaining != b.Remaining {
			return a.Remaining < b.Remaining
		}
		return a.ResetMS > b.ResetMS
	}
	for pass := 0; pass < 2 && best < 0; pass++ {
		for i := range resp.Decisions {
			if pass == 0 && req.Limits[i].LogOnly {
				continue
			}
			if best < 0 || worse(i, best) {
				best = i
			}
		}
	}
	return best
}

// setLimitHeaders writes the X-RateLimit-* headers of a decision, for
// every transport and endpoint alike. X-RateLimit-Strategy keeps its
// published name; its value is the algorithm.
func setLimitHeaders(out *checkio.Response, d *rules.Decision, alg rules.Algorithm) {
	out.SetInt("X-Ratelimit-Limit", d.Limit)
	out.SetInt("X-Ratelimit-Remaining", d.Remaining)
	out.SetInt("X-Ratelimit-Reset", seconds(d.ResetMS))
	out.Set("X-Ratelimit-Strategy", alg.String())
}

// seconds rounds unix ms up to unix seconds: a reset or a wait is never
// reported earlier than it is.
func seconds(ms int64) int64 { return (ms + 999) / 1000 }

// maxBody bounds every request body.
const maxBody = 64 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// readBody reads the body into buf, refusing more than maxBody bytes.
func readBody(w http.ResponseWriter, r *http.Request, buf []byte) ([]byte, *apiError) {
	body, err := readAll(w, r, buf)
	if err != nil {
		return nil, bodyError(err)
	}
	return body, nil
}

// readAll reads the body into buf; past maxBody bytes it fails with an
// *http.MaxBytesError.
func readAll(w http.ResponseWriter, r *http.Request, buf []byte) ([]byte, error) {
	body := http.MaxBytesReader(w, r.Body, maxBody)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// admit takes a call in: its id (callID), and whether its body was read
// whole and its check token holds; when not, out holds the error.
func (s *Server) admit(in *checkio.Request, out *checkio.Response) (string, bool) {
	id := callID(in, out)
	if in.BodyErr != nil {
		s.m.checkInvalid.Inc()
		bodyError(in.BodyErr).writeTo(out, id)
		return id, false
	}
	if e := s.authorizeCheck(in.Authorization); e != nil {
		e.writeTo(out, id)
		return id, false
	}
	return id, true
}

// callID is the call's X-Request-Id, or one made up when it has none,
// sent back in out; the check is logged with it.
func callID(in *checkio.Request, out *checkio.Response) string {
	id := string(in.RequestID)
	if id == "" {
		id = newRequestID()
	}
	out.Set("X-Request-Id", id)
	return id
}

// bodyError is the answer to a body that could not be read whole.
func bodyError(err error) *apiError {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return bodyTooLarge
	}
	return invalid(codeInvalidInput, "body", "reading it failed: "+err.Error())
}

// checkPath is where the check core answers.
const checkPath = "/v1/rate-limit/check"

// embedded is the bridge's handler as a gateway that embeds it has it
// (Server.Handler): also an inproc.Server, the check core's in-process
// transport, which answers the plugin's checks from their bytes as
// net/http and handleCheck would.
type embedded struct {
	http.Handler
	s *Server
}

// Serves takes the check endpoint's requests; the mux would take one
// with a query too, which is left to it.
func (e embedded) Serves(method, path []byte) bool {
	return string(method) == http.MethodPost && string(path) == checkPath
}

func (e embedded) ServeCallout(ctx context.Context, req *inproc.Request, res *inproc.Response) {
	if _, memory := e.s.store.(*store.Memory); !memory && !req.Deadline.IsZero() {
		// A check waits for Redis until ctx ends (store.Redis); the memory
		// store never waits, and is spared the timer.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, req.Deadline)
		defer cancel()
	}
	in := checkio.Request{Authorization: req.Header("authorization"), RequestID: req.Header("x-request-id"), Body: req.Body}
	if len(in.Body) > maxBody { // what readAll's reader refuses
		in.Body, in.BodyErr = in.Body[:maxBody], &http.MaxBytesError{Limit: maxBody}
	}
	out := outPool.Get().(*checkio.Response)
	defer outPool.Put(out)
	out.Reset()
	e.s.serveCheck(ctx, &in, out)
	// As writeResponse leaves them in a ResponseWriter.
	res.Status = out.Status
	for _, x := range out.Headers {
		res.Set(x.Name, x.Value)
	}
	res.Body = append(res.Body, out.Body...)
	for _, x := range out.Trailers {
		res.Set(http.TrailerPrefix+x.Name, x.Value)
	}
}

// handleCheck is the check core's net/http transport.
func (s *Server) handleCheck(w http.ResponseWriter, r *http.Request) {
	s.serveHTTP(w, r, (*Server).serveCheck)
}

// serveHTTP reads r into a checkio.Request, has the core serve answer it,
// and writes the answer: net/http as a transport of a core that every
// transport calls alike. serve is a method expression, which, unlike a
// method value, allocates no closure per request.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request, serve func(*Server, context.Context, *checkio.Request, *checkio.Response)) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	body, err := readAll(w, r, (*bp)[:0])
	*bp = body
	in := checkio.Request{Authorization: headerBytes(r, "Authorization"), RequestID: []byte(requestID(r)), Body: body, BodyErr: err}
	out := outPool.Get().(*checkio.Response)
	defer outPool.Put(out)
	out.Reset()
	serve(s, r.Context(), &in, out)
	writeResponse(w, out)
}

var outPool = sync.Pool{New: func() any { return new(checkio.Response) }}
