package redisbridge

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/sluicehq/sluice/redisbridge/internal/checkio"
	"github.com/sluicehq/sluice/redisbridge/internal/overrides"
	"github.com/sluicehq/sluice/rules"
)

// The REST API: a check per user and endpoint (in a check request's body
// or a batch), status, and the admin endpoints (overrides, reset).

// restParams are the parameters of a REST check: of a check body, of each
// check of a batch, and of a status request (path and query).
type restParams struct {
	UserID        string `json:"user_id"`
	Endpoint      string `json:"endpoint"`
	Algorithm     string `json:"algorithm"`
	Limit         *int64 `json:"limit"`
	WindowSeconds *int64 `json:"window_seconds"`
	// WindowMonths, in place of window_seconds: a fixed_window of
	// calendar months, the quota of a monthly plan.
	WindowMonths *int64 `json:"window_months"`
	Cost         *int64 `json:"cost"`
}

// restResult is the answer to a REST check.
type restResult struct {
	UserID     string `json:"user_id"`
	Endpoint   string `json:"endpoint"`
	Allowed    bool   `json:"allowed"`
	Limit      int64  `json:"limit"`
	Remaining  int64  `json:"remaining"`
	ResetAt    int64  `json:"reset_at"`
	Algorithm  string `json:"algorithm"`
	RetryAfter int64  `json:"retry_after,omitempty"`
}

// renamed maps names callers may still send to their current ones.
var renamed = map[string]string{"strategy": "algorithm"}

const algorithmReason = "must be token_bucket, sliding_window, sliding_log or fixed_window"

// decodeStrict decodes a REST body into v: one JSON object, known fields
// only, each once. Its errors name the field at fault ("body" when the
// JSON itself is malformed).
func decodeStrict(body []byte, v any) *apiError {
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		return invalid(codeInvalidInput, "body", "trailing data after the JSON object")
	}
	if err == nil {
		// Read, so valid JSON: only now is it walked for a repeated name.
		if name, dup := rules.RepeatedName(gjson.ParseBytes(body)); dup {
			return invalid(codeInvalidInput, name, "given twice")
		}
		return nil
	}
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		if typeErr.Field == "" {
			return invalid(codeInvalidInput, "body", "must be a JSON object")
		}
		return invalid(codeInvalidInput, typeErr.Field, "must be "+jsonKind(typeErr.Type.Kind().String()))
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name, _ = strconv.Unquote(name)
		if to, ok := renamed[name]; ok {
			return invalid(codeInvalidInput, name, "renamed: use "+to)
		}
		return invalid(codeInvalidInput, name, "unknown field")
	}
	return invalid(codeInvalidInput, "body", "not valid JSON: "+strings.TrimPrefix(err.Error(), "json: "))
}

func jsonKind(goKind string) string {
	switch {
	case goKind == "string":
		return "a string"
	case strings.HasPrefix(goKind, "int"), strings.HasPrefix(goKind, "uint"), goKind == "ptr":
		return "an integer"
	case goKind == "slice":
		return "an array"
	}
	return "of another type"
}

func validUserEndpoint(prefix, user, endpoint string) *apiError {
	if user == "" || len(user) > rules.MaxKeyLen {
		return invalid(codeInvalidInput, prefix+"user_id", "required, at most 512 bytes")
	}
	if endpoint == "" || len(endpoint) > rules.MaxKeyLen {
		return invalid(codeInvalidInput, prefix+"endpoint", "required, at most 512 bytes")
	}
	return nil
}

// restKey is the counter key of REST checks for a user on an endpoint.
func restKey(user, endpoint string) string {
	return string(rules.AppendKey(nil, "api", rules.Scope(rules.ScopeUser|rules.ScopeEndpoint),
		&rules.Identity{User: user}, rules.AnonymousIP, "", endpoint))
}

