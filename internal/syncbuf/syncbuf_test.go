package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// TestBuffer_Write is a short hammer: writers and a reader at once (run
// with -race), and every write whole in the end.
func TestBuffer_Write(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("line\n"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := b.String(); got != strings.Repeat("line\n", 800) {
		t.Fatalf("%d bytes, want 800 whole lines", len(got))
	}
}
