package rules

import "testing"

func TestHash(t *testing.T) {
	texts := []string{"", "a", "rl:{u:a}:x", "rl:{u:b}:x", "12345678", "12345678a", "12345678b", "/api/v1/items?page=2"}
	seen := map[uint64]string{}
	for _, s := range texts {
		h := Hash(s)
		// A key hashes the same as bytes and as a string: the plugin
		// hashes keys it holds as both.
		if hb := Hash([]byte(s)); hb != h {
			t.Errorf("%q: Hash(string) %#x, Hash([]byte) %#x", s, h, hb)
		}
		if other, ok := seen[h]; ok {
			t.Errorf("%q and %q hash alike: %#x", s, other, h)
		}
		seen[h] = s
	}
	// The low bits, which pick slots, follow every byte: texts that differ
	// in one byte only, at any place, land in different slots of 64 for
	// most of the places.
	base := []byte("rl:{u:alice}:api:e:/v1/search")
	same := 0
	for i := range base {
		b := append([]byte(nil), base...)
		b[i] ^= 1
		if Hash(b)%64 == Hash(base)%64 {
			same++
		}
	}
	if same > 2 {
		t.Errorf("%d of %d one-byte changes keep the slot", same, len(base))
	}
}
