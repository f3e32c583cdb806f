package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// testLine is a request and its answer as the access log sees them.
func testLine(t *testing.T) *logLine {
	t.Helper()
	r, err := http.NewRequest("POST", "http://api.example.com/api/items?page=2", nil)
	if err != nil {
		t.Fatal(err)
	}
	r.RequestURI = "/api/items?page=2"
	r.RemoteAddr = "203.0.113.7:4321"
	r.Header.Set("User-Agent", "test-agent")
	r.Header.Set("X-Request-Id", "req-1")
	r.Header.Set("X-Quote", `say "hi"`)
	r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, &net.TCPAddr{IP: net.ParseIP("10.0.0.5"), Port: 8080}))
	e := &accessEntry{ResponseWriter: &headerOnly{h: http.Header{"X-Envoy-Upstream-Service-Time": {"7"}}}, sent: 17, upstream: "127.0.0.1:9000"}
	start := time.Date(2030, 1, 2, 3, 4, 5, 6_007_008, time.UTC)
	return &logLine{r: r, e: e, start: start, end: start.Add(12 * time.Millisecond), received: 5, status: 201, flags: ""}
}

type headerOnly struct {
	http.ResponseWriter
	h http.Header
}

func (h *headerOnly) Header() http.Header { return h.h }

func TestAccessFormat_Render(t *testing.T) {
	for _, tt := range []struct {
		name, text, json string
		tls              bool
		want             string
	}{
		{name: "Envoy's default", want: `[2030-01-02T03:04:05.006Z] "POST /api/items?page=2 HTTP/1.1" 201 - 5 17 12 7 "-" "test-agent" "req-1" "api.example.com" "127.0.0.1:9000"` + "\n"},
		{name: "headers, alternatives and lengths",
			text: `%REQ(X-MISSING?USER-AGENT)% %REQ(user-agent):4% %RESP(x-envoy-upstream-service-time)% %REQUEST_HEADER(:METHOD)% %RESPONSE_HEADER(X-NONE)% %REQ(:SCHEME)%`,
			want: "test-agent test 7 POST - http\n"},
		{name: "https scheme", text: "%REQ(:SCHEME)%\n", tls: true, want: "https\n"},
		{name: "addresses", text: "%DOWNSTREAM_REMOTE_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT% %DOWNSTREAM_REMOTE_PORT% %DOWNSTREAM_DIRECT_REMOTE_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT% %DOWNSTREAM_LOCAL_PORT% %UPSTREAM_HOST%",
			want: "203.0.113.7:4321 203.0.113.7 4321 203.0.113.7:4321 10.0.0.5:8080 10.0.0.5 8080 127.0.0.1:9000\n"},
		{name: "start time layouts", text: "%START_TIME(%Y/%m/%dT%H:%M:%S%z %s)% %START_TIME(%s.%3f)% %START_TIME(%s.%6f|%f)% %START_TIME(%F %T %y %j 100%%)%",
			want: "2030/01/02T03:04:05+0000 1893553445 1893553445.006 1893553445.006007|006007008 2030-01-02 03:04:05 30 002 100%\n"},
		{name: "typed JSON", json: `{"status":"%RESPONSE_CODE%","path":"%REQ(:PATH)%","flags":"%RESPONSE_FLAGS%","quote":"%REQ(X-QUOTE)%","mixed":"%RESPONSE_CODE% in %DURATION%ms","none":"%REQ(X-NONE)% left","time":"%START_TIME%","bytes":{"in":"%BYTES_RECEIVED%","out":"%BYTES_SENT%"},"text":"plain"}`,
			want: `{"status":201,"path":"/api/items?page=2","flags":null,"quote":"say \"hi\"","mixed":"201 in 12ms","none":"- left","time":"2030-01-02T03:04:05.006Z","bytes":{"in":5,"out":17},"text":"plain"}` + "\n"},
		{name: "empty JSON objects", json: `{"a":{},"b":"%DURATION%"}`, want: `{"a":{},"b":12}` + "\n"},
		{name: "an empty JSON format", json: `{}`, want: "{}\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, err := accessFormatFrom(tt.text, tt.json)
			if err != nil {
				t.Fatal(err)
			}
			l := testLine(t)
			if tt.tls {
				l.r.TLS = &tls.ConnectionState{}
			}
			got, _ := f.render(nil, nil, l)
			if string(got) != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
			if tt.json != "" && !json.Valid(got) {
				t.Errorf("not JSON: %s", got)
			}
		})
	}
}

