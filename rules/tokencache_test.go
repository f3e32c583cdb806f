package rules

import (
	"errors"
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/internal/jwttest"
)

const cacheSecret = "token-cache-secret-0123456789abcdef"

func cacheSource(t testing.TB) *IdentitySource {
	k, err := ParseJWTKey("HS256", "", []byte(cacheSecret), "")
	if err != nil {
		t.Fatal(err)
	}
	return &IdentitySource{Kind: SourceJWT, Header: "authorization", Claim: "sub", Keys: []JWTKey{k}, LeewaySec: 0, RequireExp: true}
}

func TestTokenCache_Verify(t *testing.T) {
	src := cacheSource(t)
	c := NewTokenCache(4)
	good := jwttest.HS256(cacheSecret, `{"sub":"alice","exp":1000}`)
	for i := 0; i < 2; i++ { // miss, then hit
		pl, err := c.Verify("Bearer "+good, src, 900)
		if u, _ := Claim(pl, "sub"); err != nil || u != "alice" {
			t.Fatalf("round %d: %q %v", i, u, err)
		}
	}
	// A hit is re-checked for expiry.
	if _, err := c.Verify("Bearer "+good, src, 1000); !errors.Is(err, ErrJWTExpired) {
		t.Errorf("expired cached token: %v", err)
	}
	// A token that differs in one byte of its signature is not a hit.
	tampered := good[:len(good)-2] + "AA"
	if _, err := c.Verify("Bearer "+tampered, src, 900); err == nil {
		t.Error("tampered token verified from the cache")
	}
	// Another source (a reloaded config) never reuses a slot.
	if _, err := c.Verify("Bearer "+good, cacheSource(t), 900); err != nil {
		t.Errorf("other source: %v", err)
	}
	// Many tokens through few slots: each still verifies correctly.
	for i := 0; i < 50; i++ {
		tok := jwttest.HS256(cacheSecret, fmt.Sprintf(`{"sub":"u%d","exp":2000}`, i))
		pl, err := c.Verify(tok, src, 900)
		if u, _ := Claim(pl, "sub"); err != nil || u != fmt.Sprint("u", i) {
			t.Fatalf("token %d: %q %v", i, u, err)
		}
	}
}

func BenchmarkTokenCache_Verify(b *testing.B) {
	src := cacheSource(b)
	tok := "Bearer " + jwttest.HS256(cacheSecret, `{"sub":"alice","exp":99999999999}`)
	b.Run("uncached", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			VerifyJWT(tok, src, 1)
		}
	})
	b.Run("cached", func(b *testing.B) {
		c := NewTokenCache(256)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			c.Verify(tok, src, 1)
		}
	})
}
