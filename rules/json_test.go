package rules

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

func TestAppendJSONString(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", `""`},
		{"plain", `"plain"`},
		{"josé", `"josé"`},
		{"日本😀", `"日本😀"`},
		{"\ufffd", "\"\ufffd\""}, // a real U+FFFD is text, not an error
		{`q"b\`, `"q\"b\\"`},
		{"a\nb\r\tc", `"a\nb\r\tc"`},
		{"\x00\x1f\x7f", `"\u0000\u001f\u007f"`},
		{"a\xffb", `"a\ufffdb"`},
		{"\xc3", `"\ufffd"`},                     // truncated sequence
		{"\xed\xa0\x80", `"\ufffd\ufffd\ufffd"`}, // an encoded surrogate is not UTF-8
		{"\xc0\xaf", `"\ufffd\ufffd"`},           // overlong
		{"\u2028", "\"\u2028\""},
	}
	for _, tc := range tests {
		if got := string(AppendJSONString([]byte("x"), tc.in)); got != "x"+tc.want {
			t.Errorf("AppendJSONString(%q) = %s, want %s", tc.in, got[1:], tc.want)
		}
		if got := string(AppendJSONBytes(nil, []byte(tc.in))); got != tc.want {
			t.Errorf("AppendJSONBytes(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// validPerByte is what a JSON reader gets back for s: each byte that is
// not part of valid UTF-8 replaced by U+FFFD.
func validPerByte(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// Whatever the input, the output is one JSON string that encoding/json
// reads back as the input with bad bytes replaced, and holds no raw
// control byte (one event stays one log line).
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "josé", "a\xffb", "\xed\xa0\x80", "\"\\\n\x00\x7f", "\U0010ffff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := AppendJSONString(nil, s)
		var got string
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%q → %s: not JSON: %v", s, out, err)
		}
		if want := validPerByte(s); got != want {
			t.Fatalf("%q → %s reads back as %q, want %q", s, out, got, want)
		}
		if want := appendJSONByByte(nil, s); string(out) != string(want) {
			t.Fatalf("%q → %s, byte by byte %s", s, out, want)
		}
		if !utf8.Valid(out) {
			t.Fatalf("%q → %q is not UTF-8", s, out)
		}
		for _, c := range out {
			if c < 0x20 || c == 0x7f {
				t.Fatalf("%q → %q holds the raw byte %#x", s, out, c)
			}
		}
	})
}

// appendJSONByByte is AppendJSONString one byte at a time, without the
// word-at-a-time scan: what it must write.
func appendJSONByByte(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c >= 0x20 && c < 0x7f && c != '"' && c != '\\':
			dst = append(dst, c)
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, `\ufffd`...)
			} else {
				dst = append(dst, s[i:i+size]...)
			}
			i += size
			continue
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c == '\n':
			dst = append(dst, `\n`...)
		case c == '\r':
			dst = append(dst, `\r`...)
		case c == '\t':
			dst = append(dst, `\t`...)
		default:
			dst = append(dst, fmt.Sprintf(`\u%04x`, c)...)
		}
		i++
	}
	return append(dst, '"')
}

// plainASCII8 answers for a word what its bytes answer one by one: every
// byte value in every position of a plain word, and random words.
func TestPlainASCII8(t *testing.T) {
	plain := func(c byte) bool { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\' }
	check := func(w [8]byte) {
		want := true
		for _, c := range w {
			want = want && plain(c)
		}
		if got := plainASCII8(binary.LittleEndian.Uint64(w[:])); got != want {
			t.Fatalf("%q: %v, want %v", w, got, want)
		}
	}
	for pos := range 8 {
		for c := range 256 {
			w := [8]byte{'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a'}
			w[pos] = byte(c)
			check(w)
			w[(pos+3)%8] = 0xff // a carry out of another byte
			check(w)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], r.Uint64())
		for i := range w {
			if r.IntN(4) > 0 { // mostly plain, so that single bad bytes are tried
				w[i] = byte(0x20 + r.IntN(0x5f))
			}
		}
		check(w)
	}
}

func BenchmarkAppendJSONString(b *testing.B) {
	for _, tc := range []struct{ name, s string }{
		{"ascii", "0f8fad5b-d9cb-469f-a165-70867728950e"},
		{"utf8", "/api/v1/café/ユーザー"},
		{"escapes", "a\"b\\c\nd\xffe"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var buf []byte
			b.ReportAllocs()
			b.SetBytes(int64(len(tc.s)))
			for i := 0; i < b.N; i++ {
				buf = AppendJSONString(buf[:0], tc.s)
			}
		})
	}
}

func TestRepeatedName(t *testing.T) {
	for _, tt := range []struct {
		json, path string
		found      bool
	}{
		{`{}`, "", false},
		{`{"a":1,"b":{"a":1},"l":[{"a":1},{"a":2}]}`, "", false},
		{`{"a":1,"a":1}`, "a", true},
		{`{"a":1,"b":2,"A":3,"b":4}`, "b", true},
		{`{"s\u0075b":1,"sub":2}`, "sub", true},
		{`{"x":{"y":{"z":1,"z":2}}}`, "x.y.z", true},
		{`{"checks":[{"cost":1},{"cost":1,"cost":2}]}`, "checks[1].cost", true},
		{`[[{"a":1}],[{"b":1,"b":1}]]`, "[1][0].b", true},
		{`{"k":1,"v":{"k":1,"k":2},"k":3}`, "v.k", true}, // the first found, depth first
		{`"text"`, "", false},
		{`{"n0":0,"n1":1,"n2":2,"n3":3,"n4":4,"n5":5,"n6":6,"n7":7,"n8":8,"n9":9,"n10":10,"n11":11,"n12":12,"n13":13,"n14":14,"n15":15,"n16":16,"n3":17}`, "n3", true},
	} {
		path, found := RepeatedName(gjson.Parse(tt.json))
		if path != tt.path || found != tt.found {
			t.Errorf("RepeatedName(%s) = %q, %v; want %q, %v", tt.json, path, found, tt.path, tt.found)
		}
	}
}

func BenchmarkRepeatedName(b *testing.B) {
	claims := gjson.Parse(`{"sub":"alice","iss":"https://issuer.example","aud":["api","web"],"exp":1750000100,"iat":1749990000,"plan":"premium","org":{"id":"o1","role":"admin"}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, dup := RepeatedName(claims); dup {
			b.Fatal("a name twice")
		}
	}
}