// A format is refused at start, with what is wrong in it.
func TestAccessFormatFrom_Refused(t *testing.T) {
	for _, tt := range []struct{ text, json, err string }{
		{text: "%UPSTREAM_CLUSTER%", err: "--access-log-format: %UPSTREAM_CLUSTER%: not a command operator the gateway has (it has BYTES_RECEIVED,"},
		{text: "100% sure", err: `--access-log-format: "% sure": a % that starts no command operator`},
		{text: "%REQ%", err: "%REQ%: names no header"},
		{text: "%REQ(X-A):0%", err: `%REQ(X-A):0%: length "0", want a positive number`},
		{text: "%REQ(X-A)x%", err: `%REQ(X-A)x%: "x" after the argument, want :LENGTH`},
		{text: "%DURATION(1)%", err: "%DURATION(1)%: DURATION takes no argument"},
		{text: "%DURATION:3%", err: "%DURATION:3%: not a command operator"},
		{text: "%START_TIME(%Q)%", err: "%START_TIME(%Q)%: %Q: not a conversion the gateway has"},
		{text: "%START_TIME(%)%", err: "%START_TIME(%)%: the layout ends with %"},
		{json: `["%DURATION%"]`, err: "--access-log-json: the format: want a JSON object of format strings"},
		{json: `{"a":{"b":3}}`, err: "--access-log-json: a.b: want a format string or an object"},
		{json: `{"a":{"b":"%NOPE%"}}`, err: "--access-log-json: a.b: %NOPE%: not a command operator"},
		{json: `{"a":"%DURATION%"} {}`, err: "--access-log-json: the format: text after the object"},
		{json: `{"a":{"b":"1","b":"2"}}`, err: "--access-log-json: a.b: given twice"},
		{text: "%DURATION%", json: `{"a":"%DURATION%"}`, err: "--access-log-format and --access-log-json: give one or neither"},
	} {
		_, err := accessFormatFrom(tt.text, tt.json)
		if err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%q %q: %v, want %q", tt.text, tt.json, err, tt.err)
		}
	}
}

// Whatever a format dictionary holds, a line is one JSON object with the
// dictionary's keys in their order, each value the text its format string
// renders, or for an operator alone its typed value.
func FuzzAccessFormat_Dict(f *testing.F) {
	for _, seed := range []string{
		`{"a":{"b":"%DURATION%"},"c":"x %REQ(:PATH)%"}`,
		`{"s":"%RESPONSE_CODE%","f":"%RESPONSE_FLAGS%","q":"%REQ(X-QUOTE)%","t":"%START_TIME(%s.%3f)%","e":{}}`,
		`{"\u00e9\"k":"caf\u00e9 \\ %REQ(USER-AGENT):3%","n":{"m":{"o":"%BYTES_SENT%"}}}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, dict string) {
		fm, err := accessFormatFrom("", dict)
		if err != nil || dict == "" {
			return
		}
		l := testLine(t)
		got, _ := fm.render(nil, nil, l)
		if !strings.HasSuffix(string(got), "\n") {
			t.Fatalf("no newline: %q", got)
		}
		dec := json.NewDecoder(strings.NewReader(string(got)))
		gotValue := readOrdered(t, dec)
		if _, err := dec.Token(); err != io.EOF {
			t.Fatalf("more than one value: %s", got)
		}
		want := expectedDict(t, json.NewDecoder(strings.NewReader(dict)), l)
		if !reflect.DeepEqual(gotValue, want) {
			t.Fatalf("format %s\n got %#v\nwant %#v", dict, gotValue, want)
		}
	})
}

// ordered is a JSON object as its keys and values in order.
type ordered []any // key, value, key, value...

// readOrdered reads one JSON value from dec, objects as ordered.
func readOrdered(t *testing.T, dec *json.Decoder) any {
	tok, err := dec.Token()
	if err != nil {
		t.Fatal(err)
	}
	if tok != json.Delim('{') {
		return tok
	}
	var o ordered
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		o = append(o, k, readOrdered(t, dec))
	}
	if _, err := dec.Token(); err != nil {
		t.Fatal(err)
	}
	return o
}

// expectedDict is what the format dictionary read from dec renders for l,
// found from its text: strings rendered as format strings, a lone
// numeric operator as a number, a lone operator without a value as null.
func expectedDict(t *testing.T, dec *json.Decoder, l *logLine) any {
	tok, err := dec.Token()
	if err != nil {
		t.Fatal(err)
	}
	if tok != json.Delim('{') {
		parts, err := parseFormat(tok.(string))
		if err != nil {
			t.Fatal(err)
		}
		text := string(appendParts(nil, parts, l))
		if len(parts) == 1 && parts[0].lit == "" && parts[0].op.kind != opNone {
			if v, ok := parts[0].op.append(nil, l); !ok {
				return nil
			} else if parts[0].op.kind.numeric() {
				n, err := strconv.ParseFloat(string(v), 64)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
		return strings.ToValidUTF8(text, "\uFFFD")
	}
	var o ordered
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		o = append(o, strings.ToValidUTF8(k.(string), "\uFFFD"), expectedDict(t, dec, l))
	}
	if _, err := dec.Token(); err != nil {
		t.Fatal(err)
	}
	return o
}
