package wasmhost

import (
	"bufio"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/nettest"
	"github.com/sluicehq/sluice/wasmhost/internal/fields"
)

// TestUpstreamFailure: what Envoy's router answers for each way an
// exchange fails before the answer, from the errors a real exchange gives.
func TestUpstreamFailure(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	plain := httptest.NewServer(ok)
	defer plain.Close()
	secure := httptest.NewUnstartedServer(ok)
	secure.Config.ErrorLog = log.New(io.Discard, "", 0) // the client's refusal of its certificate
	secure.StartTLS()
	defer secure.Close()
	closed := httptest.NewServer(ok)
	closedURL := closed.URL
	closed.Close()
	// raw answers each request with what its path asks for: nothing (the
	// connection closed) or a head that is not HTTP.
	addr, _ := nettest.Raw(t, func(c net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err == nil && req.URL.Path == "/malformed" {
			c.Write([]byte("HTTP/1.1 two hundred OK\r\n\r\n"))
		}
	})
	raw := "http://" + addr

	const reset = "upstream connect error or disconnect/reset before headers. reset reason: "
	for _, tt := range []struct {
		name, url string
		timedOut  bool
		status    int
		body      string
		flag      string
	}{
		{"refused", closedURL, false, 503, reset + "remote connection failure, transport failure reason: delayed connect error: 111", "UF"},
		{"certificate not trusted", secure.URL, false, 503, reset + "remote connection failure, transport failure reason: TLS_error:|268435581:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED:TLS_error_end", "UF"},
		{"TLS to a plain server", strings.Replace(plain.URL, "http:", "https:", 1), false, 503, reset + "remote connection failure, transport failure reason: TLS_error:|268435703:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER:TLS_error_end", "UF"},
		{"closed before the answer", raw + "/close", false, 503, reset + "connection termination", "UC"},
		{"not HTTP", raw + "/malformed", false, 502, reset + "protocol error", "UPE"},
		{"timed out", closedURL, true, 504, "upstream request timeout", "UT"},
		{"no error given", "", false, 503, reset + "connection termination", "UC"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var err error // none given, for an empty url
			if tt.url != "" {
				client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
				res, e := client.Get(tt.url)
				if e == nil {
					res.Body.Close()
					t.Fatalf("GET %s: %s, want an error", tt.url, res.Status)
				}
				err = e
			}
			reply, flag := UpstreamFailure(err, tt.timedOut)
			want := LocalResponse{Status: tt.status, Headers: [][2]string{{"content-type", "text/plain"}}, Body: []byte(tt.body), GrpcStatus: -1}
			if !reflect.DeepEqual(reply, want) || flag != tt.flag {
				t.Errorf("error %v:\n got %d %q %v %s\nwant %d %q %v %s", err,
					reply.Status, reply.Body, reply.Headers, flag, want.Status, want.Body, want.Headers, tt.flag)
			}
		})
	}
}

// localHeaders parses a local response's headers once while they repeat,
// and each caller gets a copy of its own.
func TestInstance_LocalHeaders(t *testing.T) {
	in := &instance{}
	a := fields.Map{{"content-type", "application/json"}, {"retry-after", "7"}}.Append(nil)
	b := fields.Map{{"retry-after", "8"}}.Append(nil)
	for i, tc := range []struct {
		raw  []byte
		want fields.Map
	}{
		{a, fields.Map{{"content-type", "application/json"}, {"retry-after", "7"}}},
		{a, fields.Map{{"content-type", "application/json"}, {"retry-after", "7"}}},
		{b, fields.Map{{"retry-after", "8"}}},
		{nil, nil},
		{a, fields.Map{{"content-type", "application/json"}, {"retry-after", "7"}}},
	} {
		got, err := in.localHeaders(tc.raw)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Fatalf("call %d: %v, %v; want %v", i, got, err, tc.want)
		}
		if len(got) > 0 {
			got[0][1] = "changed by a caller"
		}
	}
	if _, err := in.localHeaders([]byte{1, 0, 0, 0}); err == nil {
		t.Error("a malformed map was taken")
	}
}
