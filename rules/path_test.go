package rules

import (
	"strings"
	"testing"
)

func TestParsePathPattern(t *testing.T) {
	tests := []struct {
		in      string
		kind    PatternKind
		text    string
		segs    []string
		wantErr string
	}{
		{in: "/api/v1/login", kind: PatternExact, text: "/api/v1/login"},
		{in: "/", kind: PatternExact, text: "/"},
		{in: "prefix:/api/v", kind: PatternPrefix, text: "/api/v"},
		{in: "prefix:/", kind: PatternPrefix, text: "/"},
		{in: "/files/*.json", kind: PatternGlob, segs: []string{"files", "*.json"}},
		{in: "/v1/*/items", kind: PatternGlob, segs: []string{"v1", "*", "items"}},
		{in: "/api/**", kind: PatternSubtree, text: "/api", segs: []string{"api", "**"}},
		{in: "/**", kind: PatternSubtree, segs: []string{"**"}},
		{in: "/a/*/**", kind: PatternGlob, segs: []string{"a", "*", "**"}},
		{in: "/a/**/b/**/c", kind: PatternGlob, segs: []string{"a", "**", "b", "**", "c"}},
		{in: "/a/*x*y*/", kind: PatternGlob, segs: []string{"a", "*x*y*", ""}},
		{in: "", wantErr: "empty"},
		{in: "api/v1", wantErr: `start with "/"`},
		{in: "*", wantErr: `start with "/"`},
		{in: "prefix:", wantErr: `start with "/"`},
		{in: "prefix:api", wantErr: `start with "/"`},
		{in: "/api/**x", wantErr: `"**" must be a whole segment`},
		{in: "/api/x**", wantErr: `"**" must be a whole segment`},
		{in: "/api/***", wantErr: `"**" must be a whole segment`},
		{in: "/" + strings.Repeat("a", MaxPathPatternLen), wantErr: "longer than 1024"},
		{in: "/api\x00", wantErr: "control byte"},
		{in: "/api\n/x", wantErr: "control byte"},
		{in: "/api\x7f", wantErr: "control byte"},
		{in: "/api?x=1", wantErr: `"?" or "#"`},
		{in: "/api#frag", wantErr: `"?" or "#"`},
	}
	for _, tt := range tests {
		name := tt.in
		if len(name) > 40 {
			name = name[:40]
		}
		t.Run(name, func(t *testing.T) {
			p, err := ParsePathPattern(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParsePathPattern(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePathPattern(%q): %v", tt.in, err)
			}
			if p.Kind != tt.kind || p.Text != tt.text || p.Raw != tt.in {
				t.Fatalf("got kind %d text %q raw %q, want kind %d text %q raw %q", p.Kind, p.Text, p.Raw, tt.kind, tt.text, tt.in)
			}
			if strings.Join(p.Segs, "|") != strings.Join(tt.segs, "|") || len(p.Segs) != len(tt.segs) {
				t.Fatalf("segs = %q, want %q", p.Segs, tt.segs)
			}
		})
	}
}

func TestPathPattern_Match(t *testing.T) {
	tests := []struct {
		pattern string
		path    string
		want    bool
	}{
		// exact
		{"/api/v1/login", "/api/v1/login", true},
		{"/api/v1/login", "/api/v1/login?next=/x", true},
		{"/api/v1/login", "/api/v1/login#top", true},
		{"/api/v1/login", "/api/v1/login/", false},
		{"/api/v1/login", "/api/v1/Login", false},
		{"/api/v1/login", "/api/v1/logins", false},
		{"/api/v1/login", "/api/v1", false},
		{"/api/v1/login", "", false},
		{"/", "/", true},
		{"/", "/?q", true},
		{"/", "/a", false},
		// prefix
		{"prefix:/api/v", "/api/v1/x", true},
		{"prefix:/api/v", "/api/v", true},
		{"prefix:/api/v", "/api/", false},
		{"prefix:/api/v", "/api?/v", false},
		{"prefix:/api/v", "/API/v1", false},
		// * within a segment
		{"/files/*.json", "/files/a.json", true},
		{"/files/*.json", "/files/.json", true},
		{"/files/*.json", "/files/a.json?x=1", true},
		{"/files/*.json", "/files/a/b.json", false},
		{"/files/*.json", "/files/a.jsonx", false},
		{"/files/*.json", "/files/a.JSON", false},
		{"/v1/*/items", "/v1/42/items", true},
		{"/v1/*/items", "/v1/42/43/items", false},
		{"/v1/*/items", "/v1/items", false},
		{"/v1/*/items", "/v1/42/items/", false},
		{"/v1/*", "/v1/x", true},
		{"/v1/*", "/v1/", true},
		{"/v1/*", "/v1", false},
		{"/v1/*", "/v1/x/y", false},
		{"/a/*x*y*", "/a/xy", true},
		{"/a/*x*y*", "/a/__x__y__", true},
		{"/a/*x*y*", "/a/__y__x__", false},
		{"/a/x*", "/a/x", true},
		{"/a/*a*a*a*a*b", "/a/" + strings.Repeat("a", 200), false},
		// ** as whole segments
		{"/api/**", "/api", true},
		{"/api/**", "/api/", true},
		{"/api/**", "/api/a/b", true},
		{"/api/**", "/api/a/b?q=1", true},
		{"/api/**", "/apix", false},
		{"/api/**", "/apix/a", false},
		{"/api/**", "/", false},
		{"/**", "/", true},
		{"/**", "/anything/at/all", true},
		{"/**", "", false},
		{"/**", "*", false},
		{"/**/x", "/x", true},
		{"/**/x", "/a/b/x", true},
		{"/**/x", "/a/b/x/y", false},
		{"/**/x", "/a/b/xx", false},
		{"/a/**/b", "/a/b", true},
		{"/a/**/b", "/a/x/y/b", true},
		{"/a/**/b", "/a/x/y/c", false},
		{"/a/**/b/**/c", "/a/b/c", true},
		{"/a/**/b/**/c", "/a/1/b/2/3/c", true},
		{"/a/**/b/**/c", "/a/1/c/2/b", false},
		{"/**/*.json", "/x/y/z.json", true},
		{"/**/*.json", "/x/y/z.json/w", false},
		{"/**/**/**/x", "/a/b/c/d/e/x", true},
		{"/**/**/**/x", "/a/b/c/d/e/y", false},
		{"/api/**/", "/api/x/", true},
		{"/api/**/", "/api/x", false},
		// a path that is not origin-form never matches a glob
		{"/**", "http://h/x", false},
	}
	for _, tt := range tests {
		p, err := ParsePathPattern(tt.pattern)
		if err != nil {
			t.Fatalf("ParsePathPattern(%q): %v", tt.pattern, err)
		}
		if got := p.Match(tt.path); got != tt.want {
			t.Errorf("%q.Match(%q) = %v, want %v", tt.pattern, tt.path, got, tt.want)
		}
		if tt.want != refMatchPath(&p, tt.path) {
			t.Errorf("reference matcher disagrees with the table for %q on %q", tt.pattern, tt.path)
		}
	}
}

func TestPathPattern_Match_zeroValue(t *testing.T) {
	var p PathPattern
	if p.Match("/") {
		t.Fatal("zero PathPattern matched")
	}
}

// TestPathPattern_Match_pathological checks that many "**" against a long
// path finish: a naive backtracking matcher takes exponential time here.
func TestPathPattern_Match_pathological(t *testing.T) {
	p, err := ParsePathPattern("/" + strings.Repeat("**/a/", 40) + "b")
	if err != nil {
		t.Fatal(err)
	}
	path := strings.Repeat("/a", 4000)
	// No deadline here: an exponential matcher would not return within the
	// test binary's timeout, which fails the test.
	if p.Match(path) {
		t.Fatal("matched a path without the final segment")
	}
	if !p.Match(path + "/b") {
		t.Fatal("did not match a path that ends in /b")
	}
}

// refMatchPath is an obviously correct, slow matcher.
func refMatchPath(p *PathPattern, path string) bool {
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	switch p.Kind {
	case PatternExact:
		return path == p.Text
	case PatternPrefix:
		return strings.HasPrefix(path, p.Text)
	case PatternGlob, PatternSubtree: // a subtree is a glob, matched by the same reference
		if !strings.HasPrefix(path, "/") {
			return false
		}
		return refSegs(p.Segs, strings.Split(path[1:], "/"))
	}
	return false
}

// refSegs and refGlob are the textbook dynamic programs: ok[i][j] says
// whether pat[i:] matches the input from j on.
func refSegs(pat, segs []string) bool {
	ok := make([][]bool, len(pat)+1)
	for i := range ok {
		ok[i] = make([]bool, len(segs)+1)
	}
	ok[len(pat)][len(segs)] = true
	for i := len(pat) - 1; i >= 0; i-- {
		for j := len(segs); j >= 0; j-- {
			if pat[i] == "**" {
				ok[i][j] = ok[i+1][j] || (j < len(segs) && ok[i][j+1])
			} else {
				ok[i][j] = j < len(segs) && refGlob(pat[i], segs[j]) && ok[i+1][j+1]
			}
		}
	}
	return ok[0][0]
}

func refGlob(pat, s string) bool {
	ok := make([][]bool, len(pat)+1)
	for i := range ok {
		ok[i] = make([]bool, len(s)+1)
	}
	ok[len(pat)][len(s)] = true
	for i := len(pat) - 1; i >= 0; i-- {
		for j := len(s); j >= 0; j-- {
			if pat[i] == '*' {
				ok[i][j] = ok[i+1][j] || (j < len(s) && ok[i][j+1])
			} else {
				ok[i][j] = j < len(s) && s[j] == pat[i] && ok[i+1][j+1]
			}
		}
	}
	return ok[0][0]
}

func FuzzPathPattern(f *testing.F) {
	for _, s := range [][2]string{
		{"/api/v1/login", "/api/v1/login"},
		{"prefix:/api/v", "/api/v2"},
		{"/files/*.json", "/files/a.json?x"},
		{"/api/**", "/api/a/b"},
		{"/api/**", "/api"},
		{"/api/**", "/apix"},
		{"/**", ""},
		{"/a/**/b/**/c", "/a/1/b/2/c"},
		{"/**/*x*", "/q/axb"},
		{"/v1/*/items", "/v1//items"},
		{"/x/**y", "/x/y"},
		{"", ""},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, path string) {
		p, err := ParsePathPattern(pattern)
		if err != nil {
			if p.Match(path) {
				t.Fatalf("a pattern that failed to parse matched: %q", pattern)
			}
			return
		}
		got := p.Match(path)
		if p.Kind == PatternExact {
			if !p.Match(pattern) {
				t.Fatalf("exact pattern %q does not match itself", pattern)
			}
			if want := stripQuery(path) == pattern; got != want {
				t.Fatalf("exact %q.Match(%q) = %v", pattern, path, got)
			}
		}
		// The reference is quadratic and allocates: keep inputs small.
		if len(pattern) <= 256 && len(path) <= 256 {
			if want := refMatchPath(&p, path); got != want {
				t.Fatalf("%q.Match(%q) = %v, reference says %v", pattern, path, got, want)
			}
		}
	})
}

