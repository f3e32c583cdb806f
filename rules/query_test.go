package rules

import (
	"net/url"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/jwttest"
)

func TestQueryHolds(t *testing.T) {
	format := func(v string) *FieldMatch { return &FieldMatch{Name: "format", Op: FieldEquals, Value: v} }
	present := &FieldMatch{Name: "format", Op: FieldPresent}
	op := func(op FieldOp, v string) *FieldMatch { return &FieldMatch{Name: "format", Op: op, Value: v} }
	for _, tc := range []struct {
		path string
		fm   *FieldMatch
		want bool
	}{
		{"/r?format=csv", format("csv"), true},
		{"/r?format=json", format("csv"), false},
		{"/r", format("csv"), false},
		{"/r?", format(""), false},
		{"/r?a=1&format=csv&b=2", format("csv"), true},
		{"/r?format=json&format=csv", format("csv"), true}, // any of them, not only the first
		{"/r?format=cs%76", format("csv"), true},
		{"/r?form%61t=csv", format("csv"), true},
		{"/r?format=a+b", format("a b"), true},
		{"/r?format=a%2Bb", format("a+b"), true},
		{"/r?format=%zz", format("%zz"), true}, // not an escape: itself
		{"/r?format=%4", format("%4"), true},
		{"/r?format=%", format("%"), true},
		{"/r?format=csv%00", format("csv"), false},
		{"/r?format=csvx", format("csv"), false},
		{"/r?format=cs", format("csv"), false},
		{"/r?formats=csv", format("csv"), false},
		{"/r?Format=csv", format("csv"), false}, // names are case-sensitive
		{"/r?format=csv#x", format("csv"), true},
		{"/r#?format=csv", format("csv"), false}, // a fragment, not a query
		{"/r?a=1#&format=csv", format("csv"), false},
		{"/r?format", format(""), true}, // no '=': an empty value
		{"/r?format=", format(""), true},
		{"/r?format=&x", present, false},
		{"/r?format", present, false},
		{"/r?format=&format=1", present, true},
		{"/r?format=%20", present, true},
		{"/r?x=1&&format=csv", format("csv"), true},
		{"/r?a=format%3Dcsv", format("csv"), false},
		{"/r?format=csv.gz", op(FieldPrefix, "csv"), true},
		{"/r?format=x&format=c%73v.gz", op(FieldPrefix, "csv"), true},
		{"/r?format=gz.csv", op(FieldPrefix, "csv"), false},
		{"/r?format=a.c%73v", op(FieldSuffix, "csv"), true},
		{"/r?format=a+csv+b", op(FieldContains, " csv "), true},
		{"/r?format=a%2Bcsv", op(FieldContains, "+csv"), true},
		{"/r?format=" + strings.Repeat("%41", 300), op(FieldSuffix, "AAA"), true}, // longer than the stack buffer
		{"/r?format=acs", op(FieldContains, "csv"), false},
	} {
		if got := queryHolds(tc.path, tc.fm); got != tc.want {
			t.Errorf("queryHolds(%q, %+v) = %v, want %v", tc.path, *tc.fm, got, tc.want)
		}
	}
}

// A rule matches on the path's query parameters, decoded; the plan cache
// keeps a plan for the path with its query, so a request with another
// query is evaluated anew.
func TestConfig_EvaluateQuery(t *testing.T) {
	c := mustConfig(t, `{"rules":[
		{"name":"csv","match":{"paths":["/reports/**"],"query":[{"name":"format","equals":"csv"}]},"scope":"ip","limit":1,"window":"1s"},
		{"name":"no-page","match":{"query":[{"name":"page","present":false}]},"scope":"ip","limit":1,"window":"1s"}]}`)
	var pc PlanCache
	var plan Plan
	rules := func(path string) string {
		r := &Request{Method: "GET", Path: path, Source: "1.2.3.4:5", Headers: mapHeaders{}}
		if kept, _, ok := pc.Lookup(c, r); ok {
			plan.CopyFrom(kept)
		} else {
			pc.Evaluate(c, r, &plan)
			pc.Keep(c, r, &plan, 0)
		}
		out := ""
		for _, l := range plan.Limits {
			out += l.Rule + " "
		}
		return out
	}
	for _, tc := range []struct{ path, want string }{
		{"/reports/a?format=csv", "csv no-page "},
		{"/reports/a?format=json", "no-page "},
		{"/reports/a?format=csv&page=2", "csv "},
		{"/reports/a?format=c%73v&page=", "csv no-page "},
		{"/other?format=csv&page=1", ""},
		{"/reports/a?format=csv", "csv no-page "}, // from the plan cache
		{"/reports/a?format=json", "no-page "},
	} {
		if got := rules(tc.path); got != tc.want {
			t.Errorf("%s: rules %q, want %q", tc.path, got, tc.want)
		}
	}
}

