package jwttest_test

import (
	"testing"

	"github.com/sluicehq/sluice/internal/jwttest"
)

// The example token jwt.io shows (HS256, secret "your-256-bit-secret"),
// signed by another implementation.
func TestHS256(t *testing.T) {
	const want = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
	if got := jwttest.HS256("your-256-bit-secret", `{"sub":"1234567890","name":"John Doe","iat":1516239022}`); got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
}
