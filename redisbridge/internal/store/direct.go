package store

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/idleconn"
)

// A single Redis (redis://, rediss://, unix://) gets its check pipelines
// on connections of their own, each owned by one pipeline goroutine: the
// batch is written as RESP straight from the limits and the answers parsed
// straight into integers. Through go-redis a batch cost a pool checkout
// with a socket health probe (a system call), hooks, and ~20 allocations
// per check (commands of interface{} arguments, replies of interface{}).
// go-redis stays the client for everything else and for Cluster and
// Sentinel, where it follows the topology.

// directConn is one pipeline's connection. Not safe for concurrent use.
type directConn struct {
	opt     *redis.Options
	timeout time.Duration
	c       net.Conn
	r       *bufio.Reader
	rw      respWriter // the batch being written
	used    time.Time  // end of the last batch
	script  *luaScript
	again   [][]*call // exec's calls to send again as EVAL
	specs   specTable
	// idleCheck: a connection idle this long is probed before use (one
	// system call), as go-redis probes every pooled connection: Redis may
	// have restarted meanwhile (the first check on each stale connection
	// would fail) or closed it (its timeout setting). Under load a
	// pipeline's connection is reused well within it, so the probe costs
	// nothing there; a restart never takes less.
	idleCheck time.Duration
}

// defaultIdleCheck is directConn.idleCheck outside tests.
const defaultIdleCheck = 5 * time.Millisecond

// replyError is an error reply of Redis; it is a redis.Error so that
// storeErr and redis.HasErrorPrefix treat it as go-redis's own.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

var errProtocol = errors.New("redis: unexpected reply")

func (d *directConn) close() {
	if d.c != nil {
		_ = d.c.Close()
		d.c = nil
	}
}

// connect dials and authenticates, as go-redis would with the same options.
func (d *directConn) connect(deadline time.Time) error {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	c, err := dialRedis(ctx, d.timeout, d.opt.Network, d.opt.Addr, d.opt.TLSConfig)
	if err != nil {
		return err
	}
	d.c = c
	if d.r == nil {
		d.r = bufio.NewReaderSize(c, 32<<10)
	} else {
		d.r.Reset(c)
	}
	_ = c.SetDeadline(deadline)
	w := d.rw.w[:0]
	n := 0
	if d.opt.Password != "" {
		if d.opt.Username != "" {
			w = appendCommand(w, "AUTH", d.opt.Username, d.opt.Password)
		} else {
			w = appendCommand(w, "AUTH", d.opt.Password)
		}
		n++
	}
	if d.opt.DB != 0 {
		w = appendCommand(w, "SELECT", strconv.Itoa(d.opt.DB))
		n++
	}
	if n == 0 {
		return nil
	}
	if _, err := c.Write(w); err != nil {
		d.close()
		return err
	}
	for range n {
		line, err := d.r.ReadSlice('\n')
		if err != nil {
			d.close()
			return err
		}
		if line[0] != '+' {
			d.close()
			return fmt.Errorf("redis: connection setup: %s", trimCRLF(line))
		}
	}
	return nil
}

func appendCommand(w []byte, args ...string) []byte {
	w = append(w, '*')
	w = strconv.AppendInt(w, int64(len(args)), 10)
	w = append(w, "\r\n"...)
	for _, a := range args {
		w = appendBulk(w, a, "")
	}
	return w
}

// appendBulk writes a+b as one bulk string.
func appendBulk(w []byte, a, b string) []byte {
	w = append(w, '$')
	w = strconv.AppendInt(w, int64(len(a)+len(b)), 10)
	w = append(w, "\r\n"...)
	w = append(w, a...)
	w = append(w, b...)
	return append(w, "\r\n"...)
}

// respWriter writes script commands as RESP into w, for writeCheck.
type respWriter struct{ w []byte }

func (r *respWriter) begin(parts int) {
	r.w = append(r.w, '*')
	r.w = strconv.AppendInt(r.w, int64(parts), 10)
	r.w = append(r.w, "\r\n"...)
}

func (r *respWriter) bulk(a, b string) { r.w = appendBulk(r.w, a, b) }

