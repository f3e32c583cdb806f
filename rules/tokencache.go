package rules

import "github.com/tidwall/gjson"

// TokenCache remembers bearer tokens that verified, so a client sending the
// same token again costs a lookup instead of a signature check (RS256 and
// ES256 cost tens of microseconds natively, several times that in wasm).
//
// It is direct-mapped with a fixed number of slots. A hit needs the whole
// token to be equal, not just its hash, so no token can be crafted to pass
// for another; exp is checked again on every hit. Tokens longer than
// maxCachedToken are verified every time, which bounds the memory.
// Not safe for concurrent use: the plugin keeps one per VM.
type TokenCache struct {
	slots []tokenSlot
}

type tokenSlot struct {
	src     *IdentitySource // the source that verified it
	token   string
	payload []byte
	exp     int64 // Unix seconds, 0 when the token has none
}

const maxCachedToken = 2048

// NewTokenCache returns a cache of n slots (at least 1).
func NewTokenCache(n int) *TokenCache {
	return &TokenCache{slots: make([]tokenSlot, max(n, 1))}
}

// Verify is VerifyJWT with the cache in front.
func (c *TokenCache) Verify(authValue string, src *IdentitySource, nowUnix int64) ([]byte, error) {
	payload, _, err := c.verify(authValue, src, nowUnix)
	return payload, err
}

// verify is Verify, also giving the token's exp (expOf).
func (c *TokenCache) verify(authValue string, src *IdentitySource, nowUnix int64) (payload []byte, exp int64, err error) {
	token := bearerToken(authValue)
	if len(token) > maxCachedToken {
		if payload, err = VerifyJWT(authValue, src, nowUnix); err != nil {
			return nil, 0, err
		}
		return payload, expOf(payload), nil
	}
	slot := &c.slots[fnv64(token)%uint64(len(c.slots))]
	if slot.src == src && slot.token == token && (slot.exp == 0 || nowUnix < slot.exp+src.LeewaySec) {
		return slot.payload, slot.exp, nil
	}
	if payload, err = VerifyJWT(authValue, src, nowUnix); err != nil {
		return nil, 0, err
	}
	// A new slot value, never an in-place write: strings handed out from
	// the previous payload must not change under their holders.
	*slot = tokenSlot{src: src, token: string([]byte(token)), payload: payload, exp: expOf(payload)}
	return payload, slot.exp, nil
}

// expOf is the exp claim of a verified token's payload in whole seconds,
// rounded down (a token then counts as expired up to a second early, never
// late); 0 when it has none.
func expOf(payload []byte) int64 { return gjson.GetBytes(payload, "exp").Int() }

func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
