package inproc

import (
	"net/http"
	"slices"
	"testing"

	"github.com/sluicehq/sluice/internal/pwmap"
)

// Header answers as http.Header.Get on the request the host builds for
// ServeHTTP: names in any case, the first value, pseudo-headers left out,
// an empty value told from none.
func TestRequest_Header(t *testing.T) {
	req := Request{Headers: pwmap.Append(nil, [][2]string{
		{":path", "/check"}, {"authorization", "Bearer a"}, {"X-Request-Id", ""}, {"AUTHORIZATION", "Bearer b"}, {"x-b", "b"}})}
	header := http.Header{}
	for _, kv := range [][2]string{{"authorization", "Bearer a"}, {"X-Request-Id", ""}, {"AUTHORIZATION", "Bearer b"}, {"x-b", "b"}} {
		header.Add(kv[0], kv[1])
	}
	for _, tc := range []struct {
		name string
		want []byte
	}{
		{"Authorization", []byte("Bearer a")},
		{"authorization", []byte("Bearer a")},
		{"x-request-id", []byte{}},
		{"X-B", []byte("b")},
		{"x-c", nil},
		{":path", nil},
		{"authorizatio", nil},
	} {
		got := req.Header(tc.name)
		if !slices.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("Header(%q) = %q (nil %v), want %q (nil %v)", tc.name, got, got == nil, tc.want, tc.want == nil)
		}
		if vs := header.Values(tc.name); tc.name[0] != ':' && (len(vs) > 0) != (tc.want != nil) {
			t.Errorf("Header(%q): http.Header has %q", tc.name, vs)
		}
	}
}

// Set keeps one value a name, the last, as a ResponseWriter's header map
// keeps what a handler sets; Reset keeps the storage.
func TestResponse_Set(t *testing.T) {
	var res Response
	res.Set("X-A", "1")
	res.Set("X-B", "2")
	res.Set("X-A", "3")
	if want := [][2]string{{"X-A", "3"}, {"X-B", "2"}}; !slices.Equal(res.Headers, want) {
		t.Errorf("headers %q, want %q", res.Headers, want)
	}
	res.Status, res.Body = 201, append(res.Body, "x"...)
	res.Reset()
	if res.Status != 0 || len(res.Headers) != 0 || len(res.Body) != 0 || cap(res.Headers) == 0 || cap(res.Body) == 0 {
		t.Errorf("after Reset: %+v (caps %d, %d)", res, cap(res.Headers), cap(res.Body))
	}
}
