package redisbridge

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/sluicehq/sluice/redisbridge/internal/store"
	"github.com/sluicehq/sluice/rules"
)

// maxBody bounds every request body.
const maxBody = 64 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// readBody reads the body into buf, refusing more than maxBody bytes.
func readBody(w http.ResponseWriter, r *http.Request, buf []byte) ([]byte, bool) {
	body := http.MaxBytesReader(w, r.Body, maxBody)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, true
		}
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				writeError(w, r, http.StatusRequestEntityTooLarge, codeTooLarge, "body larger than 65536 bytes", nil)
			} else {
				writeError(w, r, http.StatusBadRequest, codeInvalidInput, "reading body: "+err.Error(), nil)
			}
			return nil, false
		}
	}
}

// handleCheck answers a check in the rules wire format: 200 with the
// decisions whether allowed or denied.
func (s *Server) handleCheck(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	body, ok := readBody(w, r, (*bp)[:0])
	if !ok {
		s.m.checkInvalid.Inc()
		return
	}
	*bp = body
	req, err := rules.DecodeCheckRequest(body)
	if err != nil {
		if root := gjson.ParseBytes(body); !root.Get("limits").Exists() && root.Get("user_id").Exists() {
			s.handleSeedCheck(w, r, body)
			return
		}
		s.m.checkInvalid.Inc()
		writeError(w, r, http.StatusBadRequest, codeInvalidInput, err.Error(), nil)
		return
	}
	if req.RequestID == "" {
		req.RequestID = requestID(r)
	}
	resp := rules.CheckResponse{Decisions: make([]rules.Decision, 0, len(req.Limits))}
	if err := s.decide(r.Context(), &req, &resp); err != nil {
		status, code, msg := s.checkError(err)
		writeError(w, r, status, code, msg, nil)
		return
	}
	if i := mostRestrictive(&req, &resp); i >= 0 {
		setLimitHeaders(w.Header(), &resp.Decisions[i], req.Limits[i].Spec.Algorithm)
	}
	out := rules.AppendCheckResponse(body[:0], &resp)
	*bp = out
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
	s.m.checkDur.Observe(time.Since(start).Seconds())
}

// decide runs a decoded check against the store and counts it. resp is
// reset first, so callers may reuse it.
func (s *Server) decide(ctx context.Context, req *rules.CheckRequest, resp *rules.CheckResponse) error {
	*resp = rules.CheckResponse{Decisions: resp.Decisions[:0]}
	t0 := time.Now()
	err := s.store.Check(ctx, req, resp)
	s.m.storeCheck.Observe(time.Since(t0).Seconds())
	if err != nil {
		s.m.checkError.Inc()
		s.storeFailed("check", err)
		return err
	}
	s.countDecisions(req, resp)
	return nil
}

// checkError is the answer to a failed check: 503 when the store could not
// be reached (the plugin applies its failure mode), 500 otherwise.
func (s *Server) checkError(err error) (int, string, string) {
	if errors.Is(err, store.ErrUnavailable) {
		return http.StatusServiceUnavailable, codeServiceUnavailable, "counter store unavailable"
	}
	return http.StatusInternalServerError, codeInternal, "check failed"
}

func (s *Server) checkFailed(w http.ResponseWriter, r *http.Request, err error) {
	s.m.checkError.Inc()
	s.storeFailed("check", err)
	status, code, msg := s.checkError(err)
	writeError(w, r, status, code, msg, nil)
}

func (s *Server) countDecisions(req *rules.CheckRequest, resp *rules.CheckResponse) {
	if resp.Allowed {
		s.m.checkAllowed.Inc()
	} else {
		s.m.checkDenied.Inc()
	}
	for i := range resp.Decisions {
		res := "allowed"
		if !resp.Decisions[i].Allowed {
			res = "denied"
			if req.Limits[i].Shadow {
				res = "shadow_denied"
			}
		}
		s.m.decision(res, req.Limits[i].Spec.Algorithm, req.Limits[i].Rule).Inc()
	}
}

