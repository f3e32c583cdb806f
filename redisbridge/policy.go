package redisbridge

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/redisbridge/internal/overrides"
	"github.com/sluicehq/sluice/redisbridge/internal/policy"
	"github.com/sluicehq/sluice/rules"
)

// The policy store's API (--policy-store): rules, the policy plugins
// fetch (rules_from), the audit trail; and deleting an override, which
// every overrides backend supports.

func (s *Server) policyRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET "+rules.PolicyPath, s.checker(s.handlePolicy))
	mux.HandleFunc("GET /v1/rate-limit/rules", s.admin("rule.list", s.handleListRules))
	mux.HandleFunc("GET /v1/rate-limit/rules/{name}", s.admin("rule.get", s.handleGetRule))
	mux.HandleFunc("PUT /v1/rate-limit/rules/{name}", s.admin("rule.put", s.handlePutRule))
	mux.HandleFunc("DELETE /v1/rate-limit/rules/{name}", s.admin("rule.delete", s.handleDeleteRule))
	mux.HandleFunc("DELETE /v1/rate-limit/config/{user_id}/{endpoint...}", s.admin("config.delete", s.handleDeleteConfig))
	mux.HandleFunc("GET /v1/rate-limit/audit", s.admin("audit.get", s.handleAudit))
}

// adminWriteTimeout bounds a change in the policy store: a transaction
// with its audit record, not a check, so it may take longer than
// --redis-timeout.
const adminWriteTimeout = 5 * time.Second

// changeContext is the context of an admin change: bounded, and carrying
// who asks, for the policy store's audit record.
func (s *Server) changeContext(r *http.Request, who string) (context.Context, context.CancelFunc) {
	d := s.set.RedisTimeout
	if s.policy != nil {
		d = adminWriteTimeout
	}
	ctx, cancel := context.WithTimeout(r.Context(), d)
	return policy.WithChange(ctx, s.change(r, who)), cancel
}

func (s *Server) change(r *http.Request, who string) policy.Change {
	return policy.Change{Who: who, Remote: r.RemoteAddr, RequestID: requestID(r)}
}

var errNoPolicyStore = &apiError{http.StatusNotFound, codeNotFound, "path", "this bridge keeps no policy store: start it with --policy-store"}

// havePolicy answers 404 when the bridge has no policy store.
func (s *Server) havePolicy(w http.ResponseWriter, r *http.Request) bool {
	if s.policy == nil {
		writeError(w, r, errNoPolicyStore)
		return false
	}
	return true
}

// snapshot returns the policy in force, or answers 503 before the first
// one was read: a bridge that has not read its policy must not serve an
// empty one, which plugins would apply.
func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) *policy.Snapshot {
	if !s.havePolicy(w, r) {
		return nil
	}
	snap := s.policy.Snapshot()
	if snap == nil {
		writeError(w, r, &apiError{http.StatusServiceUnavailable, codeServiceUnavailable, "", "the policy has not been read from the policy store yet"})
	}
	return snap
}