// restRequest turns REST parameters into a one-limit check request: the
// bridge's defaults, replaced by the parameters given. The limit is kept
// per user, so an override for (user_id, endpoint) replaces both when
// the check is decided. prefix names the check in errors ("checks[1].").
func (s *Server) restRequest(prefix string, p *restParams) (rules.CheckRequest, *apiError) {
	if e := validUserEndpoint(prefix, p.UserID, p.Endpoint); e != nil {
		return rules.CheckRequest{}, e
	}
	spec := s.defSpec
	if p.Algorithm != "" {
		alg, ok := rules.ParseAlgorithm(p.Algorithm)
		if !ok {
			return rules.CheckRequest{}, invalid(codeInvalidAlgorithm, prefix+"algorithm", algorithmReason)
		}
		spec.Algorithm = alg
	}
	if p.Limit != nil {
		if *p.Limit < 1 || *p.Limit > rules.MaxLimitValue {
			return rules.CheckRequest{}, invalid(codeInvalidLimit, prefix+"limit", "must be from 1 to 1099511627776")
		}
		spec.Limit, spec.Burst = *p.Limit, *p.Limit
	}
	if p.WindowSeconds != nil || p.WindowMonths != nil {
		var e *apiError
		if spec.WindowMS, spec.Months, e = restWindow(prefix, p.WindowSeconds, p.WindowMonths, spec.Algorithm); e != nil {
			return rules.CheckRequest{}, e
		}
	}
	if p.Cost != nil {
		if *p.Cost < 1 || *p.Cost > rules.MaxLimitValue {
			return rules.CheckRequest{}, invalid(codeInvalidInput, prefix+"cost", "must be from 1 to 1099511627776")
		}
		spec.Cost = *p.Cost
	}
	return rules.CheckRequest{User: p.UserID, Endpoint: p.Endpoint, Limits: []rules.LimitRequest{{
		Key: restKey(p.UserID, p.Endpoint), Rule: "api", Spec: spec, PerUser: true,
	}}}, nil
}

// restWindow reads a window given as window_seconds, or as window_months
// (calendar months, for a fixed_window limit; alg is the limit's
// algorithm), as a spec holds it: its length and its months (0: none).
// prefix names the check in errors. Without either, window_seconds is
// named as required.
func restWindow(prefix string, seconds, months *int64, alg rules.Algorithm) (windowMS, n int64, e *apiError) {
	switch {
	case months != nil && seconds != nil:
		return 0, 0, invalid(codeInvalidLimit, prefix+"window_months", "window_seconds or window_months, not both")
	case months != nil && !rules.ValidMonths(*months):
		return 0, 0, invalid(codeInvalidLimit, prefix+"window_months", "1, 2, 3, 4, 6 or 12")
	case months != nil && alg != rules.FixedWindow:
		return 0, 0, invalid(codeInvalidLimit, prefix+"window_months", "calendar months need algorithm fixed_window")
	case months != nil:
		return *months * rules.MonthMS, *months, nil
	case seconds == nil:
		return 0, 0, invalid(codeInvalidLimit, prefix+"window_seconds", "required (or window_months), from 1 to 31622400")
	case *seconds < 1 || *seconds > rules.MaxWindowMS/1000:
		return 0, 0, invalid(codeInvalidLimit, prefix+"window_seconds", "must be from 1 to 31622400")
	}
	return *seconds * 1000, 0, nil
}

// restDecide decides a REST check.
func (s *Server) restDecide(ctx context.Context, deadline time.Time, req *rules.CheckRequest) (restResult, error) {
	var resp rules.CheckResponse
	if err := s.decide(ctx, deadline, req, &resp); err != nil {
		return restResult{}, err
	}
	d := resp.Decisions[0]
	return restResult{
		UserID: req.User, Endpoint: req.Endpoint, Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
		ResetAt: seconds(d.ResetMS), Algorithm: req.Limits[0].Spec.Algorithm.String(), RetryAfter: seconds(d.RetryAfterMS),
	}, nil
}

// restCheck answers a REST check: 200 allowed, 429 limited.
func (s *Server) restCheck(ctx context.Context, deadline time.Time, body []byte, id string, out *checkio.Response) {
	var p restParams
	e := decodeStrict(body, &p)
	var req rules.CheckRequest
	if e == nil {
		req, e = s.restRequest("", &p)
	}
	if e != nil {
		s.m.checkInvalid.Inc()
		e.writeTo(out, id)
		return
	}
	req.RequestID = id
	res, err := s.restDecide(ctx, deadline, &req)
	if err != nil {
		storeError(err).writeTo(out, id)
		return
	}
	out.Status = http.StatusOK
	out.Set("Content-Type", "application/json")
	setLimitHeaders(out, &rules.Decision{Limit: res.Limit, Remaining: res.Remaining, ResetMS: res.ResetAt * 1000}, req.Limits[0].Spec.Algorithm)
	if !res.Allowed {
		out.Status = http.StatusTooManyRequests
		out.SetInt("Retry-After", max(1, res.RetryAfter))
	}
	out.Body = appendJSON(out.Body, res)
}

