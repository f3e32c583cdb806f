package wasmhost

import (
	"bufio"
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/wasmhost/internal/fields"
)

// bridgeAnswer is a check answer as the bridge sends it.
const bridgeAnswer = "HTTP/1.1 200 OK\r\nX-Request-Id: req_1\r\nContent-Type: application/json\r\nX-Ratelimit-Limit: 10\r\n" +
	"X-Ratelimit-Remaining: 9\r\nX-Ratelimit-Reset: 1795778394\r\nX-Ratelimit-Strategy: fixed_window\r\n" +
	"Date: Fri, 27 Nov 2026 11:19:53 GMT\r\nContent-Length: 14\r\n\r\n{\"allowed\":1}\n"

// Answers of the usual shape are read without net/http, in the order
// their headers came; any other is left unread for http.ReadResponse.
func TestReadPlainAnswer(t *testing.T) {
	fast := []struct {
		name, answer string
		want         fields.Map
		body         string
	}{
		{"the bridge's", bridgeAnswer + "HTTP/1.1 200", fields.Map{{":status", "200"}, {"x-request-id", "req_1"},
			{"content-type", "application/json"}, {"x-ratelimit-limit", "10"}, {"x-ratelimit-remaining", "9"},
			{"x-ratelimit-reset", "1795778394"}, {"x-ratelimit-strategy", "fixed_window"},
			{"date", "Fri, 27 Nov 2026 11:19:53 GMT"}, {"content-length", "14"}}, "{\"allowed\":1}\n"},
		{"no reason, spaces, repeats", "HTTP/1.1 503\r\nA: \t x y \t\r\nA:2\r\ncontent-LENGTH: 0\r\n\r\n",
			fields.Map{{":status", "503"}, {"a", "x y"}, {"a", "2"}, {"content-length", "0"}}, ""},
	}
	for _, tc := range fast {
		r := bufio.NewReader(strings.NewReader(tc.answer))
		hm, body, ok, err := readPlainAnswer(r, 1<<20)
		if !ok || err != nil {
			t.Fatalf("%s: ok %v, %v", tc.name, ok, err)
		}
		if !slices.Equal(hm, tc.want) || string(body) != tc.body {
			t.Errorf("%s: %q %q, want %q %q", tc.name, hm, body, tc.want, tc.body)
		}
	}
	for _, answer := range []string{
		"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 304 Not Modified\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
		"HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\nx",
		"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx",
		"HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nA: b\r\n  folded\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nA: caf\xc3\xa9\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nA b: c\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\n\r\n",                  // no length: read to the end
		"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n", // the head is not all there
		"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\n" + strings.Repeat("A: b\r\n", maxPlainHeaders) + "Content-Length: 0\r\n\r\n",
	} {
		r := bufio.NewReader(strings.NewReader(answer))
		if _, _, ok, _ := readPlainAnswer(r, 1<<20); ok {
			t.Errorf("%q was read as a plain answer", answer)
		}
		if rest, _ := io.ReadAll(r); string(rest) != answer {
			t.Errorf("%q: %q was left to read", answer, rest)
		}
	}
}

// Whatever readPlainAnswer takes, it reads as the net/http path does:
// the same status, headers (in the order they came within each name),
// body, errors, and bytes left on the connection.
func FuzzReadPlainAnswer(f *testing.F) {
	for _, s := range []string{
		bridgeAnswer,
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab",
		"HTTP/1.1 429 Too Many\r\nRetry-After: 1 \r\nContent-Length: 2\r\n\r\nnoHTTP/1.1 200 OK\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 00\r\nA:\r\n\r\n",
		"HTTP/1.1 999 \r\nContent-Length: 3\r\n\r\nabcd",
		"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, answer []byte) {
		const maxBody = 64
		fr := bufio.NewReader(bytes.NewReader(answer))
		hm, body, ok, err := readPlainAnswer(fr, maxBody)
		if !ok {
			if rest, _ := io.ReadAll(fr); !bytes.Equal(rest, answer) {
				t.Fatalf("%q: refused, having read %d bytes", answer, len(answer)-len(rest))
			}
			return
		}
		sr := bufio.NewReader(bytes.NewReader(answer))
		shm, sbody, keep, started, serr := readAnswer(sr, postRequest, maxBody)
		if (err != nil) != (serr != nil) || err != nil && !started {
			t.Fatalf("%q: error %v, net/http %v (started %v)", answer, err, serr, started)
		}
		if err != nil {
			return
		}
		byName := func(m fields.Map) fields.Map {
			m = slices.Clone(m)
			slices.SortStableFunc(m, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
			return m
		}
		if !slices.Equal(byName(hm), byName(shm)) || !bytes.Equal(body, sbody) || !keep {
			t.Fatalf("%q:\n read %q %q\n net/http %q %q (keep %v)", answer, hm, body, shm, sbody, keep)
		}
		rest, _ := io.ReadAll(fr)
		srest, _ := io.ReadAll(sr)
		if !bytes.Equal(rest, srest) {
			t.Fatalf("%q: left %q, net/http %q", answer, rest, srest)
		}
	})
}
