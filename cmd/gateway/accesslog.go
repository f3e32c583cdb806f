package main

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// accessLog writes a line for every request to a file (--access-log), in
// an Envoy access log format (accessformat.go): Envoy's default unless
// --access-log-format or --access-log-json give another, so what reads
// Envoy's access logs reads the gateway's. The upstream service time is
// the gateway's (serviceTimed); the upstream host is --upstream's host as
// given, where Envoy names the address it connected to; the response
// flags it knows are UT (upstream timeout), UF (upstream connection
// failure), UC (upstream connection ended) and DC (the client went away).
// Lines are buffered and reach the file at least once a second, as Envoy
// flushes its access log files; SIGUSR1 reopens the file, as it makes
// Envoy reopen its logs.
type accessLog struct {
	path   string
	format *accessFormat
	now    func() time.Time
	logger *slog.Logger

	mu    sync.Mutex // guards what follows
	f     *os.File
	w     *bufio.Writer
	errAt time.Time // when a write error was last logged

	stop chan struct{}
	done chan struct{}
}

// accessFlushInterval is Envoy's default file_flush_interval.
const accessFlushInterval = time.Second

// openAccessLog opens path for appending, to write lines in format, and
// flushes it every accessFlushInterval until Close.
func openAccessLog(path string, format *accessFormat, logger *slog.Logger) (*accessLog, error) {
	f, err := openAppend(path)
	if err != nil {
		return nil, err
	}
	l := &accessLog{path: path, format: format, now: time.Now, logger: logger, f: f, w: bufio.NewWriterSize(f, 64<<10),
		stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		t := time.NewTicker(accessFlushInterval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				l.mu.Lock()
				l.flush()
				l.mu.Unlock()
			case <-l.stop:
				return
			}
		}
	}()
	return l, nil
}

func openAppend(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--access-log: %w", err)
	}
	return f, nil
}

// flush writes out the buffered lines; called with mu held. A failed
// write (a full disk) drops them rather than every later line with them,
// and is logged at most once a minute.
func (l *accessLog) flush() {
	if l.w.Buffered() == 0 {
		return
	}
	if err := l.w.Flush(); err != nil {
		if now := time.Now(); now.Sub(l.errAt) >= time.Minute {
			l.errAt = now
			l.logger.Error("access log write failed; lines dropped", "file", l.path, "err", err)
		}
		l.w.Reset(l.f)
	}
}

// reopen flushes the file and opens path again, for log rotation; when
// it cannot, the log goes on in the file it had.
func (l *accessLog) reopen() error {
	f, err := openAppend(l.path)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flush()
	old := l.f
	l.f = f
	l.w.Reset(f)
	return old.Close()
}

// Close flushes what is buffered and closes the file.
func (l *accessLog) Close() error {
	close(l.stop)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flush()
	return l.f.Close()
}

// accessEntry is one request being logged: the response writer the rest
// of the gateway writes through, counting what it sends.
type accessEntry struct {
	http.ResponseWriter
	status   int
	sent     int64
	flags    string // response flags, set by the proxy's error handler
	upstream string // the upstream host, once the request went there
	line     []byte
	scratch  []byte // a value being escaped for a JSON line
}

var accessEntries = sync.Pool{New: func() any { return &accessEntry{line: make([]byte, 0, 256)} }}

func (e *accessEntry) WriteHeader(code int) {
	if e.status == 0 && code >= 200 { // not an informational answer
		e.status = code
	}
	e.ResponseWriter.WriteHeader(code)
}

func (e *accessEntry) Write(b []byte) (int, error) {
	if e.status == 0 {
		e.status = http.StatusOK
	}
	n, err := e.ResponseWriter.Write(b)
	e.sent += int64(n)
	return n, err
}

// WriteString keeps io.WriteString through the entry as cheap as on
// net/http's own writer, which has it.
func (e *accessEntry) WriteString(s string) (int, error) {
	if e.status == 0 {
		e.status = http.StatusOK
	}
	n, err := io.WriteString(e.ResponseWriter, s)
	e.sent += int64(n)
	return n, err
}

// Hijack is the reverse proxy's way to a switch of protocols (an
// upgrade such as WebSocket): it writes the upstream's 101 itself, on the
// connection, so the entry records it here.
func (e *accessEntry) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(e.ResponseWriter).Hijack()
	if err == nil && e.status == 0 {
		e.status = http.StatusSwitchingProtocols
	}
	return c, rw, err
}

// Unwrap lets http.ResponseController reach the connection's writer, to
// flush and to hijack for upgrades.
func (e *accessEntry) Unwrap() http.ResponseWriter { return e.ResponseWriter }

// accessEntryOf finds the entry under the writers the plugin's host
// wrapped around it, or nil when the request is not logged.
func accessEntryOf(w http.ResponseWriter) *accessEntry {
	for {
		switch x := w.(type) {
		case *accessEntry:
			return x
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return nil
		}
	}
}

// countedBody counts the request body bytes the gateway read. The count
// is atomic: the upstream transport may still be sending the body when
// the answer has come.
type countedBody struct {
	io.ReadCloser
	n atomic.Int64
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// handler logs every request through next, once next has answered it.
func (l *accessLog) handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := l.now()
		e := accessEntries.Get().(*accessEntry)
		e.ResponseWriter, e.status, e.sent, e.flags, e.upstream = w, 0, 0, "", ""
		var body *countedBody
		if r.Body != nil && r.Body != http.NoBody {
			body = &countedBody{ReadCloser: r.Body}
			r.Body = body
		}
		completed := false
		defer func() {
			// Also when the handler panicked (http.ErrAbortHandler, an
			// answer cut short): the request is logged, and the panic goes
			// on to net/http.
			var received int64
			if body != nil {
				received = body.n.Load()
			}
			l.write(e, r, start, received, completed)
			e.ResponseWriter = nil
			accessEntries.Put(e)
		}()
		next.ServeHTTP(e, r)
		completed = true
	})
}

// markUpstream records in the request's entry that next takes the request
// to the upstream host.
func markUpstream(next http.Handler, host string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e := accessEntryOf(w); e != nil {
			e.upstream = host
		}
		next.ServeHTTP(w, r)
	})
}

// write formats e's line and adds it to the buffer. completed is whether
// the handler returned rather than aborted the answer.
func (l *accessLog) write(e *accessEntry, r *http.Request, start time.Time, received int64, completed bool) {
	status, flags := e.status, e.flags
	gone := r.Context().Err() != nil
	switch {
	case flags != "":
	case gone:
		flags = "DC"
	case !completed && status != 0:
		flags = "UC" // the upstream's answer broke off after it began
	case completed && status == 0:
		status = http.StatusOK // net/http answers 200 for a handler that wrote nothing
	}
	line := logLine{r: r, e: e, start: start, end: l.now(), received: received, status: status, flags: flags}
	b, scratch := l.format.render(e.line[:0], e.scratch, &line)
	e.scratch = scratch
	e.line = b
	l.mu.Lock()
	l.w.Write(b) // an error stays in the writer until flush reports it
	l.mu.Unlock()
}

func headerValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// appendOrDash appends s, or "-" as Envoy prints a value it does not have.
func appendOrDash(b []byte, s string) []byte {
	if s == "" {
		return append(b, '-')
	}
	return append(b, s...)
}