// appendJSON appends v as JSON and a newline.
func appendJSON(dst []byte, v any) []byte {
	b, _ := json.Marshal(v) // our own types of strings and numbers
	return append(append(dst, b...), '\n')
}

func writeJSON(w http.ResponseWriter, v any) {
	writeResponse(w, &checkio.Response{Status: http.StatusOK, Body: appendJSON(nil, v),
		Headers: []checkio.Header{{Name: "Content-Type", Value: []byte("application/json")}}})
}

const maxBatch = 100

// handleBatch answers POST /v1/rate-limit/batch-check.
func (s *Server) handleBatch(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r, nil)
	if e != nil {
		writeError(w, r, e)
		return
	}
	var in struct {
		IdempotencyKey string       `json:"idempotency_key"`
		Checks         []restParams `json:"checks"`
	}
	if e := decodeStrict(body, &in); e != nil {
		writeError(w, r, e)
		return
	}
	if len(in.IdempotencyKey) > 256 {
		writeError(w, r, invalid(codeInvalidInput, "idempotency_key", "at most 256 bytes"))
		return
	}
	if len(in.Checks) == 0 || len(in.Checks) > maxBatch {
		writeError(w, r, invalid(codeInvalidInput, "checks", "must hold 1 to 100 checks"))
		return
	}
	if in.IdempotencyKey != "" {
		if cached, ok := s.idem.get(in.IdempotencyKey, time.Now()); ok {
			s.m.idemReplays.Inc()
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Idempotent-Replayed", "true")
			_, _ = w.Write(cached)
			return
		}
	}
	reqs := make([]rules.CheckRequest, len(in.Checks))
	for i := range in.Checks {
		var e *apiError
		if reqs[i], e = s.restRequest("checks["+strconv.Itoa(i)+"].", &in.Checks[i]); e != nil {
			writeError(w, r, e)
			return
		}
		reqs[i].RequestID = requestID(r)
	}
	deadline := time.Now().Add(s.set.RedisTimeout)
	// Concurrently, so the Redis store sends them in one pipeline.
	results := make([]restResult, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Go(func() { results[i], errs[i] = s.restDecide(r.Context(), deadline, &reqs[i]) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			writeError(w, r, storeError(err))
			return
		}
	}
	out := appendJSON(nil, struct {
		Results []restResult `json:"results"`
	}{results})
	if in.IdempotencyKey != "" {
		s.idem.put(in.IdempotencyKey, out, time.Now())
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// pathEndpoint reads {endpoint...}: the path after the user id, with its
// leading slash restored.
func pathEndpoint(r *http.Request) string {
	e := r.PathValue("endpoint")
	if !strings.HasPrefix(e, "/") {
		e = "/" + e
	}
	return e
}

// statusQuery are the query parameters of status: those of a check that
// choose its counter and spec.
var statusQuery = []string{"algorithm", "limit", "window_seconds", "window_months"}

// statusParams reads the status request as the REST check it describes.
func statusParams(r *http.Request) (restParams, *apiError) {
	p := restParams{UserID: r.PathValue("user_id"), Endpoint: pathEndpoint(r)}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return p, invalid(codeInvalidInput, "query", err.Error())
	}
	for name, vs := range q {
		switch {
		case renamed[name] != "":
			return p, invalid(codeInvalidInput, name, "renamed: use "+renamed[name])
		case !slices.Contains(statusQuery, name):
			return p, invalid(codeInvalidInput, name, "unknown parameter; status takes algorithm, limit, window_seconds and window_months")
		case len(vs) > 1:
			return p, invalid(codeInvalidInput, name, "given more than once")
		}
	}
	p.Algorithm = q.Get("algorithm")
	for _, f := range []struct {
		name string
		dst  **int64
	}{{"limit", &p.Limit}, {"window_seconds", &p.WindowSeconds}, {"window_months", &p.WindowMonths}} {
		if !q.Has(f.name) {
			continue
		}
		n, err := strconv.ParseInt(q.Get(f.name), 10, 64)
		if err != nil {
			return p, invalid(codeInvalidLimit, f.name, "must be an integer")
		}
		*f.dst = &n
	}
	return p, nil
}

// handleStatus answers GET /v1/rate-limit/status/{user_id}/{endpoint...}:
// the counter a REST check with the same algorithm, limit and window
// (window_seconds or window_months) uses, as that check would see it (overrides applied),
// without consuming.
func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	p, e := statusParams(r)
	var req rules.CheckRequest
	if e == nil {
		req, e = s.restRequest("", &p)
	}
	if e != nil {
		writeError(w, r, e)
		return
	}
	s.overrides.Apply(&req)
	l := &req.Limits[0]
	t0 := time.Now()
	d, err := s.store.Peek(r.Context(), t0.Add(s.set.RedisTimeout), l)
	s.m.storeDur.WithLabelValues("status").Observe(time.Since(t0).Seconds())
	if err != nil {
		s.m.checkError.Inc()
		s.storeFailed("status", err)
		writeError(w, r, storeError(err))
		return
	}
	out := checkio.Response{Status: http.StatusOK}
	out.Set("Content-Type", "application/json")
	setLimitHeaders(&out, &d, l.Spec.Algorithm)
	out.Body = appendJSON(out.Body, map[string]any{
		"user_id": req.User, "endpoint": req.Endpoint, "limit": d.Limit, "remaining": d.Remaining,
		"reset_at": seconds(d.ResetMS), "algorithm": l.Spec.Algorithm.String(),
		"usage_percentage": math.Round(float64(d.Limit-d.Remaining)/float64(d.Limit)*10000) / 100,
		"blocked":          !d.Allowed, // Peek: whether one more unit would pass
	})
	writeResponse(w, &out)
}