// queryHolds decides as net/url's parsing of the query would, wherever
// that parsing accepts the query (its escapes are all valid, no ';').
func FuzzQueryHolds(f *testing.F) {
	f.Add("format=csv", "format", "csv", uint8(FieldEquals))
	f.Add("format=json&format=cs%76", "format", "csv", uint8(FieldEquals))
	f.Add("a+b=c+d&a%20b=", "a b", "c d", uint8(FieldEquals))
	f.Add("x=&x=1", "x", "", uint8(FieldPresent))
	f.Add("x&&x=", "x", "", uint8(FieldEquals))
	f.Add("q=a%2Bselect+b", "q", "+select ", uint8(FieldContains))
	f.Add("f=x.c%73v", "f", ".csv", uint8(FieldSuffix))
	f.Fuzz(func(t *testing.T, query, name, value string, op uint8) {
		fm := &FieldMatch{Name: name, Op: FieldOp(op%uint8(FieldContains) + 1), Value: value}
		if fm.Op == FieldPresent {
			fm.Value = ""
		}
		if name == "" || fm.Op > FieldEquals && value == "" || strings.ContainsAny(query, ";#") {
			return // names and these texts are never empty; net/url refuses ';'
		}
		vals, err := url.ParseQuery(query)
		if err != nil {
			return
		}
		want := false
		for _, v := range vals[name] {
			want = want || fm.holds(v)
		}
		if got := queryHolds("/p?"+query, fm); got != want {
			t.Errorf("queryHolds(%q, %+v) = %v; net/url reads %v", "/p?"+query, *fm, got, vals)
		}
	})
}

func TestFieldMatch_Holds(t *testing.T) {
	for _, tc := range []struct {
		op      FieldOp
		text, v string
		want    bool
	}{
		{FieldPresent, "", "x", true},
		{FieldPresent, "", "", false},
		{FieldEquals, "abc", "abc", true},
		{FieldEquals, "abc", "ABC", false},
		{FieldEquals, "", "", true},
		{FieldPrefix, "curl/", "curl/8.5", true},
		{FieldPrefix, "curl/", "Curl/8.5", false},
		{FieldPrefix, "curl/", "", false},
		{FieldSuffix, ".internal", "a.internal", true},
		{FieldSuffix, ".internal", "a.internal.x", false},
		{FieldContains, "bot", "a-bot-b", true},
		{FieldContains, "bot", "b-o-t", false},
		{0, "", "x", false},
	} {
		m := &FieldMatch{Name: "h", Op: tc.op, Value: tc.text}
		if got := m.holds(tc.v); got != tc.want {
			t.Errorf("%s %q holds(%q) = %v, want %v", tc.op, tc.text, tc.v, got, tc.want)
		}
	}
}

// A header condition's op and invert, through Evaluate.
func TestConfig_EvaluateHeaderOps(t *testing.T) {
	c := mustConfig(t, `{"rules":[
		{"name":"scripts","match":{"headers":[{"name":"user-agent","prefix":"curl/"}]},"scope":"ip","limit":1,"window":"1s"},
		{"name":"not-internal","match":{"headers":[{"name":"x-from","suffix":".internal","invert":true}]},"scope":"ip","limit":1,"window":"1s"}]}`)
	var plan Plan
	rules := func(h mapHeaders) string {
		c.Evaluate(&Request{Method: "GET", Path: "/", Source: "1.2.3.4:5", Headers: h}, &plan)
		out := ""
		for _, l := range plan.Limits {
			out += l.Rule + " "
		}
		return out
	}
	for _, tc := range []struct {
		h    mapHeaders
		want string
	}{
		{mapHeaders{"user-agent": "curl/8.5", "x-from": "a.internal"}, "scripts "},
		{mapHeaders{"user-agent": "Mozilla/5.0"}, "not-internal "},
		{mapHeaders{"user-agent": "curl/8.5", "x-from": "a.internal.example"}, "scripts not-internal "},
	} {
		if got := rules(tc.h); got != tc.want {
			t.Errorf("%v: rules %q, want %q", tc.h, got, tc.want)
		}
	}
}

// Deciding on a query allocates nothing, a decoded value included.
func TestQueryHolds_Allocs(t *testing.T) {
	fm := &FieldMatch{Name: "format", Op: FieldSuffix, Value: "csv"}
	path := "/r?a=1&format=x%2Ec%73v"
	if n := testing.AllocsPerRun(100, func() {
		if !queryHolds(path, fm) {
			t.Fatal("does not hold")
		}
	}); n != 0 {
		t.Errorf("%v allocations per decision", n)
	}
}

