package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// AuditRecord is one change as the audit trail keeps it.
type AuditRecord struct {
	ID        int64           `json:"id"`
	At        time.Time       `json:"at"`
	Who       string          `json:"who"`
	Remote    string          `json:"remote"`
	RequestID string          `json:"request_id"`
	Action    string          `json:"action"`
	Target    string          `json:"target"`
	Before    json.RawMessage `json:"before"`
	After     json.RawMessage `json:"after"`
	Version   int64           `json:"version"`
}

// AuditQuery selects audit records; zero fields select everything.
type AuditQuery struct {
	Who, Action, Target, RequestID string
	Since, Until                   time.Time // at >= Since, at < Until
	BeforeID                       int64     // id < BeforeID: the next page
	Limit                          int       // default and at most MaxAuditPage
}

// MaxAuditPage bounds one page of audit records.
const MaxAuditPage = 1000

// Audit returns the records q selects, newest first. Page on with
// BeforeID set to the last record's id.
func (s *Store) Audit(ctx context.Context, q AuditQuery) ([]AuditRecord, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	if err := s.schemaReady(ctx); err != nil {
		s.m.errors.WithLabelValues("audit").Inc()
		return nil, err
	}
	var where []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf(cond, "$"+strconv.Itoa(len(args))))
	}
	for _, f := range []struct{ col, v string }{{"who", q.Who}, {"action", q.Action}, {"target", q.Target}, {"request_id", q.RequestID}} {
		if f.v != "" {
			add(f.col+" = %s", f.v)
		}
	}
	if !q.Since.IsZero() {
		add("at >= %s", q.Since)
	}
	if !q.Until.IsZero() {
		add("at < %s", q.Until)
	}
	if q.BeforeID > 0 {
		add("id < %s", q.BeforeID)
	}
	if q.Limit <= 0 || q.Limit > MaxAuditPage {
		q.Limit = MaxAuditPage
	}
	sql := "SELECT id, at, who, remote, request_id, action, target, before, after, version FROM sluice_audit"
	if len(where) > 0 {
		sql += " WHERE " + strings.Join(where, " AND ")
	}
	sql += " ORDER BY id DESC LIMIT " + strconv.Itoa(q.Limit)
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		s.m.errors.WithLabelValues("audit").Inc()
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (AuditRecord, error) {
		var r AuditRecord
		err := row.Scan(&r.ID, &r.At, &r.Who, &r.Remote, &r.RequestID, &r.Action, &r.Target, &r.Before, &r.After, &r.Version)
		r.At = r.At.UTC()
		return r, err
	})
	if err != nil {
		s.m.errors.WithLabelValues("audit").Inc()
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return recs, nil
}
