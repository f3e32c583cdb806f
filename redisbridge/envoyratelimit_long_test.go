//go:build long

package redisbridge

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/redisbridge/internal/rls"
	"github.com/sluicehq/sluice/redisbridge/redistest"
)

// matchConfig is the configuration both services decide the calls of
// TestLong_RLS_MatchesEnvoyRatelimit with; windows of a minute, an hour
// and a day, which a scenario of the test (milliseconds) seldom crosses,
// and is not compared when it does. Quota mode is left out:
// the bridge follows envoyproxy/ratelimit's later versions there, which
// the module proxy does not serve.
const matchConfig = `domain: m
descriptors:
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    value: /login
    rate_limit: {unit: hour, requests_per_unit: 2, name: login}
  - key: path
    value: /free
    rate_limit: {unlimited: true}
  - key: user
    descriptors:
      - key: path
        rate_limit: {unit: day, requests_per_unit: 4}
      - key: path
        value: /login
        rate_limit: {unit: hour, requests_per_unit: 1, replaces: [{name: login}]}
  - key: file
    value: a/*
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: file
    value: s/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: zero
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: burst
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: team
    value: a_*
    rate_limit: {unit: hour, requests_per_unit: 2}
`

// matchDescriptors are what the calls are made of.
var matchDescriptors = [][]string{
	{"ip", "10.0.0.1"}, {"ip", "10.0.0.2"},
	{"path", "/login"}, {"path", "/free"}, {"path", "/other"},
	{"user", "u1", "path", "/x"}, {"user", "u2", "path", "/x"}, {"user", "u1", "path", "/login"},
	{"file", "a/1"}, {"file", "a/2"}, {"file", "s/1"}, {"file", "s/2"}, {"file", "b/1"},
	{"zero", "z"}, {"unknown", "x"}, {"burst", "b"}, {"shadow", "s"},
	// A wildcard takes the entry's key and value joined (team_a_x).
	{"team", "a_1"}, {"team_a", "x"}, {"team", "b_1"},
	// Entries that match no limit: fewer than a nested one, more, a
	// wildcard's prefix without its rest.
	{"user", "u1"}, {"user", "u1", "path", "/x", "verb", "GET"}, {"file", "a/"}, {"file", "a"},
}

// TestLong_RLS_MatchesEnvoyRatelimit sends the same random calls, one at
// a time, to the bridge's rate limit service and to envoyproxy/ratelimit,
// both on one Redis with one configuration, and compares the answers.
//
// The two differ by design in what a refused call counts: nothing on the
// bridge; with envoyproxy/ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
// (set here) the descriptors that went over, so that their counters pass
// the limit; without it, every descriptor. So each scenario runs until a
// call is refused (or a limit in shadow mode goes over), compares that
// answer too, and Redis is emptied for the next; answerDiff and the
// comments below say what such a last call is compared by.
func TestLong_RLS_MatchesEnvoyRatelimit(t *testing.T) {
	bin := envoyRatelimitBinary(t)
	one := map[string]string{"config.yaml": matchConfig}
	t.Run("single", func(t *testing.T) {
		rs := redistest.Start(t)
		compareWithEnvoyRatelimit(t, bin, []string{rs.Addr}, false, one, "REDIS_URL="+rs.Addr)
	})
	// The calls in JSON, on both services' POST /json.
	t.Run("json", func(t *testing.T) {
		rs := redistest.Start(t)
		compareWithEnvoyRatelimit(t, bin, []string{rs.Addr}, true, one, "REDIS_URL="+rs.Addr)
	})
	// The configuration in two files of its domain, merged
	// (--rls-merge-domain-config, MERGE_DOMAIN_CONFIG).
	t.Run("merged", func(t *testing.T) {
		rs := redistest.Start(t)
		at := strings.Index(matchConfig, "  - key: file\n")
		two := map[string]string{"config.yaml": matchConfig[:at], "more.yaml": "domain: m\ndescriptors:\n" + matchConfig[at:]}
		compareWithEnvoyRatelimit(t, bin, []string{rs.Addr}, false, two, "REDIS_URL="+rs.Addr, "MERGE_DOMAIN_CONFIG=true")
	})
	// Every limit in shadow mode (--rls-shadow-mode, SHADOW_MODE), and
	// the RateLimit headers renamed.
	t.Run("shadow", func(t *testing.T) {
		rs := redistest.Start(t)
		compareWithEnvoyRatelimit(t, bin, []string{rs.Addr}, false, one, "REDIS_URL="+rs.Addr, "SHADOW_MODE=true",
			"LIMIT_LIMIT_HEADER=X-RL-Limit", "LIMIT_REMAINING_HEADER=X-RL-Remaining", "LIMIT_RESET_HEADER=X-RL-Reset")
	})
	// On a Cluster the bridge decides a call's descriptors in their slots
	// (every descriptor is a hash tag of its own).
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3, 0)
		var addrs []string
		for _, n := range c.Nodes {
			addrs = append(addrs, n.Addr)
		}
		compareWithEnvoyRatelimit(t, bin, addrs, false, one, "REDIS_TYPE=cluster", "REDIS_URL="+strings.Join(addrs, ","),
			"REDIS_PIPELINE_WINDOW=150us") // which its cluster client requires
	})
}