// mostRestrictive picks the decision the headers describe: a denying
// enforced limit first, else the one with the least remaining. Shadow
// limits count only when every limit is a shadow.
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
			if pass == 0 && req.Limits[i].Shadow {
				continue
			}
			if best < 0 || worse(i, best) {
				best = i
			}
		}
	}
	return best
}

func setLimitHeaders(h http.Header, d *rules.Decision, alg rules.Algorithm) {
	h.Set("X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(d.Remaining, 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(ceilDiv(d.ResetMS, 1000), 10))
	h.Set("X-RateLimit-Strategy", alg.String())
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// seedCheck is one check of the seed API: a per-user, per-endpoint limit.
type seedCheck struct {
	UserID        string    `json:"user_id"`
	Endpoint      string    `json:"endpoint"`
	Strategy      string    `json:"strategy"`
	Limit         *int64    `json:"limit"`
	WindowSeconds *int64    `json:"window_seconds"`
	Cost          *int64    `json:"cost"`
	_             [0]func() // not comparable
}

type seedResult struct {
	UserID     string `json:"user_id"`
	Endpoint   string `json:"endpoint"`
	Allowed    bool   `json:"allowed"`
	Limit      int64  `json:"limit"`
	Remaining  int64  `json:"remaining"`
	ResetAt    int64  `json:"reset_at"`
	Strategy   string `json:"strategy"`
	RetryAfter int64  `json:"retry_after,omitempty"`
}

// fieldError is a validation failure of a seed API body.
type fieldError struct {
	code, field, reason string
}

func (e *fieldError) Error() string { return e.field + ": " + e.reason }

func (e *fieldError) write(w http.ResponseWriter, r *http.Request) {
	writeError(w, r, http.StatusBadRequest, e.code, e.Error(), map[string]any{"field": e.field, "reason": e.reason})
}

// seedKey is the counter key of a seed API check.
func seedKey(user, endpoint string) string {
	return string(rules.AppendKey(nil, "api", rules.Scope(rules.ScopeUser|rules.ScopeEndpoint),
		&rules.Identity{User: user}, rules.AnonymousIP, "", endpoint))
}

func validUserEndpoint(prefix, user, endpoint string) *fieldError {
	if user == "" || len(user) > rules.MaxKeyLen {
		return &fieldError{codeInvalidInput, prefix + "user_id", "required, at most 512 bytes"}
	}
	if endpoint == "" || len(endpoint) > rules.MaxKeyLen {
		return &fieldError{codeInvalidInput, prefix + "endpoint", "required, at most 512 bytes"}
	}
	return nil
}

// seedRequest turns a seed check into a one-limit check request. Fields in
// the body replace the defaults; an override set through the config API
// replaces both (the limit is per user).
func (s *Server) seedRequest(prefix string, c *seedCheck) (rules.CheckRequest, *fieldError) {
	if fe := validUserEndpoint(prefix, c.UserID, c.Endpoint); fe != nil {
		return rules.CheckRequest{}, fe
	}
	spec := s.defSpec
	if c.Strategy != "" {
		alg, ok := rules.ParseAlgorithm(c.Strategy)
		if !ok {
			return rules.CheckRequest{}, &fieldError{codeInvalidStrategy, prefix + "strategy", "must be token_bucket, sliding_window, sliding_log or fixed_window"}
		}
		spec.Algorithm = alg
	}
	if c.Limit != nil {
		if *c.Limit < 1 || *c.Limit > rules.MaxLimitValue {
			return rules.CheckRequest{}, &fieldError{codeInvalidLimit, prefix + "limit", "must be from 1 to 1099511627776"}
		}
		spec.Limit, spec.Burst = *c.Limit, *c.Limit
	}
	if c.WindowSeconds != nil {
		if *c.WindowSeconds < 1 || *c.WindowSeconds > rules.MaxWindowMS/1000 {
			return rules.CheckRequest{}, &fieldError{codeInvalidLimit, prefix + "window_seconds", "must be from 1 to 31622400"}
		}
		spec.WindowMS = *c.WindowSeconds * 1000
	}
	if c.Cost != nil {
		if *c.Cost < 1 || *c.Cost > rules.MaxLimitValue {
			return rules.CheckRequest{}, &fieldError{codeInvalidInput, prefix + "cost", "must be from 1 to 1099511627776"}
		}
		spec.Cost = *c.Cost
	}
	return rules.CheckRequest{User: c.UserID, Endpoint: c.Endpoint, Limits: []rules.LimitRequest{{
		Key: seedKey(c.UserID, c.Endpoint), Rule: "api", Spec: spec, PerUser: true,
	}}}, nil
}

func (s *Server) seedDecide(ctx context.Context, req *rules.CheckRequest) (seedResult, error) {
	var resp rules.CheckResponse
	t0 := time.Now()
	err := s.store.Check(ctx, req, &resp)
	s.m.storeCheck.Observe(time.Since(t0).Seconds())
	if err != nil {
		return seedResult{}, err
	}
	s.countDecisions(req, &resp)
	d := resp.Decisions[0]
	return seedResult{
		UserID: req.User, Endpoint: req.Endpoint, Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
		ResetAt: ceilDiv(d.ResetMS, 1000), Strategy: req.Limits[0].Spec.Algorithm.String(), RetryAfter: ceilDiv(d.RetryAfterMS, 1000),
	}, nil
}

// handleSeedCheck answers the seed API's single check: 200 allowed, 429 limited.
func (s *Server) handleSeedCheck(w http.ResponseWriter, r *http.Request, body []byte) {
	var c seedCheck
	if err := json.Unmarshal(body, &c); err != nil {
		s.m.checkInvalid.Inc()
		writeError(w, r, http.StatusBadRequest, codeInvalidInput, "body: "+err.Error(), nil)
		return
	}
	req, fe := s.seedRequest("", &c)
	if fe != nil {
		s.m.checkInvalid.Inc()
		fe.write(w, r)
		return
	}
	res, err := s.seedDecide(r.Context(), &req)
	if err != nil {
		s.checkFailed(w, r, err)
		return
	}
	d := rules.Decision{Limit: res.Limit, Remaining: res.Remaining, ResetMS: res.ResetAt * 1000}
	setLimitHeaders(w.Header(), &d, req.Limits[0].Spec.Algorithm)
	status := http.StatusOK
	if !res.Allowed {
		status = http.StatusTooManyRequests
		w.Header().Set("Retry-After", strconv.FormatInt(max(1, res.RetryAfter), 10))
	}
	writeJSON(w, status, res)
}

const maxBatch = 100

// handleBatch answers POST /v1/rate-limit/batch-check.
func (s *Server) handleBatch(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r, nil)
	if !ok {
		return
	}
	var in struct {
		IdempotencyKey string      `json:"idempotency_key"`
		Checks         []seedCheck `json:"checks"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		writeError(w, r, http.StatusBadRequest, codeInvalidInput, "body: "+err.Error(), nil)
		return
	}
	if len(in.IdempotencyKey) > 256 {
		(&fieldError{codeInvalidInput, "idempotency_key", "at most 256 bytes"}).write(w, r)
		return
	}
	if len(in.Checks) == 0 || len(in.Checks) > maxBatch {
		(&fieldError{codeInvalidInput, "checks", "must hold 1 to 100 checks"}).write(w, r)
		return
	}
	if in.IdempotencyKey != "" {
		if cached, ok := s.idem.get(in.IdempotencyKey, time.Now()); ok {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Idempotent-Replayed", "true")
			_, _ = w.Write(cached)
			return
		}
	}
	reqs := make([]rules.CheckRequest, len(in.Checks))
	for i := range in.Checks {
		var fe *fieldError
		if reqs[i], fe = s.seedRequest("checks["+strconv.Itoa(i)+"].", &in.Checks[i]); fe != nil {
			fe.write(w, r)
			return
		}
	}
	// Concurrently, so the Redis store sends them in one pipeline.
	results := make([]seedResult, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = s.seedDecide(r.Context(), &reqs[i])
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			s.checkFailed(w, r, err)
			return
		}
	}
	out, _ := json.Marshal(struct {
		Results []seedResult `json:"results"`
	}{results})
	out = append(out, '\n')
	if in.IdempotencyKey != "" {
		s.idem.put(in.IdempotencyKey, out, time.Now())
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// seedEndpoint reads {endpoint...}: the path after the user id, with its
// leading slash restored.
func seedEndpoint(r *http.Request) string {
	e := r.PathValue("endpoint")
	if !strings.HasPrefix(e, "/") {
		e = "/" + e
	}
	return e
}

// handleStatus answers GET /v1/rate-limit/status/{user_id}/{endpoint...}
// without consuming.
func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	user, endpoint := r.PathValue("user_id"), seedEndpoint(r)
	if fe := validUserEndpoint("", user, endpoint); fe != nil {
		fe.write(w, r)
		return
	}
	spec := s.defSpec
	if st := r.URL.Query().Get("strategy"); st != "" {
		alg, ok := rules.ParseAlgorithm(st)
		if !ok {
			(&fieldError{codeInvalidStrategy, "strategy", "must be token_bucket, sliding_window, sliding_log or fixed_window"}).write(w, r)
			return
		}
		spec.Algorithm = alg
	}
	if o, ok := s.store.Override(user, endpoint); ok {
		spec = o.Apply(spec)
	}
	t0 := time.Now()
	d, _, err := s.store.Status(r.Context(), seedKey(user, endpoint), spec)
	s.m.storeDur.WithLabelValues("status").Observe(time.Since(t0).Seconds())
	if err != nil {
		s.checkFailed(w, r, err)
		return
	}
	usage := math.Round(float64(d.Limit-d.Remaining)/float64(d.Limit)*10000) / 100
	setLimitHeaders(w.Header(), &d, spec.Algorithm)
	writeJSON(w, http.StatusOK, map[string]any{
		"user_id": user, "endpoint": endpoint, "limit": d.Limit, "remaining": d.Remaining,
		"reset_at": ceilDiv(d.ResetMS, 1000), "strategy": spec.Algorithm.String(),
		"usage_percentage": usage, "blocked": !d.Allowed && d.Remaining == 0 && d.RetryAfterMS > 0,
	})
}

// configBody is PUT /v1/rate-limit/config.
type configBody struct {
	UserID        string `json:"user_id"`
	Endpoint      string `json:"endpoint"`
	Limit         *int64 `json:"limit"`
	WindowSeconds *int64 `json:"window_seconds"`
	Strategy      string `json:"strategy"`
	BurstCapacity *int64 `json:"burst_capacity,omitempty"`
}

func overrideView(o store.Override) map[string]any {
	v := map[string]any{
		"user_id": o.User, "endpoint": o.Endpoint, "limit": o.Limit, "window_seconds": o.WindowMS / 1000,
		"strategy": o.Algorithm.String(), "updated_at": time.UnixMilli(o.UpdatedMS).UTC().Format(time.RFC3339),
	}
	if o.Burst > 0 {
		v["burst_capacity"] = o.Burst
	}
	return v
}

func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

func (s *Server) handlePutConfig(w http.ResponseWriter, r *http.Request, who string) {
	body, ok := readBody(w, r, nil)
	if !ok {
		return
	}
	var c configBody
	if err := decodeStrict(body, &c); err != nil {
		writeError(w, r, http.StatusBadRequest, codeInvalidInput, "body: "+err.Error(), nil)
		return
	}
	if fe := validUserEndpoint("", c.UserID, c.Endpoint); fe != nil {
		fe.write(w, r)
		return
	}
	var fe *fieldError
	alg, algOK := rules.ParseAlgorithm(c.Strategy)
	switch {
	case !algOK:
		fe = &fieldError{codeInvalidStrategy, "strategy", "required: token_bucket, sliding_window, sliding_log or fixed_window"}
	case c.Limit == nil || *c.Limit < 1 || *c.Limit > rules.MaxLimitValue:
		fe = &fieldError{codeInvalidLimit, "limit", "required, from 1 to 1099511627776"}
	case c.WindowSeconds == nil || *c.WindowSeconds < 1 || *c.WindowSeconds > rules.MaxWindowMS/1000:
		fe = &fieldError{codeInvalidLimit, "window_seconds", "required, from 1 to 31622400"}
	case c.BurstCapacity != nil && (*c.BurstCapacity < 1 || *c.BurstCapacity > rules.MaxLimitValue):
		fe = &fieldError{codeInvalidLimit, "burst_capacity", "from 1 to 1099511627776"}
	}
	if fe != nil {
		fe.write(w, r)
		return
	}
	o := store.Override{
		User: c.UserID, Endpoint: c.Endpoint, Algorithm: alg, Limit: *c.Limit,
		WindowMS: *c.WindowSeconds * 1000, UpdatedMS: time.Now().UnixMilli(),
	}
	if c.BurstCapacity != nil {
		o.Burst = *c.BurstCapacity
	}
	prev, had, err := s.store.SetOverride(r.Context(), o)
	if err != nil {
		s.checkFailed(w, r, err)
		return
	}
	var before any
	if had {
		before = overrideView(prev)
	}
	after := overrideView(o)
	s.audit.Info("admin", "who", who, "remote", r.RemoteAddr, "action", "config.put",
		"target", c.UserID+" "+c.Endpoint, "before", before, "after", after, "request_id", requestID(r))
	writeJSON(w, http.StatusOK, after)
}

func (s *Server) handleGetConfig(w http.ResponseWriter, r *http.Request, _ string) {
	user, endpoint := r.PathValue("user_id"), seedEndpoint(r)
	if r.PathValue("endpoint") == "*" {
		endpoint = "*"
	}
	o, ok := s.store.Override(user, endpoint)
	if !ok || o.Endpoint != endpoint {
		writeError(w, r, http.StatusNotFound, codeNotFound, "no override for this user and endpoint", nil)
		return
	}
	writeJSON(w, http.StatusOK, overrideView(o))
}

// handleReset answers POST /v1/rate-limit/reset: {user_id, endpoint} for a
// seed API counter, or {key} for a plugin counter ("rl:{u:alice}:chat").
func (s *Server) handleReset(w http.ResponseWriter, r *http.Request, who string) {
	body, ok := readBody(w, r, nil)
	if !ok {
		return
	}
	var c struct {
		UserID   string `json:"user_id"`
		Endpoint string `json:"endpoint"`
		Key      string `json:"key"`
	}
	if err := decodeStrict(body, &c); err != nil {
		writeError(w, r, http.StatusBadRequest, codeInvalidInput, "body: "+err.Error(), nil)
		return
	}
	key := c.Key
	if key != "" {
		if !strings.HasPrefix(key, "rl:") || len(key) > rules.MaxKeyLen {
			(&fieldError{codeInvalidInput, "key", "must be a counter key (rl:...) of at most 512 bytes"}).write(w, r)
			return
		}
	} else {
		if fe := validUserEndpoint("", c.UserID, c.Endpoint); fe != nil {
			fe.write(w, r)
			return
		}
		key = seedKey(c.UserID, c.Endpoint)
	}
	if err := s.store.Reset(r.Context(), key); err != nil {
		s.checkFailed(w, r, err)
		return
	}
	at := time.Now().UTC().Format(time.RFC3339)
	s.audit.Info("admin", "who", who, "remote", r.RemoteAddr, "action", "reset", "target", key,
		"before", nil, "after", "reset", "request_id", requestID(r))
	writeJSON(w, http.StatusOK, map[string]any{"user_id": c.UserID, "endpoint": c.Endpoint, "key": key, "reset_at": at})
}
