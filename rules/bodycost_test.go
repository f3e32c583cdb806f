package rules

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// readCost reads body in pieces of at most n bytes (0: whole).
func readCost(path []string, sse bool, body string, n int) (int64, bool) {
	var b BodyCost
	b.Reset(path, sse)
	for n > 0 && len(body) > n {
		b.Write([]byte(body[:n]))
		body = body[n:]
	}
	b.Write([]byte(body))
	return b.Cost()
}

func TestBodyCost_Cost(t *testing.T) {
	usage := []string{"usage", "total_tokens"}
	tests := []struct {
		name  string
		path  []string
		sse   bool
		body  string
		want  int64
		found bool
	}{
		{"a chat completion", usage, false, `{"id":"c-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",
			"content":"\"usage\": {\"total_tokens\": 9}"}}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12},"system_fingerprint":null}`, 12, true},
		{"the path's keys elsewhere", usage, false, `{"data":{"usage":{"total_tokens":3}},"items":[{"usage":{"total_tokens":4}}],"usage":{"total_tokens":12}}`, 12, true},
		{"spaces", usage, false, " {\n \"usage\" :\t{ \"total_tokens\" : 12 } }\n", 12, true},
		{"an escaped key", usage, false, `{"us\u0061ge":{"total\u005ftokens":4}}`, 4, true},
		{"an escaped key that differs", usage, false, `{"us\u00e4ge":{"total_tokens":4},"usage\n":{"total_tokens":5}}`, 0, false},
		{"the first of a key given twice", usage, false, `{"usage":{"total_tokens":4,"total_tokens":5}}`, 4, true},
		{"null", usage, false, `{"usage":null}`, 0, false},
		{"an object at the path", usage, false, `{"usage":{"total_tokens":{"n":4}}}`, 0, false},
		{"a fraction", usage, false, `{"usage":{"total_tokens":12.5}}`, 0, false},
		{"an exponent", usage, false, `{"usage":{"total_tokens":1e3}}`, 0, false},
		{"negative", usage, false, `{"usage":{"total_tokens":-3}}`, 0, false},
		{"a string", usage, false, `{"usage":{"total_tokens":"12"}}`, 0, false},
		{"capped", usage, false, `{"usage":{"total_tokens":123456789012345678901234567890}}`, MaxLimitValue, true},
		{"one key", []string{"cost"}, false, `{"a":[1,2,{"cost":3}],"cost":7}`, 7, true},
		{"not JSON", usage, false, `<html>usage</html>`, 0, false},
		{"cut short", usage, false, `{"usage":{"total_tokens":12`, 0, false},
		{"an array at the top", usage, false, `[{"usage":{"total_tokens":12}}]`, 0, false},
		{"too deep to follow", usage, false, strings.Repeat("[", 70) + strings.Repeat("]", 70), 0, false},
		{"deep, and the path after", usage, false, `{"x":` + strings.Repeat("[", 60) + strings.Repeat("]", 60) + `,"usage":{"total_tokens":6}}`, 6, true},
		{"a stream of chat completion chunks", usage, true, "data: {\"id\":\"1\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n" +
			"data: {\"id\":\"1\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n" +
			"data: [DONE]\n\n", 7, true},
		{"the last data line that has it", usage, true, "event: message\r\ndata:{\"usage\":{\"total_tokens\":3}}\r\n\r\n: ping\r\n" +
			"data: {\"usage\":{\"total_tokens\":8}}\r\n\r\ndata: {\"usage\":null}\r\n\r\n", 8, true},
		{"a stream's line that is not data", usage, true, "event: {\"usage\":{\"total_tokens\":3}}\nid: 1\n\n", 0, false},
		{"a data line without its end", usage, true, "data: {\"usage\":{\"total_tokens\":9}}", 9, true},
		{"a stream read as JSON", usage, false, "data: {\"usage\":{\"total_tokens\":9}}\n\n", 0, false},
	}
	for _, tc := range tests {
		for _, n := range []int{0, 1, 2, 3, 7} {
			if got, found := readCost(tc.path, tc.sse, tc.body, n); got != tc.want || found != tc.found {
				t.Errorf("%s, in pieces of %d: %d, %v; want %d, %v", tc.name, n, got, found, tc.want, tc.found)
			}
		}
	}
}

// BodyCost finds what gjson finds at the path in a valid JSON document,
// whatever the pieces the body comes in; in an event stream of two data
// lines, the second's number when it has one, else the first's.
func FuzzBodyCost(f *testing.F) {
	f.Add(`{"usage":{"total_tokens":12}}`, `{"usage":null}`, uint8(0x1d), []byte{3, 9})
	f.Add(`{"a":{"b":[1,{"c":2}],"c":3},"b":{"c":"x"}}`, `{"b":{"c":4}}`, uint8(0x63), []byte{1})
	f.Add(`{"us\u0061ge":{"total_tokens":1e2},"usage":{"total_tokens":5}}`, `[]`, uint8(0x1d), []byte{})
	keys := []string{"usage", "total_tokens", "a", "b", "c"}
	f.Fuzz(func(t *testing.T, d1, d2 string, pick uint8, cuts []byte) {
		path := []string{keys[pick%5]}
		if pick >= 5 {
			path = append(path, keys[pick/5%5])
		}
		if pick >= 25 {
			path = append(path, keys[pick/25%5])
		}
		want := func(doc string) (int64, bool) {
			r := gjson.Get(doc, strings.Join(path, "."))
			if r.Type != gjson.Number {
				return 0, false
			}
			return HeaderCost(r.Raw) // digits only: a non-negative integer
		}
		read := func(sse bool, body string) (int64, bool) {
			var b BodyCost
			b.Reset(path, sse)
			for _, c := range cuts {
				n := min(int(c)%8, len(body))
				b.Write([]byte(body[:n]))
				body = body[n:]
			}
			b.Write([]byte(body))
			return b.Cost()
		}
		if !gjson.Valid(d1) {
			return
		}
		w, wok := want(d1)
		if got, ok := read(false, d1); got != w || ok != wok {
			t.Fatalf("%s at %v: %d, %v; gjson %d, %v", d1, path, got, ok, w, wok)
		}
		if !gjson.Valid(d2) || strings.ContainsAny(d1+d2, "\r\n") {
			return
		}
		if w2, ok2 := want(d2); ok2 {
			w, wok = w2, ok2
		}
		stream := "data: " + d1 + "\n\nevent: x\ndata:" + d2 + "\n\n"
		if got, ok := read(true, stream); got != w || ok != wok {
			t.Fatalf("%q at %v: %d, %v; want %d, %v", stream, path, got, ok, w, wok)
		}
	})
}

func BenchmarkBodyCost(b *testing.B) {
	body := []byte(`{"id":"c-1","object":"chat.completion","created":1767225600,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("lorem ipsum ", 80) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`)
	path := []string{"usage", "total_tokens"}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var c BodyCost
	for b.Loop() {
		c.Reset(path, false)
		c.Write(body)
		if n, ok := c.Cost(); !ok || n != 12 {
			b.Fatal(n, ok)
		}
	}
}