func BenchmarkQueryHolds(b *testing.B) {
	for _, bc := range []struct {
		name, path string
		fm         FieldMatch
	}{
		{"equals", "/api/v1/reports/42?page=2&format=csv", FieldMatch{Name: "format", Op: FieldEquals, Value: "csv"}},
		{"suffix-decoded", "/api/v1/reports/42?page=2&format=x%2Ec%73v", FieldMatch{Name: "format", Op: FieldSuffix, Value: ".csv"}},
		{"no-query", "/api/v1/reports/42", FieldMatch{Name: "format", Op: FieldEquals, Value: "csv"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				queryHolds(bc.path, &bc.fm)
			}
		})
	}
}

// The user id and the API key from query parameters: the first of the
// name, decoded, so that an encoding of the same id counts as it; the API
// key's header first.
func TestConfig_EvaluateQueryIdentity(t *testing.T) {
	c := mustConfig(t, `{"identity":{"sources":[{"type":"query","param":"user"}],"api_key_header":"x-api-key","api_key_query":"key"},
		"rules":[{"name":"u","scope":"user","limit":1,"window":"1s"},{"name":"k","scope":"api_key","limit":1,"window":"1s"}]}`)
	var plan Plan
	for _, tc := range []struct {
		path       string
		h          mapHeaders
		user, from string
		key        string
	}{
		{"/r?user=alice&key=k1", mapHeaders{}, "alice", "query", "k1"},
		{"/r?user=al%69ce&key=k%31", mapHeaders{}, "alice", "query", "k1"},
		{"/r?user=bob&user=alice", mapHeaders{}, "bob", "query", ""},
		{"/r?user=a+b&key=k1", mapHeaders{"x-api-key": "k2"}, "a b", "query", "k2"},
		{"/r?users=alice", mapHeaders{}, "", "", ""},
		{"/r?user=" + strings.Repeat("u", 256), mapHeaders{}, "", "", ""},
	} {
		c.Evaluate(&Request{Method: "GET", Path: tc.path, Source: "192.0.2.1:5", Headers: tc.h}, &plan)
		if id := plan.Identity; id.User != tc.user || plan.IdentitySource != tc.from || id.APIKey != tc.key {
			t.Errorf("%s %v: user %q from %q, key %q; want %q from %q, key %q", tc.path, tc.h, id.User, plan.IdentitySource, id.APIKey, tc.user, tc.from, tc.key)
		}
	}
	// Decoded, an id counts as itself: the same counter keys.
	keys := func(path string) string {
		c.Evaluate(&Request{Method: "GET", Path: path, Source: "192.0.2.1:5", Headers: mapHeaders{}}, &plan)
		return string(plan.Limits[0].Key) + " " + string(plan.Limits[1].Key)
	}
	if a, b := keys("/r?user=alice&key=k1"), keys("/r?key=%6b1&user=%61lice"); a != b {
		t.Errorf("keys %q and, encoded, %q", a, b)
	}
	r := &Request{Method: "GET", Path: "/r?key=%6b1&user=%61lice", Source: "192.0.2.1:5", Headers: mapHeaders{}}
	if n := testing.AllocsPerRun(100, func() { c.Evaluate(r, &plan) }); n != 0 {
		t.Errorf("%v allocations per evaluation", n)
	}
}

// A JWT source may take its token from a query parameter, verified as a
// header's is, through the token cache or not; the header is not read.
func TestConfig_EvaluateJWTFromQuery(t *testing.T) {
	c := mustConfig(t, `{"identity":{"sources":[{"type":"jwt","param":"access_token","keys":[{"alg":"HS256","secret":"`+cacheSecret+`"}]}]},
		"rules":[{"name":"u","scope":"user","limit":1,"window":"1s"}]}`)
	good := jwttest.HS256(cacheSecret, `{"sub":"alice","exp":2000}`)
	forged := jwttest.HS256("another-secret-0123456789abcdef0123", `{"sub":"mallory","exp":2000}`)
	var plan Plan
	for _, tc := range []struct {
		path  string
		h     mapHeaders
		user  string
		error bool
	}{
		{"/r?access_token=" + good, mapHeaders{}, "alice", false},
		{"/r?x=1&access_token=" + good + "&access_token=" + forged, mapHeaders{}, "alice", false},
		{"/r?access_token=" + forged, mapHeaders{}, "", true},
		{"/r", mapHeaders{"authorization": "Bearer " + good}, "", false}, // the header is not this source's
	} {
		for _, tokens := range []*TokenCache{nil, NewTokenCache(4)} {
			r := &Request{Method: "GET", Path: tc.path, Source: "192.0.2.1:5", Headers: tc.h, NowUnix: 1000, Tokens: tokens}
			c.Evaluate(r, &plan)
			if plan.Identity.User != tc.user || (plan.JWTError != nil) != tc.error {
				t.Errorf("%.40s… (cache %v): user %q, error %v; want %q, error %v", tc.path, tokens != nil, plan.Identity.User, plan.JWTError, tc.user, tc.error)
			}
		}
	}
}
