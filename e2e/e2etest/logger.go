package e2etest

import (
	"bytes"
	"log/slog"
	"sync"
	"testing"
)

// Logger returns a logger for a component the test starts (a bridge, say)
// that keeps its lines and shows them only if t fails: quiet when the test
// passes, and the component's own account of an error when it does not.
func Logger(t testing.TB) *slog.Logger {
	t.Helper()
	w := &lockedBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs of the components this test started:\n%s", w.String())
		}
	})
	return slog.New(slog.NewTextHandler(w, nil))
}

// lockedBuffer is a bytes.Buffer safe for the component's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
