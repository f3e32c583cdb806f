package rules

// Hash hashes a counter key or any short text, for tables indexed by it:
// the plugin's over-limit cache slots, its refusal memo, the plan cache.
// It takes the text a word at a time (a loop over bytes is dear in
// WebAssembly) and mixes the result as MurmurHash3's finalizer does, so
// that its low bits, which pick slots, depend on every byte.
func Hash[T string | []byte](b T) uint64 {
	h := uint64(len(b)) * 0x9E3779B97F4A7C15
	for len(b) >= 8 {
		w := uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
			uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
		h = (h ^ w) * 0x9E3779B97F4A7C15
		h ^= h >> 29
		b = b[8:]
	}
	var last uint64
	for i := 0; i < len(b); i++ {
		last |= uint64(b[i]) << (8 * i)
	}
	h = (h ^ last) * 0x9E3779B97F4A7C15
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	return h ^ h>>33
}
