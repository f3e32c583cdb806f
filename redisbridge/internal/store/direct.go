package store

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/rules"
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
	w       []byte
	used    time.Time // end of the last batch
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
	c, err := (&net.Dialer{Timeout: d.timeout}).DialContext(ctx, d.opt.Network, d.opt.Addr)
	if err != nil {
		return err
	}
	if d.opt.TLSConfig != nil {
		tc := tls.Client(c, d.opt.TLSConfig)
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return err
		}
		c = tc
	}
	d.c = c
	if d.r == nil {
		d.r = bufio.NewReaderSize(c, 32<<10)
	} else {
		d.r.Reset(c)
	}
	_ = c.SetDeadline(deadline)
	w := d.w[:0]
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

func appendBulkInt(w []byte, n int64) []byte {
	var buf [20]byte
	d := strconv.AppendInt(buf[:0], n, 10)
	w = append(w, '$')
	w = strconv.AppendInt(w, int64(len(d)), 10)
	w = append(w, "\r\n"...)
	w = append(w, d...)
	return append(w, "\r\n"...)
}

// appendCheck writes the EVALSHA (or, with eval, the EVAL) of check.lua for
// c, with the same KEYS and ARGV as checkCmd.
func appendCheck(w []byte, c *call, eval bool) []byte {
	n := c.limits()
	keys, args := 0, 2
	for j := range n {
		l := c.limit(j)
		keys++
		args += 7
		if p := l.Spec.Penalty; p != nil && p.Enabled {
			keys += 2
			args += 2 + len(p.Multipliers)
		}
	}
	w = append(w, '*')
	w = strconv.AppendInt(w, int64(3+keys+args), 10)
	w = append(w, "\r\n"...)
	if eval {
		w = appendBulk(w, "EVAL", "")
		w = appendBulk(w, checkLua, "")
	} else {
		w = appendBulk(w, "EVALSHA", "")
		w = appendBulk(w, checkScript.Hash(), "")
	}
	w = appendBulkInt(w, int64(keys))
	for j := range n {
		l := c.limit(j)
		w = appendBulk(w, l.Key, algSuffix(l.Spec.Algorithm))
		if p := l.Spec.Penalty; p != nil && p.Enabled {
			w = appendBulk(w, l.Key, suffixViolations)
			w = appendBulk(w, l.Key, suffixBlock)
		}
	}
	w = appendBulk(w, c.mode, "")
	w = appendBulkInt(w, int64(n))
	for j := range n {
		sp := &c.limit(j).Spec
		shadow := int64(0)
		if c.limit(j).Shadow {
			shadow = 1
		}
		w = appendBulkInt(w, int64(sp.Algorithm))
		w = appendBulkInt(w, sp.Limit)
		w = appendBulkInt(w, sp.WindowMS)
		w = appendBulkInt(w, sp.Burst)
		w = appendBulkInt(w, sp.Cost)
		w = appendBulkInt(w, shadow)
		if p := sp.Penalty; p != nil && p.Enabled {
			w = appendBulkInt(w, p.DetectionWindowMS)
			w = appendBulkInt(w, p.ViolationThreshold)
			w = appendBulkInt(w, int64(len(p.Multipliers)))
			for _, m := range p.Multipliers {
				w = appendBulkInt(w, m)
			}
		} else {
			w = appendBulkInt(w, 0)
		}
	}
	return w
}

// exec sends batch in one write and reads the answers in order. Calls that
// Redis answers NOSCRIPT (restart, SCRIPT FLUSH) are sent again as EVAL.
// An I/O or protocol error closes the connection, since where the stream
// stands is then unknown, and fails the calls not yet answered; the next
// batch dials again. Scripts are never retried after an I/O error: one that
// was sent may have run.
func (d *directConn) exec(batch []*call, deadline time.Time) {
	fail := func(cs []*call, err error) {
		d.close()
		for _, c := range cs {
			c.vals, c.err = c.vals[:0], fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
	if d.c != nil && time.Since(d.used) >= d.idleCheck && !connAlive(d.c) {
		d.close()
	}
	if d.c == nil {
		if err := d.connect(deadline); err != nil {
			fail(batch, err)
			return
		}
	}
	defer func() { d.used = time.Now() }()
	_ = d.c.SetDeadline(deadline)
	w := d.w[:0]
	for _, c := range batch {
		w = appendCheck(w, c, false)
	}
	d.w = w
	if _, err := d.c.Write(w); err != nil {
		fail(batch, err)
		return
	}
	var again []*call
	for i, c := range batch {
		if err := d.readInts(c); err != nil {
			fail(batch[i:], err)
			return
		}
		if redis.HasErrorPrefix(c.err, "NOSCRIPT") {
			again = append(again, c)
		}
	}
	if len(again) == 0 {
		return
	}
	w = d.w[:0]
	for _, c := range again {
		w = appendCheck(w, c, true)
	}
	d.w = w
	if _, err := d.c.Write(w); err != nil {
		fail(again, err)
		return
	}
	for i, c := range again {
		if err := d.readInts(c); err != nil {
			fail(again[i:], err)
			return
		}
	}
}

// readInts reads one reply into c: an array of integers into c.vals, an
// error reply into c.err. It returns an error only when the stream is
// unusable.
func (d *directConn) readInts(c *call) error {
	c.vals, c.err = c.vals[:0], nil
	line, err := d.r.ReadSlice('\n')
	if err != nil {
		return err
	}
	line = trimCRLF(line)
	if len(line) == 0 {
		return errProtocol
	}
	switch line[0] {
	case '-':
		c.err = storeErr(replyError(line[1:]))
		return nil
	case '*':
	default:
		return errProtocol
	}
	n, ok := parseInt(line[1:])
	if !ok || n < 0 || n > 2+5*rules.MaxLimitsPerCheck {
		return errProtocol
	}
	for range n {
		line, err := d.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		line = trimCRLF(line)
		if len(line) == 0 || line[0] != ':' {
			return errProtocol
		}
		v, ok := parseInt(line[1:])
		if !ok {
			return errProtocol
		}
		c.vals = append(c.vals, v)
	}
	return nil
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
