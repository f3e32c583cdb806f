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
	v := []byte("1")
	res.Set("X-A", v)
	v[0] = '9' // Set keeps a copy
	res.Set("X-B", []byte("2"))
	res.Set("X-A", []byte("3"))
	res.Set("X-C", nil)
	if got, want := res.AppendHeaders(nil), [][2]string{{"X-A", "3"}, {"X-B", "2"}, {"X-C", ""}}; !slices.Equal(got, want) {
		t.Errorf("headers %q, want %q", got, want)
	}
	if res.HeaderCount() != 3 || !res.Has("X-A") || !res.Has("X-C") || res.Has("x-a") {
		t.Errorf("count %d, has X-A %v, X-C %v, x-a %v", res.HeaderCount(), res.Has("X-A"), res.Has("X-C"), res.Has("x-a"))
	}
	res.Status, res.Body = 201, append(res.Body, "x"...)
	res.Reset()
	if res.Status != 0 || res.HeaderCount() != 0 || len(res.AppendHeaders(nil)) != 0 || len(res.Body) != 0 || cap(res.Body) == 0 || cap(res.fields) == 0 || cap(res.values) == 0 {
		t.Errorf("after Reset: %+v", res)
	}
	res.Set("X-D", []byte("4"))
	if got, want := res.AppendHeaders(nil), [][2]string{{"X-D", "4"}}; !slices.Equal(got, want) {
		t.Errorf("after Reset, headers %q, want %q", got, want)
	}
}