func (r *respWriter) int(n int64) {
	var buf [20]byte
	d := strconv.AppendInt(buf[:0], n, 10)
	r.w = append(r.w, '$')
	r.w = strconv.AppendInt(r.w, int64(len(d)), 10)
	r.w = append(r.w, "\r\n"...)
	r.w = append(r.w, d...)
	r.w = append(r.w, "\r\n"...)
}

// exec sends the script calls of groups (each group's checks decided in
// one call) in one write and reads the answers in order. Calls that Redis
// answers NOSCRIPT (restart, SCRIPT FLUSH) are sent again as EVAL. An I/O
// or protocol error closes the connection, since where the stream stands
// is then unknown, and fails the checks not yet answered; the next batch
// dials again. Scripts are never retried after an I/O error: one that was
// sent may have run.
func (d *directConn) exec(groups [][]*call, deadline time.Time) {
	fail := func(gs [][]*call, err error) {
		d.close()
		for _, g := range gs {
			for _, c := range g {
				c.vals, c.err = c.vals[:0], fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
		}
	}
	if d.c != nil && time.Since(d.used) >= d.idleCheck && !idleconn.Alive(d.c) {
		d.close()
	}
	if d.c == nil {
		if err := d.connect(deadline); err != nil {
			fail(groups, err)
			return
		}
	}
	defer func() { d.used = time.Now() }()
	_ = d.c.SetDeadline(deadline)
	d.rw.w = d.rw.w[:0]
	for _, g := range groups {
		writeCheck(&d.rw, d.script, g, false, &d.specs)
	}
	if _, err := d.c.Write(d.rw.w); err != nil {
		fail(groups, err)
		return
	}
	again := d.again[:0]
	for i, g := range groups {
		if err := readCheckReply(d, g); err != nil {
			fail(groups[i:], err)
			return
		}
		if redis.HasErrorPrefix(g[0].err, "NOSCRIPT") {
			again = append(again, g)
		}
	}
	d.again = again[:0]
	if len(again) == 0 {
		return
	}
	d.rw.w = d.rw.w[:0]
	for _, g := range again {
		writeCheck(&d.rw, d.script, g, true, &d.specs)
	}
	if _, err := d.c.Write(d.rw.w); err != nil {
		fail(again, err)
		return
	}
	for i, g := range again {
		if err := readCheckReply(d, g); err != nil {
			fail(again[i:], err)
			return
		}
	}
}

// array implements replyReader: an array head, or an error reply.
func (d *directConn) array() (int, error) {
	line, err := d.r.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	line = trimCRLF(line)
	if len(line) == 0 {
		return 0, errProtocol
	}
	switch line[0] {
	case '-':
		return 0, replyError(line[1:])
	case '*':
	default:
		return 0, errProtocol
	}
	n, ok := parseInt(line[1:])
	if !ok || n < 0 {
		return 0, errProtocol
	}
	return int(n), nil
}

// elem implements replyReader: an integer, or a bulk string as text.
func (d *directConn) elem() (int64, string, bool, error) {
	line, err := d.r.ReadSlice('\n')
	if err != nil {
		return 0, "", false, err
	}
	line = trimCRLF(line)
	if len(line) == 0 {
		return 0, "", false, errProtocol
	}
	switch line[0] {
	case ':':
		v, ok := parseInt(line[1:])
		if !ok {
			return 0, "", false, errProtocol
		}
		return v, "", false, nil
	case '$':
		n, ok := parseInt(line[1:])
		if !ok || n < 0 || n > maxTextReply {
			return 0, "", false, errProtocol
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(d.r, b); err != nil {
			return 0, "", false, err
		}
		if b[n] != '\r' || b[n+1] != '\n' {
			return 0, "", false, errProtocol
		}
		return 0, string(b[:n]), true, nil
	}
	return 0, "", false, errProtocol
}

func trimCRLF(b []byte) []byte {
	if len(b) >= 2 && b[len(b)-2] == '\r' {
		return b[:len(b)-2]
	}
	if len(b) >= 1 && b[len(b)-1] == '\n' {
		return b[:len(b)-1]
	}
	return b
}

// parseInt reads a RESP integer of at most 18 digits (all check.lua
// returns fits; more could overflow).
func parseInt(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}