// configBody is PUT /v1/rate-limit/config.
type configBody struct {
	UserID        string `json:"user_id"`
	Endpoint      string `json:"endpoint"`
	Limit         *int64 `json:"limit"`
	WindowSeconds *int64 `json:"window_seconds"`
	// WindowMonths, in place of window_seconds: a fixed_window of
	// calendar months.
	WindowMonths  *int64 `json:"window_months"`
	Algorithm     string `json:"algorithm"`
	BurstCapacity *int64 `json:"burst_capacity,omitempty"`
}

func (s *Server) handlePutConfig(w http.ResponseWriter, r *http.Request, who string) {
	body, e := readBody(w, r, nil)
	if e != nil {
		writeError(w, r, e)
		return
	}
	var c configBody
	if e := decodeStrict(body, &c); e != nil {
		writeError(w, r, e)
		return
	}
	if e := validUserEndpoint("", c.UserID, c.Endpoint); e != nil {
		writeError(w, r, e)
		return
	}
	alg, algOK := rules.ParseAlgorithm(c.Algorithm)
	switch {
	case !algOK:
		e = invalid(codeInvalidAlgorithm, "algorithm", "required: token_bucket, sliding_window, sliding_log or fixed_window")
	case c.Limit == nil || *c.Limit < 1 || *c.Limit > rules.MaxLimitValue:
		e = invalid(codeInvalidLimit, "limit", "required, from 1 to 1099511627776")
	case c.BurstCapacity != nil && (*c.BurstCapacity < 1 || *c.BurstCapacity > rules.MaxLimitValue):
		e = invalid(codeInvalidLimit, "burst_capacity", "from 1 to 1099511627776")
	}
	var windowMS, months int64
	if e == nil {
		windowMS, months, e = restWindow("", c.WindowSeconds, c.WindowMonths, alg)
	}
	if e != nil {
		writeError(w, r, e)
		return
	}
	o := overrides.Override{User: c.UserID, Endpoint: c.Endpoint, Algorithm: alg, Limit: *c.Limit,
		WindowMS: windowMS, Months: months, UpdatedMS: time.Now().UnixMilli()}
	if c.BurstCapacity != nil {
		o.Burst = *c.BurstCapacity
	}
	ctx, cancel := s.changeContext(r, who)
	defer cancel()
	prev, had, err := s.overrides.Put(ctx, o)
	if err != nil {
		s.storeFailed("config", err)
		writeError(w, r, storeError(err))
		return
	}
	var before any
	if had {
		before = prev
	}
	after := o
	s.audit.Info("admin", "who", who, "remote", r.RemoteAddr, "action", "config.put",
		"target", c.UserID+" "+c.Endpoint, "before", before, "after", after, "request_id", requestID(r))
	writeJSON(w, after)
}