// compareWithEnvoyRatelimit runs the scenarios of
// TestLong_RLS_MatchesEnvoyRatelimit against envoyproxy/ratelimit (bin)
// with the variables env and a bridge that reads the same variables in
// its place (--envoy-ratelimit-env), on its own port: the same Redis,
// whose nodes (emptied between scenarios) are at addrs, and the same
// directory of configuration files (matchConfig, or its parts); over
// gRPC, or in JSON on POST /json.
func compareWithEnvoyRatelimit(t *testing.T, bin string, addrs []string, inJSON bool, files map[string]string, env ...string) {
	them := startEnvoyRatelimit(t, bin, "", files, append([]string{
		"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true", "LIMIT_RESPONSE_HEADERS_ENABLED=true", "RESPONSE_DYNAMIC_METADATA=true"}, env...)...)
	theirs := rlsClient(t, them.grpc)
	vars := map[string]string{}
	for _, kv := range them.env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	vars["GRPC_PORT"] = "0"
	set, err := ParseSettings([]string{"--envoy-ratelimit-env"}, func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	ourAddr := startBridge(t, set)
	ours := rlsClient(t, ourAddr)
	ask := func(client rlsv3.RateLimitServiceClient, addr string, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		if inJSON {
			return askJSON(addr, req)
		}
		return client.ShouldRateLimit(context.Background(), req)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	var calls, refused, compared int
	for scenario := 0; scenario < 300 && !t.Failed(); scenario++ {
		for _, a := range addrs {
			if _, err := redistest.Do(a, time.Second, "FLUSHALL"); err != nil {
				t.Fatal(err)
			}
		}
		minute := time.Now().Truncate(time.Minute)
		var diffs []string
		units := map[string]rlsv3.RateLimitResponse_RateLimit_Unit{}
		merged := false // envoyproxy/ratelimit counted two units in one counter
		for range 30 {
			req := matchCall(rng)
			a, err := ask(theirs, them.http, req)
			if err != nil {
				t.Fatalf("envoyproxy/ratelimit: %v", err)
			}
			b, err := ask(ours, ourAddr, req)
			if err != nil {
				t.Fatalf("the bridge: %v", err)
			}
			calls++
			merged = mergesUnits(units, req, a, time.Now()) || merged
			// Refused, or would have been but for --rls-shadow-mode.
			refusal := anyOver(a) || anyOver(b)
			// A limit in shadow mode that goes over refuses nothing, but
			// with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
			// envoyproxy/ratelimit then counts the call in no other
			// descriptor: the scenario ends there too.
			shadowSpent := shadowSpent(req, a) || shadowSpent(req, b)
			last := refusal || shadowSpent
			// Where a descriptor alone would go over, envoyproxy/ratelimit
			// (with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT) counts only
			// such descriptors, and then holds those of a shared counter
			// each to what it had alone; the bridge takes them one after
			// another (as envoyproxy/ratelimit does without it). Such calls
			// are not compared.
			if !(last && sharesCounter(req)) {
				// Over but let through (--rls-shadow-mode): the bridge counted
				// the call in the others, as for shadowSpent.
				shadowed := refusal && a.OverallCode == rlsv3.RateLimitResponse_OK && b.OverallCode == rlsv3.RateLimitResponse_OK
				if diff := answerDiff(a, b, shadowSpent || shadowed || refusal && hasZero(req)); diff != "" {
					diffs = append(diffs, fmt.Sprintf("call %s:\n%s", compactCall(req), diff))
				}
			}
			if last {
				if refusal {
					refused++
				}
				break
			}
		}
		if !time.Now().Truncate(time.Minute).Equal(minute) || merged {
			continue // a window ended during the scenario
		}
		compared++
		for _, d := range diffs {
			t.Errorf("scenario %d, %s", scenario, d)
		}
	}
	t.Logf("%d calls in %d scenarios compared, %d ending with a refusal", calls, compared, refused)
}

// matchCall is a call of one to three of matchDescriptors (of a domain
// not configured now and then), with hits addends of the call or of its
// descriptors and limit overrides now and then. A hits addend is never 0:
// a peek at a counter exactly at its limit is refused by the bridge,
// which never lets a counter pass its limit to tell it from one over.
func matchCall(rng *rand.Rand) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "m"}
	if rng.IntN(20) == 0 {
		req.Domain = "unknown"
	}
	if rng.IntN(4) == 0 {
		req.HitsAddend = uint32(rng.IntN(3) + 1)
	}
	for range rng.IntN(3) + 1 {
		d := descriptor(matchDescriptors[rng.IntN(len(matchDescriptors))]...)
		if rng.IntN(6) == 0 {
			d.HitsAddend = wrapperspb.UInt64(uint64(rng.IntN(3) + 1))
		}
		if rng.IntN(8) == 0 { // Envoy's limit override
			d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: uint32(rng.IntN(4) + 1), Unit: typev3.RateLimitUnit_HOUR}
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

// sharesCounter tells whether two of req's descriptors count in one
// counter of matchConfig: the same entries, or two files of s/*.
func sharesCounter(req *rlsv3.RateLimitRequest) bool {
	seen := map[string]bool{}
	for _, d := range req.Descriptors {
		k := ""
		for _, e := range d.Entries {
			v := e.Value
			if e.Key == "file" && len(v) > 2 && v[:2] == "s/" {
				v = "s/*"
			}
			k += e.Key + "=" + v + " "
		}
		if seen[k] {
			return true
		}
		seen[k] = true
	}
	return false
}

// askJSON sends req to POST /json at addr, in protobuf's JSON mapping,
// and reads the answer, which comes with 429 when the call is refused.
func askJSON(addr string, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	body, err := protojson.Marshal(req)
	if err != nil {
		return nil, err
	}
	r, err := http.Post("http://"+addr+"/json", "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer r.Body.Close()
	got, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	var res rlsv3.RateLimitResponse
	if err := protojson.Unmarshal(got, &res); err != nil {
		return nil, fmt.Errorf("%d %s: %v", r.StatusCode, got, err)
	}
	if refused := res.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT; refused != (r.StatusCode == http.StatusTooManyRequests) || !refused && r.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d with %s", r.StatusCode, got)
	}
	return &res, nil
}

// anyOver tells whether r refuses its call or has a status over.
func anyOver(r *rlsv3.RateLimitResponse) bool {
	if r.OverallCode != rlsv3.RateLimitResponse_OK {
		return true
	}
	for _, st := range r.Statuses {
		if st.Code != rlsv3.RateLimitResponse_OK {
			return true
		}
	}
	return false
}

// mergesUnits tells whether envoyproxy/ratelimit's answer a to req
// counted limits of two units in one counter, given units, those its
// counters had earlier in the scenario (by key), which it adds to. Its key
// is the entries and the start of the window, not the unit, so in the
// first minute of an hour the minute and hour limits of the same entries
// (burst, and burst with a limit override) share a counter, and in the
// first hour of a day the hour and day limits do. The bridge's keys name
// the unit (docs/bridge.md).
func mergesUnits(units map[string]rlsv3.RateLimitResponse_RateLimit_Unit, req *rlsv3.RateLimitRequest, a *rlsv3.RateLimitResponse, now time.Time) bool {
	seconds := map[rlsv3.RateLimitResponse_RateLimit_Unit]int64{
		rlsv3.RateLimitResponse_RateLimit_SECOND: 1, rlsv3.RateLimitResponse_RateLimit_MINUTE: 60,
		rlsv3.RateLimitResponse_RateLimit_HOUR: 3600, rlsv3.RateLimitResponse_RateLimit_DAY: 86400,
	}
	merged := false
	for i, st := range a.Statuses {
		if st.CurrentLimit == nil || i >= len(req.Descriptors) {
			continue
		}
		unit := st.CurrentLimit.Unit
		d := seconds[unit]
		if d == 0 {
			continue
		}
		key := req.Domain
		for _, e := range req.Descriptors[i].Entries {
			key += "\x00" + e.Key + "\x00" + e.Value
		}
		key += "\x00" + strconv.FormatInt(now.Unix()/d*d, 10)
		if u, ok := units[key]; ok && u != unit {
			merged = true
		}
		units[key] = unit
	}
	return merged
}

// shadowSpent tells whether r, the answer to req, says that
// matchConfig's limit in shadow mode has nothing left: spent, or over.
func shadowSpent(req *rlsv3.RateLimitRequest, r *rlsv3.RateLimitResponse) bool {
	for i, st := range r.Statuses {
		d := req.Descriptors[i]
		if d.Entries[0].Key == "shadow" && d.Limit == nil && st.CurrentLimit != nil && st.LimitRemaining == 0 {
			return true
		}
	}
	return false
}

// hasZero tells whether req has matchConfig's limit of 0.
func hasZero(req *rlsv3.RateLimitRequest) bool {
	for _, d := range req.Descriptors {
		if d.Entries[0].Key == "zero" {
			return true
		}
	}
	return false
}

// answerDiff says how b differs from a; durations until reset may differ
// by two seconds, the services' clocks read at different moments. With
// codesOnly (a call a limit of 0 refused, or where a limit in shadow mode
// went over), the overall codes and each status's code and limit are
// compared, not what is left or the RateLimit headers.
func answerDiff(a, b *rlsv3.RateLimitResponse, codesOnly bool) string {
	shown := "envoyproxy/ratelimit: " + compactAnswer(a) + "\nthe bridge:           " + compactAnswer(b)
	a, b = proto.Clone(a).(*rlsv3.RateLimitResponse), proto.Clone(b).(*rlsv3.RateLimitResponse)
	if m := a.DynamicMetadata; m != nil {
		// The version served says the quota mode here; later ones, which
		// the bridge follows, do not.
		delete(m.Fields, "quotaModeEnabled")
		delete(m.Fields, "quotaModeViolations")
		// A limit override is its message in protobuf's text format, whose
		// spacing protobuf-go varies on purpose from build to build.
		for _, d := range m.Fields["descriptors"].GetListValue().GetValues() {
			if l := d.GetStructValue().GetFields()["limit"]; l != nil {
				l.Kind = &structpb.Value_StringValue{StringValue: strings.Join(strings.Fields(l.GetStringValue()), " ")}
			}
		}
	}
	if codesOnly {
		// The headers speak of the status picked among those: the
		// bridge's of the limit of 0, or of the descriptor of a shared
		// counter it found over, where envoyproxy/ratelimit's may speak of
		// another.
		a.ResponseHeadersToAdd, b.ResponseHeadersToAdd = nil, nil
	}
	same := len(a.Statuses) == len(b.Statuses) && len(a.ResponseHeadersToAdd) == len(b.ResponseHeadersToAdd)
	for i := 0; same && i < len(a.ResponseHeadersToAdd); i++ {
		ha, hb := a.ResponseHeadersToAdd[i], b.ResponseHeadersToAdd[i]
		if i == 2 && hb.Key == ha.Key { // the reset, in seconds
			ra, _ := strconv.Atoi(ha.Value)
			rb, _ := strconv.Atoi(hb.Value)
			if ra-rb > 2 || rb-ra > 2 {
				same = false
			}
			ha.Value = hb.Value
		}
	}
	for i := 0; same && i < len(a.Statuses); i++ {
		sa, sb := a.Statuses[i], b.Statuses[i]
		if codesOnly && sb.CurrentLimit == nil && sa.CurrentLimit != nil {
			// Not decided by the bridge: a limit of 0 refused the call.
			sa.Code, sa.CurrentLimit, sa.LimitRemaining, sa.DurationUntilReset = sb.Code, nil, 0, nil
		}
		if codesOnly {
			// Where one in shadow mode went over, the bridge counted the
			// call in the others; envoyproxy/ratelimit, with
			// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, only in it.
			sa.LimitRemaining, sb.LimitRemaining = 0, 0
		}
		if d := sa.DurationUntilReset.AsDuration() - sb.DurationUntilReset.AsDuration(); d > 2*time.Second || d < -2*time.Second {
			same = false
		}
		sa.DurationUntilReset, sb.DurationUntilReset = nil, nil
	}
	if same && proto.Equal(a, b) {
		return ""
	}
	return shown
}

func compactAnswer(r *rlsv3.RateLimitResponse) string {
	out := r.OverallCode.String() + " ["
	for _, st := range r.Statuses {
		out += " " + st.Code.String()
		if l := st.CurrentLimit; l != nil {
			out += fmt.Sprintf(" %d/%s%s", l.RequestsPerUnit, l.Unit, l.Name)
		}
		out += fmt.Sprintf(" left %d reset %v;", st.LimitRemaining, st.DurationUntilReset.AsDuration().Round(time.Second))
	}
	out += " ]"
	for _, h := range r.ResponseHeadersToAdd {
		out += " " + h.Key + ": " + h.Value
	}
	if r.DynamicMetadata != nil {
		out += " metadata " + prototext.MarshalOptions{}.Format(r.DynamicMetadata)
	}
	return out
}

func compactCall(r *rlsv3.RateLimitRequest) string {
	out := fmt.Sprintf("hits %d:", r.HitsAddend)
	for _, d := range r.Descriptors {
		out += " {"
		for _, e := range d.Entries {
			out += e.Key + "=" + e.Value + " "
		}
		if d.HitsAddend != nil {
			out += fmt.Sprintf("hits %d", d.HitsAddend.Value)
		}
		if d.Limit != nil {
			out += fmt.Sprintf("limit %d/%s", d.Limit.RequestsPerUnit, d.Limit.Unit)
		}
		out += "}"
	}
	return out
}

// TestLong_RLS_ConfigReadAsEnvoyRatelimit loads each configuration below
// into envoyproxy/ratelimit and reads back the limits it holds
// (/rlconfig), and compares them with the bridge's reading of the same
// file (rls.Parse, and its /rlconfig format): both refuse it, or both hold
// the same limits at the same places. They are YAML 1.1's corners: scalars
// YAML reads as numbers or true/false in text fields, which a descriptor
// matches as written there, and numbers that service refuses. Every
// configuration accepted has a limit, so that one refused (which leaves it
// holding nothing) shows. Metadata is left out: the version the module
// proxy serves predates it (TestParse_ScalarsAsWritten follows the later
// source).
func TestLong_RLS_ConfigReadAsEnvoyRatelimit(t *testing.T) {
	bin := envoyRatelimitBinary(t)
	rs := redistest.Start(t)
	limit := "\n    rate_limit: {unit: second, requests_per_unit: 1}"
	for _, tt := range []struct{ name, yaml string }{
		{"leading zeros", "domain: d\ndescriptors:\n  - key: account\n    value: 007" + limit},
		{"hexadecimal, octal, binary", "domain: d\ndescriptors:\n  - key: a\n    value: 0x1F" + limit + "\n  - key: b\n    value: 0o17" + limit + "\n  - key: c\n    value: 0b101" + limit},
		{"underscores and a sign", "domain: d\ndescriptors:\n  - key: a\n    value: 1_000" + limit + "\n  - key: b\n    value: +5" + limit + "\n  - key: c\n    value: -7" + limit},
		{"yes, on, y, true", "domain: d\ndescriptors:\n  - key: a\n    value: yes" + limit + "\n  - key: b\n    value: On" + limit + "\n  - key: c\n    value: y" + limit + "\n  - key: d\n    value: TRUE" + limit},
		{"no, off, n, false", "domain: d\ndescriptors:\n  - key: a\n    value: no" + limit + "\n  - key: b\n    value: off" + limit + "\n  - key: c\n    value: n" + limit},
		{"null", "domain: d\ndescriptors:\n  - key: a\n    value: ~" + limit + "\n  - key: b\n    value: null\n    descriptors:\n      - key: c" + limit},
		{"a number as the key and the domain", "domain: 0123\ndescriptors:\n  - key: 404\n    value: 200" + limit},
		{"names as written", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: 007}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: 007}]}"},
		{"requests_per_unit written otherwise", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 0x10}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1_000}\n  - key: c\n    rate_limit: {unit: second, requests_per_unit: 010}"},
		{"a timestamp", "domain: d\ndescriptors:\n  - key: day\n    value: 2001-12-14" + limit},
		{"sexagesimal", "domain: d\ndescriptors:\n  - key: a\n    value: 12:30:00" + limit},
		{"quoted", "domain: d\ndescriptors:\n  - key: a\n    value: '1.10'" + limit + "\n  - key: b\n    value: \"007\"" + limit},
		{"a fraction refused", "domain: d\ndescriptors:\n  - key: version\n    value: 1.10" + limit},
		{"an exponent refused", "domain: d\ndescriptors:\n  - key: a\n    value: 1e3" + limit},
		{"infinity refused", "domain: d\ndescriptors:\n  - key: a\n    value: .inf" + limit},
		{"beyond int64 refused", "domain: d\ndescriptors:\n  - key: a\n    value: 18446744073709551615" + limit},
		{"a fractional requests_per_unit refused", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5.0}"},
		{"a key that is not text refused", "domain: d\ndescriptors:\n  - key: a\n    1: x" + limit},
	} {
		t.Run(tt.name, func(t *testing.T) {
			them := startEnvoyRatelimit(t, bin, rs.Addr, map[string]string{"config.yaml": tt.yaml})
			res, err := http.Get("http://" + them.debug + "/rlconfig")
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(res.Body)
			res.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSuffix(string(body), "\n"), "\n")
			slices.Sort(lines)
			theirs := strings.Join(lines, "\n")
			c, err := rls.Parse(map[string][]byte{"config.yaml": []byte(tt.yaml)}, false)
			switch {
			case err != nil && theirs != "":
				t.Fatalf("refused here (%v), there it holds:\n%s", err, theirs)
			case err == nil && theirs == "":
				t.Fatalf("refused there, here it holds:\n%s", c.Dump())
			case err == nil && strings.TrimSuffix(c.Dump(), "\n") != theirs:
				t.Fatalf("here:\n%s\nthere:\n%s", c.Dump(), theirs)
			}
		})
	}
}
