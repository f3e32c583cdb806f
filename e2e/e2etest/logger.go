package e2etest

import (
	"log/slog"
	"testing"

	"github.com/sluicehq/sluice/internal/syncbuf"
)

// Logger returns a logger for a component the test starts (a bridge, say)
// that keeps its lines and shows them, if any, only if t fails: quiet when
// the test passes, and the component's own account of an error when it
// does not.
func Logger(t testing.TB) *slog.Logger {
	t.Helper()
	w := &syncbuf.Buffer{}
	t.Cleanup(func() {
		if logs := w.String(); t.Failed() && logs != "" {
			t.Logf("a component's log:\n%s", logs)
		}
	})
	return slog.New(slog.NewTextHandler(w, nil))
}