// handlePolicy serves the policy document plugins fetch, with its version
// as the ETag: a plugin that has it gets 304.
func (s *Server) handlePolicy(w http.ResponseWriter, r *http.Request) {
	snap := s.snapshot(w, r)
	if snap == nil {
		return
	}
	etag := snap.ETag()
	w.Header().Set("Etag", etag)
	w.Header().Set("Cache-Control", "no-cache")
	for _, t := range strings.Split(r.Header.Get("If-None-Match"), ",") {
		if strings.TrimSpace(t) == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(snap.Doc)
}

func (s *Server) handleListRules(w http.ResponseWriter, r *http.Request, who string) {
	snap := s.snapshot(w, r)
	if snap == nil {
		return
	}
	s.audit.Info("admin", "who", who, "remote", r.RemoteAddr, "action", "rule.list", "target", "*",
		"found", len(snap.Rules) > 0, "request_id", requestID(r))
	entries := make([]policy.Entry, len(snap.Rules))
	for i := range snap.Rules {
		entries[i] = policy.Entry{Rule: snap.Rules[i]}
	}
	writeJSON(w, map[string]any{"store": snap.Store, "version": snap.Version, "rules": entries})
}

func (s *Server) handleGetRule(w http.ResponseWriter, r *http.Request, who string) {
	snap := s.snapshot(w, r)
	if snap == nil {
		return
	}
	name := r.PathValue("name")
	i := slices.IndexFunc(snap.Rules, func(x policy.Rule) bool { return x.Name == name })
	s.audit.Info("admin", "who", who, "remote", r.RemoteAddr, "action", "rule.get", "target", name,
		"found", i >= 0, "request_id", requestID(r))
	if i < 0 {
		writeError(w, r, noRule(name))
		return
	}
	writeJSON(w, policy.Entry{Rule: snap.Rules[i]})
}

func noRule(name string) *apiError {
	return &apiError{http.StatusNotFound, codeNotFound, "path", "no rule " + strconv.Quote(name)}
}

// ruleError is the answer to a rule the plugin's validation refused: the
// field inside the rule, as the plugin names it after "rules[i].".
func ruleError(err error) *apiError {
	var ce *rules.ConfigError
	if errors.As(err, &ce) && ce.Path != "" {
		return invalid(codeInvalidInput, ce.Path, ce.Err.Error())
	}
	return invalid(codeInvalidInput, "body", err.Error())
}

// handlePutRule creates or replaces the rule {name}: validated as the
// plugin validates a rule of its configuration, then stored with its
// audit record in one transaction. A refused rule writes neither.
func (s *Server) handlePutRule(w http.ResponseWriter, r *http.Request, who string) {
	if !s.havePolicy(w, r) {
		return
	}
	body, e := readBody(w, r, nil)
	if e != nil {
		writeError(w, r, e)
		return
	}
	rule, err := policy.ParseRule(body)
	if err != nil {
		writeError(w, r, ruleError(err))
		return
	}
	if name := r.PathValue("name"); rule.Name != name {
		writeError(w, r, invalid(codeInvalidInput, "name", "must be the name in the path, "+strconv.Quote(name)))
		return
	}
	ctx, cancel := s.changeContext(r, who)
	defer cancel()
	prev, had, v, err := s.policy.PutRule(ctx, rule, s.change(r, who))
	if errors.Is(err, policy.ErrTooManyRules) {
		writeError(w, r, &apiError{http.StatusConflict, codeConflict, "name", err.Error()})
		return
	}
	if err != nil {
		s.policyFailed(r, "rule.put", err)
		writeError(w, r, storeError(err))
		return
	}
	var before any
	if had {
		before = prev
	}
	s.audit.Info("admin", "who", who, "remote", r.RemoteAddr, "action", "rule.put", "target", rule.Name,
		"before", before, "after", rule, "version", v, "request_id", requestID(r))
	writeJSON(w, map[string]any{"version": v, "rule": rule})
}

func (s *Server) handleDeleteRule(w http.ResponseWriter, r *http.Request, who string) {
	if !s.havePolicy(w, r) {
		return
	}
	name := r.PathValue("name")
	ctx, cancel := s.changeContext(r, who)
	defer cancel()
	prev, had, v, err := s.policy.DeleteRule(ctx, name, s.change(r, who))
	if err != nil {
		s.policyFailed(r, "rule.delete", err)
		writeError(w, r, storeError(err))
		return
	}
	if !had {
		writeError(w, r, noRule(name))
		return
	}
	s.audit.Info("admin", "who", who, "remote", r.RemoteAddr, "action", "rule.delete", "target", name,
		"before", prev, "after", nil, "version", v, "request_id", requestID(r))
	writeJSON(w, map[string]any{"version": v, "rule": prev})
}

// policyFailed logs an admin call the policy store failed, with the
// store's error: the 503 or 500 the caller gets does not say why. Such
// calls are rare, so every one is logged (a failed override write is
// logged by storeFailed, with the counter store's).
func (s *Server) policyFailed(r *http.Request, action string, err error) {
	s.log.Error("policy_store_error", "action", action, "err", err.Error(), "request_id", requestID(r))
}

// handleDeleteConfig removes the override of a user and endpoint.
func (s *Server) handleDeleteConfig(w http.ResponseWriter, r *http.Request, who string) {
	user, endpoint := r.PathValue("user_id"), pathEndpoint(r)
	if r.PathValue("endpoint") == overrides.AllEndpoints {
		endpoint = overrides.AllEndpoints
	}
	ctx, cancel := s.changeContext(r, who)
	defer cancel()
	prev, had, err := s.overrides.Delete(ctx, user, endpoint)
	if err != nil {
		s.storeFailed("config", err)
		writeError(w, r, storeError(err))
		return
	}
	if !had {
		writeError(w, r, &apiError{http.StatusNotFound, codeNotFound, "path", "no override for user " + strconv.Quote(user) + " on endpoint " + strconv.Quote(endpoint)})
		return
	}
	s.audit.Info("admin", "who", who, "remote", r.RemoteAddr, "action", "config.delete",
		"target", user+" "+endpoint, "before", prev, "after", nil, "request_id", requestID(r))
	writeJSON(w, prev)
}

var auditParams = []string{"who", "action", "target", "request_id", "since", "until", "before_id", "limit"}

// handleAudit answers GET /v1/rate-limit/audit: the policy store's audit
// trail, newest first, filtered by the query, a page at a time.
func (s *Server) handleAudit(w http.ResponseWriter, r *http.Request, who string) {
	if !s.havePolicy(w, r) {
		return
	}
	q, e := auditQuery(r)
	if e != nil {
		writeError(w, r, e)
		return
	}
	s.audit.Info("admin", "who", who, "remote", r.RemoteAddr, "action", "audit.get", "target", r.URL.RawQuery,
		"found", true, "request_id", requestID(r))
	ctx, cancel := context.WithTimeout(r.Context(), adminWriteTimeout)
	defer cancel()
	recs, err := s.policy.Audit(ctx, q)
	if err != nil {
		s.policyFailed(r, "audit.get", err)
		writeError(w, r, storeError(err))
		return
	}
	out := map[string]any{"records": recs}
	if len(recs) == q.Limit {
		out["next_before_id"] = recs[len(recs)-1].ID
	}
	writeJSON(w, out)
}

func auditQuery(r *http.Request) (policy.AuditQuery, *apiError) {
	q := policy.AuditQuery{Limit: 100}
	vals, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return q, invalid(codeInvalidInput, "query", err.Error())
	}
	for name, vs := range vals {
		if !slices.Contains(auditParams, name) {
			return q, invalid(codeInvalidInput, name, "unknown parameter; audit takes "+strings.Join(auditParams, ", "))
		}
		if len(vs) > 1 {
			return q, invalid(codeInvalidInput, name, "given more than once")
		}
	}
	q.Who, q.Action, q.Target, q.RequestID = vals.Get("who"), vals.Get("action"), vals.Get("target"), vals.Get("request_id")
	for _, f := range []struct {
		name string
		dst  *time.Time
	}{{"since", &q.Since}, {"until", &q.Until}} {
		if v := vals.Get(f.name); v != "" {
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				return q, invalid(codeInvalidInput, f.name, "must be an RFC 3339 time such as 2026-01-02T15:04:05Z")
			}
			*f.dst = t
		}
	}
	if v := vals.Get("before_id"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return q, invalid(codeInvalidInput, "before_id", "must be a positive integer")
		}
		q.BeforeID = n
	}
	if v := vals.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > policy.MaxAuditPage {
			return q, invalid(codeInvalidInput, "limit", "must be from 1 to 1000")
		}
		q.Limit = n
	}
	return q, nil
}