// handleGetConfig answers with the override of a user and endpoint. Reads
// are audited too: overrides tell who gets what, and reads are rare.
func (s *Server) handleGetConfig(w http.ResponseWriter, r *http.Request, who string) {
	user, endpoint := r.PathValue("user_id"), pathEndpoint(r)
	if r.PathValue("endpoint") == overrides.AllEndpoints {
		endpoint = overrides.AllEndpoints
	}
	o, found := s.overrides.Get(user, endpoint)
	s.audit.Info("admin", "who", who, "remote", r.RemoteAddr, "action", "config.get",
		"target", user+" "+endpoint, "found", found, "request_id", requestID(r))
	if !found {
		writeError(w, r, &apiError{http.StatusNotFound, codeNotFound, "path", "no override for user " + strconv.Quote(user) + " on endpoint " + strconv.Quote(endpoint)})
		return
	}
	writeJSON(w, o)
}

// handleReset answers POST /v1/rate-limit/reset: {user_id, endpoint} for a
// REST counter, or {key} for a plugin counter ("rl:{u:alice}:chat").
func (s *Server) handleReset(w http.ResponseWriter, r *http.Request, who string) {
	body, e := readBody(w, r, nil)
	if e != nil {
		writeError(w, r, e)
		return
	}
	var c struct {
		UserID   string `json:"user_id"`
		Endpoint string `json:"endpoint"`
		Key      string `json:"key"`
	}
	if e := decodeStrict(body, &c); e != nil {
		writeError(w, r, e)
		return
	}
	key := c.Key
	if key != "" {
		if !strings.HasPrefix(key, "rl:") || len(key) > rules.MaxKeyLen {
			writeError(w, r, invalid(codeInvalidInput, "key", "must be a counter key (rl:...) of at most 512 bytes"))
			return
		}
	} else {
		if e := validUserEndpoint("", c.UserID, c.Endpoint); e != nil {
			writeError(w, r, e)
			return
		}
		key = restKey(c.UserID, c.Endpoint)
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.set.RedisTimeout)
	defer cancel()
	if err := s.store.Reset(ctx, key); err != nil {
		s.storeFailed("reset", err)
		writeError(w, r, storeError(err))
		return
	}
	at := time.Now().UTC().Format(time.RFC3339)
	s.audit.Info("admin", "who", who, "remote", r.RemoteAddr, "action", "reset", "target", key,
		"before", nil, "after", "reset", "request_id", requestID(r))
	writeJSON(w, map[string]any{"user_id": c.UserID, "endpoint": c.Endpoint, "key": key, "reset_at": at})
}

// idemCache replays batch-check answers for a repeated idempotency key.
// Entries live ttl; FIFO order is expiry order because ttl is fixed.
type idemCache struct {
	mu    sync.Mutex
	max   int
	ttl   time.Duration
	m     map[string]idemEntry
	order []string
}

type idemEntry struct {
	body []byte
	at   time.Time
}

func newIdemCache(max int, ttl time.Duration) *idemCache {
	return &idemCache{max: max, ttl: ttl, m: make(map[string]idemEntry)}
}

func (c *idemCache) get(key string, now time.Time) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || now.Sub(e.at) >= c.ttl {
		return nil, false
	}
	return e.body, true
}

func (c *idemCache) put(key string, body []byte, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[key]; ok && now.Sub(e.at) < c.ttl {
		return // the first answer stays the answer
	}
	for len(c.order) > 0 {
		oldest := c.order[0]
		e, ok := c.m[oldest]
		if ok && len(c.m) < c.max && now.Sub(e.at) < c.ttl {
			break
		}
		delete(c.m, oldest)
		c.order = c.order[1:]
	}
	c.m[key] = idemEntry{body: body, at: now}
	c.order = append(c.order, key)
}
