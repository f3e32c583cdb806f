package rules

import (
	"net/url"
	"strings"
	"testing"
)

func TestQueryHolds(t *testing.T) {
	format := func(v string) *FieldMatch { return &FieldMatch{Name: "format", Value: v} }
	present := &FieldMatch{Name: "format", Present: true}
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
	f.Add("format=csv", "format", "csv", false)
	f.Add("format=json&format=cs%76", "format", "csv", false)
	f.Add("a+b=c+d&a%20b=", "a b", "c d", false)
	f.Add("x=&x=1", "x", "", true)
	f.Add("x&&x=", "x", "", false)
	f.Fuzz(func(t *testing.T, query, name, value string, present bool) {
		if name == "" || strings.ContainsAny(query, ";#") {
			return
		}
		vals, err := url.ParseQuery(query)
		if err != nil {
			return
		}
		want := false
		for _, v := range vals[name] {
			if present && v != "" || !present && v == value {
				want = true
			}
		}
		fm := &FieldMatch{Name: name, Value: value, Present: present}
		if got := queryHolds("/p?"+query, fm); got != want {
			t.Errorf("queryHolds(%q, %+v) = %v; net/url reads %v", "/p?"+query, *fm, got, vals)
		}
	})
}