func BenchmarkPathPattern_Match(b *testing.B) {
	for _, bc := range []struct{ name, pattern, path string }{
		{"exact", "/api/v1/login", "/api/v1/login?next=%2Fhome"},
		{"prefix", "prefix:/api/v1/", "/api/v1/users/42/orders"},
		{"glob", "/v1/*/items/*.json", "/v1/42/items/7.json"},
		{"doublestar", "/api/**/orders/*", "/api/v1/users/42/orders/9"},
		{"doublestar_miss", "/api/**/orders/*", "/api/v1/users/42/orders/9/x/y/z"},
		{"many_doublestar_long", "/**/**/**/x", strings.Repeat("/seg", 64) + "/y"},
	} {
		p, err := ParsePathPattern(bc.pattern)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p.Match(bc.path)
			}
		})
	}
}

// stripQuery cuts at the first '?' or '#' wherever it is, in a word or
// after the last whole one, and whatever the other bytes are.
// FuzzPathPattern checks it on any path through the matcher, whose
// reference cuts with strings.IndexAny.
func TestStripQuery(t *testing.T) {
	want := func(p string) string {
		if i := strings.IndexAny(p, "?#"); i >= 0 {
			return p[:i]
		}
		return p
	}
	for n := 0; n <= 40; n++ {
		base := []byte(strings.Repeat("/a-Z", 10)[:n])
		if got := stripQuery(string(base)); got != string(base) {
			t.Fatalf("stripQuery(%q) = %q", base, got)
		}
		for i := range n {
			for c := range 256 {
				b := append([]byte(nil), base...)
				b[i] = byte(c)
				if got, w := stripQuery(string(b)), want(string(b)); got != w {
					t.Fatalf("stripQuery(%q) = %q, want %q", b, got, w)
				}
			}
		}
	}
}
