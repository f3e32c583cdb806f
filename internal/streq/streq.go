// Package streq compares short strings without calling the runtime.
//
// In Go compiled to WebAssembly, s == t for strings of the same length is
// a call to the runtime's comparison, which calls another, and such calls
// are dear there: they cost more than comparing a header name or a user id
// does. The plugin compares such strings on every request.
package streq

import "unsafe"

// Equal reports whether a == b. Up to 16 bytes it compares them inline:
// below 4 bytes the first, middle and last (every byte there), else two
// overlapping words of each.
func Equal(a, b string) bool {
	n := len(a)
	switch {
	case n != len(b):
		return false
	case n == 0:
		return true
	case n < 4:
		return a[0] == b[0] && a[n/2] == b[n/2] && a[n-1] == b[n-1]
	case n < 8:
		pa, pb := unsafe.Pointer(unsafe.StringData(a)), unsafe.Pointer(unsafe.StringData(b))
		return *(*uint32)(pa) == *(*uint32)(pb) && *(*uint32)(unsafe.Add(pa, n-4)) == *(*uint32)(unsafe.Add(pb, n-4))
	case n <= 16:
		pa, pb := unsafe.Pointer(unsafe.StringData(a)), unsafe.Pointer(unsafe.StringData(b))
		return *(*uint64)(pa) == *(*uint64)(pb) && *(*uint64)(unsafe.Add(pa, n-8)) == *(*uint64)(unsafe.Add(pb, n-8))
	}
	return a == b
}
