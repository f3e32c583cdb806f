package redisbridge

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"testing"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/sluicehq/sluice/rules"
)

// FuzzDecodeCheckRequest_SameAsBefore compares rules.DecodeCheckRequest,
// rewritten for speed (one ForEach per object), with the decoder it
// replaced, kept here: same requests, same errors. Changed in both since:
// the body must be UTF-8; log_only and the penalty's detection_window_ms
// and violation_threshold are the wire names.
func FuzzDecodeCheckRequest_SameAsBefore(f *testing.F) {
	for _, s := range []string{
		checkBody(limit("rl:{u:f}:a", rules.TokenBucket, 3)),
		`{"request_id":"x","user":"u","endpoint":"/e","limits":[{"key":"k","rule":"r","algorithm":"sliding_log","limit":1,"window_ms":1,"burst":2,"cost":1,"log_only":true,"per_user":false,"penalty":{"detection_window_ms":1,"violation_threshold":1,"multipliers":[2,3]}}]}`,
		`{"limits":[{"key":"k","key":"j","algorithm":"fixed_window","limit":1,"limit":2,"window_ms":1}],"limits":[]}`,
		`{"limits":[{"key":"k","algorithm":"leaky","limit":1,"window_ms":1},{"key":""}]}`,
		`{"limits":[{"key":"k","alg\u006frithm":"fixed_window","limit":1.5,"window_ms":1}]}`,
		`{"request_id":"\u00e9","user":"jos\u00e9 \ud83d\ude00 \ud800 \ud800\u0041 \udc00","endpoint":"/café/😀","limits":[{"key":"rl:{u:josé}:r","rule":"\u0072","algorithm":"fixed_window","limit":1,"window_ms":1}]}`,
		"{\"user\":\"\xff\xed\xa0\x80\",\"limits\":[{\"key\":\"k\xc3\",\"algorithm\":\"fixed_window\",\"limit\":1,\"window_ms\":1}]}",
		`{"user":1,"limits":[]}`, `{"limits":{}}`, `[]`, `{}`, ``, `{"limits":[1]}`, `{"limits":[{"key":"k","algorithm":"token_bucket","limit":1,"window_ms":1,"log_only":null}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, gerr := rules.DecodeCheckRequest(b)
		want, werr := refDecodeCheckRequest(b)
		if (gerr == nil) != (werr == nil) || gerr != nil && gerr.Error() != werr.Error() {
			t.Fatalf("errors differ on %q:\n got %v\nwant %v", b, gerr, werr)
		}
		if gerr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("requests differ on %q:\n got %+v\nwant %+v", b, got, want)
		}
	})
}

// refDecodeCheckRequest is rules.DecodeCheckRequest before the rewrite: it
// looks every field up with Get.
func refDecodeCheckRequest(body []byte) (rules.CheckRequest, error) {
	var req rules.CheckRequest
	if !gjson.ValidBytes(body) {
		return req, fmt.Errorf("%w: body is not valid JSON", rules.ErrInvalidCheck)
	}
	if !utf8.Valid(body) {
		return req, fmt.Errorf("%w: body is not UTF-8", rules.ErrInvalidCheck)
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return req, fmt.Errorf("%w: body must be a JSON object", rules.ErrInvalidCheck)
	}
	if id := root.Get("request_id"); id.Exists() {
		if id.Type != gjson.String || len(id.Str) > 128 {
			return req, fmt.Errorf("%w: request_id: must be a string of at most 128 bytes", rules.ErrInvalidCheck)
		}
		req.RequestID = id.Str
	}
	for _, f := range [...]struct {
		name string
		dst  *string
	}{{"user", &req.User}, {"endpoint", &req.Endpoint}} {
		v := root.Get(f.name)
		if !v.Exists() {
			continue
		}
		if v.Type != gjson.String || len(v.Str) > rules.MaxKeyLen {
			return req, fmt.Errorf("%w: %s: must be a string of at most %d bytes", rules.ErrInvalidCheck, f.name, rules.MaxKeyLen)
		}
		*f.dst = v.Str
	}
	lims := root.Get("limits")
	if !lims.IsArray() {
		return req, fmt.Errorf("%w: limits: must be an array", rules.ErrInvalidCheck)
	}
	arr := lims.Array()
	if len(arr) == 0 || len(arr) > rules.MaxLimitsPerCheck {
		return req, fmt.Errorf("%w: limits: must hold 1 to %d limits", rules.ErrInvalidCheck, rules.MaxLimitsPerCheck)
	}
	req.Limits = make([]rules.LimitRequest, len(arr))
	for i, v := range arr {
		if err := refDecodeLimit(v, &req.Limits[i]); err != nil {
			return req, fmt.Errorf("%w: limits[%d].%v", rules.ErrInvalidCheck, i, err)
		}
	}
	return req, nil
}

func refDecodeLimit(v gjson.Result, l *rules.LimitRequest) error {
	if !v.IsObject() {
		return errors.New("(limit): must be an object")
	}
	key := v.Get("key")
	if key.Type != gjson.String || len(key.Str) == 0 || len(key.Str) > rules.MaxKeyLen {
		return fmt.Errorf("key: must be a string of 1 to %d bytes", rules.MaxKeyLen)
	}
	l.Key = key.Str
	rule := v.Get("rule")
	if rule.Exists() && (rule.Type != gjson.String || len(rule.Str) > rules.MaxRuleNameLen+8) {
		return fmt.Errorf("rule: must be a string of at most %d bytes", rules.MaxRuleNameLen+8)
	}
	l.Rule = rule.Str
	alg, ok := rules.ParseAlgorithm(v.Get("algorithm").Str)
	if !ok {
		return errors.New("algorithm: must be one of token_bucket, sliding_window, sliding_log, fixed_window")
	}
	l.Spec.Algorithm = alg
	var err error
	if l.Spec.Limit, err = refWireInt(v, "limit", 1, rules.MaxLimitValue, 0); err != nil {
		return err
	}
	if l.Spec.WindowMS, err = refWireInt(v, "window_ms", 1, rules.MaxWindowMS, 0); err != nil {
		return err
	}
	if l.Spec.Burst, err = refWireInt(v, "burst", 1, rules.MaxLimitValue, l.Spec.Limit); err != nil {
		return err
	}
	if l.Spec.Cost, err = refWireInt(v, "cost", 1, rules.MaxLimitValue, 1); err != nil {
		return err
	}
	if l.LogOnly, err = refWireBool(v, "log_only"); err != nil {
		return err
	}
	if l.PerUser, err = refWireBool(v, "per_user"); err != nil {
		return err
	}
	if p := v.Get("penalty"); p.Exists() {
		if !p.IsObject() {
			return errors.New("penalty: must be an object")
		}
		pen := &rules.Penalty{Enabled: true}
		if pen.DetectionWindowMS, err = refWireInt(p, "detection_window_ms", 1, rules.MaxWindowMS, 0); err != nil {
			return fmt.Errorf("penalty.%w", err)
		}
		if pen.ViolationThreshold, err = refWireInt(p, "violation_threshold", 1, rules.MaxViolations, 0); err != nil {
			return fmt.Errorf("penalty.%w", err)
		}
		ms := p.Get("multipliers")
		if !ms.IsArray() {
			return errors.New("penalty.multipliers: must be an array")
		}
		marr := ms.Array()
		if len(marr) == 0 || len(marr) > rules.MaxMultipliers {
			return fmt.Errorf("penalty.multipliers: must hold 1 to %d numbers", rules.MaxMultipliers)
		}
		pen.Multipliers = make([]int64, len(marr))
		for j, m := range marr {
			n, ok := refExactInt(m)
			if !ok || n < 1 || n > rules.MaxMultiplier {
				return fmt.Errorf("penalty.multipliers[%d]: must be an integer from 1 to %d", j, rules.MaxMultiplier)
			}
			pen.Multipliers[j] = n
		}
		l.Spec.Penalty = pen
	}
	return nil
}

func refWireBool(v gjson.Result, name string) (bool, error) {
	f := v.Get(name)
	if !f.Exists() {
		return false, nil
	}
	if f.Type != gjson.True && f.Type != gjson.False {
		return false, fmt.Errorf("%s: must be a boolean", name)
	}
	return f.Type == gjson.True, nil
}

// wireInt reads an integer field; def applies when absent and def > 0.
func refWireInt(v gjson.Result, name string, lo, hi, def int64) (int64, error) {
	f := v.Get(name)
	if !f.Exists() && def > 0 {
		return def, nil
	}
	n, ok := refExactInt(f)
	if !ok || n < lo || n > hi {
		return 0, fmt.Errorf("%s: must be an integer from %d to %d", name, lo, hi)
	}
	return n, nil
}

// exactInt accepts only JSON numbers written as plain integers, so that
// 1e400, 1.5 or -0 never turn into a silently rounded limit.
func refExactInt(r gjson.Result) (int64, bool) {
	if r.Type != gjson.Number {
		return 0, false
	}
	n, err := strconv.ParseInt(r.Raw, 10, 64)
	return n, err == nil
}

func BenchmarkDecodeCheckRequest(b *testing.B) {
	body := benchBodies(rules.TokenBucket)[7]
	for _, tc := range []struct {
		name   string
		decode func([]byte) (rules.CheckRequest, error)
	}{{"now", rules.DecodeCheckRequest}, {"before", refDecodeCheckRequest}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tc.decode(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
