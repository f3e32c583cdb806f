package redisbridge

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluicehq/sluice/redisbridge/internal/h2fast"
	"github.com/sluicehq/sluice/rules"
)

// These tests hold the h2c fast path (internal/h2fast) to net/http's
// HTTP/2 server: the same frames go to a bridge serving as it does
// (checks answered by h2fast, the rest relayed to net/http) and to a
// bridge served by net/http alone, and what comes back must match,
// stream by stream: answers (status, headers but Date, body) or resets
// with their codes, and the connection's GOAWAY.

// startNetHTTP runs a bridge served by net/http alone (no fast paths), as
// the reference.
func startNetHTTP(t testing.TB, set Settings) string {
	t.Helper()
	set.Logger = discardLogger()
	s, err := New(set)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := s.httpServer()
	go srv.Serve(ln)
	// Closed, not shut down: a graceful shutdown of net/http's HTTP/2
	// server waited a second after its GOAWAY (goAwayTimeout), and go
	// test's coordinator kills a fuzz worker still in its cleanups after
	// a second, before its temporary directories are removed.
	t.Cleanup(func() {
		srv.Close()
		s.Close()
	})
	return ln.Addr().String()
}

// startBridge runs a bridge as it serves, fast paths included, and
// returns its address.
func startBridge(t testing.TB, set Settings) string {
	t.Helper()
	return strings.TrimPrefix(startServer(t, set).URL, "http://")
}

// h2op is one thing a test client sends.
type h2op struct {
	kind   h2kind
	stream uint32
	fields []hpack.HeaderField
	data   []byte
	end    bool
	val    uint32 // window increment, setting value, priority dependency
	id     http2.SettingID
	code   http2.ErrCode
}

type h2kind uint8

const (
	opHeaders h2kind = iota
	opData
	opReset
	opWindow
	opPing
	opSettings
	opPriority
	opGoAway
	opBadBlock     // a HEADERS frame whose block is not valid HPACK
	opSettingsAck  // an ACK nobody asked for
	opNoSettings   // send no SETTINGS after the preface (first op only)
	opHeadersSplit // a header block in a HEADERS and a CONTINUATION frame
)

// h2result is what came back: per stream its outcome, and the connection's.
type h2result struct {
	streams map[uint32]string
	goAway  string // "" or "GOAWAY <code>"
	pings   []string
}

func (r h2result) String() string {
	var b strings.Builder
	ids := make([]uint32, 0, len(r.streams))
	for id := range r.streams {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		fmt.Fprintf(&b, "  stream %d: %s\n", id, r.streams[id])
	}
	fmt.Fprintf(&b, "  conn: %s pings %v\n", r.goAway, r.pings)
	return b.String()
}

// generated request ids differ between bridges.
var reqIDRe = regexp.MustCompile(`req_[0-9a-f]{24}`)

// runH2 sends ops on a new connection to addr, one at a time: after each
// a PING, whose answer says the server has dealt with everything before
// it (its resets are written and their streams forgotten), so the next op
// meets the same state on any server. Then it ends every stream the client
// left open and collects the outcome of every stream it opened and did
// not reset itself.
func runH2(t testing.TB, addr string, ops []h2op) h2result {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var wbuf bytes.Buffer
	fr := http2.NewFramer(&wbuf, c)
	fr.AllowIllegalWrites = true
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.SetMaxReadFrameSize(1 << 24)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)

	opened := map[uint32]bool{}
	ended := map[uint32]bool{}
	reset := map[uint32]bool{}
	var ids []uint32
	res := h2result{streams: map[uint32]string{}}
	events := map[uint32][]string{}
	done := map[uint32]bool{}
	lastID := uint32(1<<32 - 1)
	readErr := false
	// read handles frames until the answer to sync PING n; false once the
	// connection is over (an error GOAWAY, or closed).
	read := func(n uint16) bool {
		for !readErr && (res.goAway == "" || res.goAway == "GOAWAY NO_ERROR") {
			f, err := fr.ReadFrame()
			if err != nil {
				if se, ok := err.(http2.StreamError); ok {
					events[se.StreamID] = append(events[se.StreamID], "bad frame")
					continue
				}
				readErr = true
				break
			}
			id := f.Header().StreamID
			switch f := f.(type) {
			case *http2.MetaHeadersFrame:
				var hs []string
				for _, hf := range f.Fields {
					if hf.Name != "date" {
						hs = append(hs, hf.Name+"="+reqIDRe.ReplaceAllString(hf.Value, "req_*"))
					}
				}
				events[id] = append(events[id], "headers "+strings.Join(hs, " "))
				if f.StreamEnded() {
					done[id] = true
				}
			case *http2.DataFrame:
				if len(f.Data()) > 0 {
					events[id] = append(events[id], "data "+reqIDRe.ReplaceAllString(string(f.Data()), "req_*"))
				}
				if f.StreamEnded() {
					done[id] = true
				}
			case *http2.RSTStreamFrame:
				if !opened[id] {
					// A frame for a stream not yet opened (PRIORITY on
					// itself) was refused: not the answer of a stream.
					res.pings = append(res.pings, "reset idle "+fmt.Sprint(id))
					continue
				}
				if !done[id] {
					// A reset answer is its reset, however much of it came
					// before (when the reset overtakes it is a race).
					events[id] = []string{"reset " + f.ErrCode.String()}
				}
				done[id] = true
			case *http2.GoAwayFrame:
				res.goAway = "GOAWAY " + f.ErrCode.String()
				lastID = f.LastStreamID
			case *http2.PingFrame:
				switch {
				case !f.IsAck():
				case f.Data[0] == 0xfe:
					if uint16(f.Data[1])<<8|uint16(f.Data[2]) == n {
						return true
					}
				default:
					res.pings = append(res.pings, fmt.Sprint(f.Data[0]))
				}
			}
		}
		return false
	}
	var syncN uint16
	flush := func() bool {
		syncN++
		fr.WritePing(false, [8]byte{0xfe, byte(syncN >> 8), byte(syncN)})
		_, err := c.Write(wbuf.Bytes())
		wbuf.Reset()
		return err == nil && read(syncN)
	}

	wbuf.WriteString(http2.ClientPreface)
	if len(ops) == 0 || ops[0].kind != opNoSettings {
		fr.WriteSettings()
	}
	open := func(id uint32) {
		if !opened[id] {
			opened[id] = true
			ids = append(ids, id)
		}
	}
	live := true
	for _, op := range ops {
		switch op.kind {
		case opHeaders, opHeadersSplit:
			if !reset[op.stream] {
				open(op.stream)
			}
			hb.Reset()
			for _, f := range op.fields {
				enc.WriteField(f)
			}
			block := hb.Bytes()
			p := http2.HeadersFrameParam{StreamID: op.stream, BlockFragment: block, EndStream: op.end, EndHeaders: true}
			if op.val != 0 {
				p.Priority = http2.PriorityParam{StreamDep: op.val, Weight: 15}
			}
			if op.kind == opHeadersSplit && len(block) > 1 {
				p.BlockFragment, p.EndHeaders = block[:len(block)/2], false
				fr.WriteHeaders(p)
				fr.WriteContinuation(op.stream, true, block[len(block)/2:])
			} else {
				fr.WriteHeaders(p)
			}
			if op.end {
				ended[op.stream] = true
			}
		case opData:
			fr.WriteData(op.stream, op.end, op.data)
			if op.end {
				ended[op.stream] = true
			}
		case opReset:
			fr.WriteRSTStream(op.stream, op.code)
			reset[op.stream] = true
		case opWindow:
			fr.WriteWindowUpdate(op.stream, op.val)
		case opPing:
			fr.WritePing(false, [8]byte{byte(op.val), 1, 2, 3, 4, 5, 6, 7})
		case opSettings:
			fr.WriteSettings(http2.Setting{ID: op.id, Val: op.val})
		case opPriority:
			fr.WritePriority(op.stream, http2.PriorityParam{StreamDep: op.val, Weight: 1})
		case opGoAway:
			fr.WriteGoAway(0, op.code, nil)
		case opBadBlock:
			open(op.stream)
			ended[op.stream] = true
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: op.stream, BlockFragment: []byte{0xff, 0xff, 0xff, 0xff}, EndHeaders: true, EndStream: true})
		case opSettingsAck:
			fr.WriteSettingsAck()
		}
		if live = flush(); !live {
			break
		}
	}
	if live {
		// Every stream left open ends, and gets room for its answer.
		fr.WriteWindowUpdate(0, 1<<20)
		for _, id := range ids {
			if !ended[id] && !reset[id] {
				fr.WriteData(id, true, nil)
			}
			if !reset[id] {
				fr.WriteWindowUpdate(id, 1<<20)
			}
		}
		live = flush()
	}
	pending := func() bool {
		for _, id := range ids {
			if !reset[id] && id <= lastID && !done[id] {
				return true
			}
		}
		return false
	}
	for live && pending() && flush() {
	}
	for _, id := range ids {
		if reset[id] {
			continue
		}
		switch {
		case res.goAway != "" && res.goAway != "GOAWAY NO_ERROR":
		case id > lastID:
			res.streams[id] = "not processed"
		default:
			// Data frames may split an answer differently: join them.
			var out []string
			body := ""
			for _, e := range events[id] {
				if d, ok := strings.CutPrefix(e, "data "); ok {
					body += d
					continue
				}
				if body != "" {
					out = append(out, "data "+body)
					body = ""
				}
				out = append(out, e)
			}
			if body != "" {
				out = append(out, "data "+body)
			}
			if !done[id] {
				out = append(out, "unresolved")
			}
			res.streams[id] = strings.Join(out, " | ")
		}
	}
	sort.Strings(res.pings)
	if res.goAway != "" && res.goAway != "GOAWAY NO_ERROR" {
		res.pings = nil // which were answered before the hang-up is a race
	}
	return res
}

func fields(kv ...string) []hpack.HeaderField {
	var fs []hpack.HeaderField
	for i := 0; i+1 < len(kv); i += 2 {
		fs = append(fs, hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	return fs
}

// checkHead is the head of a check as a proxy sends it.
func checkHead(extra ...string) []hpack.HeaderField {
	return fields(append([]string{":method", "POST", ":scheme", "http", ":path", "/v1/rate-limit/check", ":authority", "bridge",
		"content-type", "application/json"}, extra...)...)
}

func wireCheck(key string) []byte {
	return []byte(checkBody(limit("rl:{u:"+key+"}:a", rules.FixedWindow, 2)))
}

// compareH2 runs ops against a bridge and against net/http and fails on
// any difference.
func compareH2(t *testing.T, name string, fast, ref string, ops []h2op) {
	t.Helper()
	a, b := runH2(t, fast, ops), runH2(t, ref, ops)
	if a.String() != b.String() {
		// Once more, on new connections: a loaded machine can make
		// either server miss a deadline (both see the same counters
		// again: the first run consumed alike or the second differs).
		if a2, b2 := runH2(t, fast, ops), runH2(t, ref, ops); a2.String() != b2.String() {
			t.Errorf("%s: h2fast and net/http differ\nh2fast:\n%snet/http:\n%sagain:\nh2fast:\n%snet/http:\n%s", name, a, b, a2, b2)
		}
	}
}

func TestServer_H2CAnswersLikeNetHTTP(t *testing.T) {
	set := testSettings()
	set.CheckToken = "tok"
	set.RLSConfig = rlsConfig(t, rlsTestConfig)
	call := rlsFrame(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		descriptor("remote_address", "10.0.0.1"), descriptor("path", "/login"), descriptor("path", "/other")}})
	rlsHead := func(extra ...string) []hpack.HeaderField {
		return fields(append([]string{":method", "POST", ":scheme", "http", ":path", rlsPath, ":authority", "bridge",
			"content-type", "application/grpc", "te", "trailers"}, extra...)...)
	}
	body := wireCheck("a")
	big := bytes.Repeat([]byte("x"), maxBody+1)
	longValue := strings.Repeat("v", 16<<10)
	var tooLong []string
	for i := 0; i < 70; i++ {
		tooLong = append(tooLong, "x-long-"+strconv.Itoa(i), longValue)
	}
	auth := []string{"authorization", "Bearer tok"}
	cases := []struct {
		name string
		ops  []h2op
	}{
		{"check", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(append(auth, "content-length", strconv.Itoa(len(body)))...)}, {kind: opData, stream: 1, data: body, end: true}}},
		{"check, request id, two frames", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(append(auth, "x-request-id", "id-7")...)},
			{kind: opData, stream: 1, data: body[:10]}, {kind: opData, stream: 1, data: body[10:], end: true}}},
		{"empty request id", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(append(auth, "x-request-id", "")...)}, {kind: opData, stream: 1, data: body, end: true}}},
		{"no token", []h2op{{kind: opHeaders, stream: 1, fields: checkHead()}, {kind: opData, stream: 1, data: body, end: true}}},
		{"no body", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(append(auth, "content-length", "5")...), end: true}}},
		{"short body", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(append(auth, "content-length", "500")...)}, {kind: opData, stream: 1, data: body, end: true}}},
		{"long body", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(append(auth, "content-length", "5")...)}, {kind: opData, stream: 1, data: body, end: true}}},
		{"too large", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(auth...)}, {kind: opData, stream: 1, data: big}}},
		{"too large, ended", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(auth...)}, {kind: opData, stream: 1, data: big, end: true}}},
		{"trailers", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(auth...)}, {kind: opData, stream: 1, data: body},
			{kind: opHeaders, stream: 1, fields: fields("x-t", "1"), end: true}}},
		{"trailers not ending", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(auth...)}, {kind: opData, stream: 1, data: body},
			{kind: opHeaders, stream: 1, fields: fields("x-t", "1")}}},
		{"two checks interleaved", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(auth...)}, {kind: opHeaders, stream: 3, fields: checkHead(auth...)},
			{kind: opData, stream: 3, data: wireCheck("b"), end: true}, {kind: opData, stream: 1, data: wireCheck("c"), end: true}}},
		{"GET healthz", []h2op{{kind: opHeaders, stream: 1, fields: fields(":method", "GET", ":scheme", "http", ":path", "/healthz", ":authority", "b"), end: true}}},
		{"GET check", []h2op{{kind: opHeaders, stream: 1, fields: fields(":method", "GET", ":scheme", "http", ":path", "/v1/rate-limit/check", ":authority", "b"), end: true}}},
		{"check with query", []h2op{{kind: opHeaders, stream: 1, fields: fields(":method", "POST", ":scheme", "http", ":path", "/v1/rate-limit/check?x=1", ":authority", "b")},
			{kind: opData, stream: 1, data: body, end: true}}},
		{"https scheme", []h2op{{kind: opHeaders, stream: 1, fields: fields(":method", "POST", ":scheme", "https", ":path", "/v1/rate-limit/check", ":authority", "b")},
			{kind: opData, stream: 1, data: body, end: true}}},
		{"no authority", []h2op{{kind: opHeaders, stream: 1, fields: fields(":method", "POST", ":scheme", "http", ":path", "/v1/rate-limit/check")},
			{kind: opData, stream: 1, data: body, end: true}}},
		{"userinfo", []h2op{{kind: opHeaders, stream: 1, fields: fields(":method", "POST", ":scheme", "http", ":path", "/v1/rate-limit/check", ":authority", "u@b")},
			{kind: opData, stream: 1, data: body, end: true}}},
		{"bad scheme", []h2op{{kind: opHeaders, stream: 1, fields: fields(":method", "POST", ":scheme", "ftp", ":path", "/v1/rate-limit/check", ":authority", "b"), end: true}}},
		{"no path", []h2op{{kind: opHeaders, stream: 1, fields: fields(":method", "POST", ":scheme", "http", ":authority", "b"), end: true}}},
		{"connection header", []h2op{{kind: opHeaders, stream: 1, fields: checkHead("connection", "keep-alive")}, {kind: opData, stream: 1, data: body, end: true}}},
		{"te gzip", []h2op{{kind: opHeaders, stream: 1, fields: checkHead("te", "gzip")}, {kind: opData, stream: 1, data: body, end: true}}},
		{"te trailers", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(append(auth, "te", "trailers")...)}, {kind: opData, stream: 1, data: body, end: true}}},
		{"expect", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(append(auth, "expect", "100-continue")...)}, {kind: opData, stream: 1, data: body, end: true}}},
		{"two authorizations", []h2op{{kind: opHeaders, stream: 1, fields: checkHead("authorization", "Bearer no", "authorization", "Bearer tok")},
			{kind: opData, stream: 1, data: body, end: true}}},
		{"upper case name", []h2op{{kind: opHeaders, stream: 1, fields: checkHead("X-Up", "1"), end: true}}},
		{"bad value", []h2op{{kind: opHeaders, stream: 1, fields: checkHead("x-v", "a\x00b"), end: true}}},
		{"header list too long", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(tooLong...), end: true}}},
		{"header list too long, body", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(tooLong...)}, {kind: opData, stream: 1, data: body, end: true}}},
		{"continuation", []h2op{{kind: opHeadersSplit, stream: 1, fields: checkHead(auth...)}, {kind: opData, stream: 1, data: body, end: true}}},
		{"self dependency", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(auth...), val: 1, end: true}}},
		{"client resets", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(auth...)}, {kind: opReset, stream: 1, code: http2.ErrCodeCancel},
			{kind: opHeaders, stream: 3, fields: checkHead(auth...)}, {kind: opData, stream: 3, data: body, end: true}}},
		// Not compared: DATA after the request ended races the answer in
		// net/http too (STREAM_CLOSED may come before or after it).
		{"data on idle stream", []h2op{{kind: opData, stream: 5, data: body, end: true}}},
		{"even stream", []h2op{{kind: opHeaders, stream: 2, fields: checkHead(auth...), end: true}}},
		{"stream id down", []h2op{{kind: opHeaders, stream: 5, fields: checkHead(auth...), end: true}, {kind: opHeaders, stream: 3, fields: checkHead(auth...), end: true}}},
		{"reset idle", []h2op{{kind: opReset, stream: 7}}},
		{"window on idle", []h2op{{kind: opWindow, stream: 7, val: 5}}},
		{"window overflow", []h2op{{kind: opWindow, stream: 0, val: 1<<31 - 1}}},
		{"zero window update", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(auth...)}, {kind: opWindow, stream: 1, val: 0}}},
		{"pings", []h2op{{kind: opPing, val: 1}, {kind: opPing, val: 2}}},
		{"no settings first", []h2op{{kind: opNoSettings}, {kind: opPing, val: 1}}},
		{"stray settings ack", []h2op{{kind: opSettingsAck}, {kind: opSettingsAck}}},
		{"zero initial window", []h2op{{kind: opSettings, id: http2.SettingInitialWindowSize, val: 0},
			{kind: opHeaders, stream: 1, fields: checkHead(auth...)}, {kind: opData, stream: 1, data: body, end: true},
			{kind: opHeaders, stream: 3, fields: fields(":method", "GET", ":scheme", "http", ":path", "/healthz", ":authority", "b"), end: true}}},
		{"small frames", []h2op{{kind: opSettings, id: http2.SettingHeaderTableSize, val: 0},
			{kind: opHeaders, stream: 1, fields: checkHead(auth...)}, {kind: opData, stream: 1, data: body, end: true}}},
		{"bad settings", []h2op{{kind: opSettings, id: http2.SettingMaxFrameSize, val: 100}}},
		{"bad hpack", []h2op{{kind: opBadBlock, stream: 1}}},
		{"client goaway", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(auth...)}, {kind: opGoAway},
			{kind: opData, stream: 1, data: body, end: true}, {kind: opHeaders, stream: 3, fields: checkHead(auth...)}}},
		{"PUT config", []h2op{{kind: opHeaders, stream: 1, fields: fields(":method", "PUT", ":scheme", "http", ":path", "/v1/rate-limit/config", ":authority", "b",
			"x-admin-key", "admin-secret")}, {kind: opData, stream: 1, data: []byte(`{"user_id":"u","endpoint":"/e","limit":3,"window_seconds":60}`), end: true}}},
		{"relayed body too large", []h2op{{kind: opHeaders, stream: 1, fields: fields(":method", "POST", ":scheme", "http", ":path", "/v1/rate-limit/batch-check", ":authority", "b")},
			{kind: opData, stream: 1, data: big}}},
		{"rls call", []h2op{{kind: opHeaders, stream: 1, fields: rlsHead(append(auth, "grpc-timeout", "250m", "user-agent", "envoy")...)},
			{kind: opData, stream: 1, data: call, end: true}}},
		{"rls calls, the third over", []h2op{{kind: opHeaders, stream: 1, fields: rlsHead(auth...)}, {kind: opData, stream: 1, data: call, end: true},
			{kind: opHeaders, stream: 3, fields: rlsHead(auth...)}, {kind: opData, stream: 3, data: call, end: true},
			{kind: opHeaders, stream: 5, fields: rlsHead(auth...)}, {kind: opData, stream: 5, data: call, end: true}}},
		{"rls, no token", []h2op{{kind: opHeaders, stream: 1, fields: rlsHead()}, {kind: opData, stream: 1, data: call, end: true}}},
		{"rls, grpc+proto", []h2op{{kind: opHeaders, stream: 1, fields: fields(":method", "POST", ":scheme", "http", ":path", rlsPath, ":authority", "b",
			"content-type", "application/grpc+proto", "authorization", "Bearer tok")}, {kind: opData, stream: 1, data: call, end: true}}},
		{"rls, JSON", []h2op{{kind: opHeaders, stream: 1, fields: fields(":method", "POST", ":scheme", "http", ":path", rlsPath, ":authority", "b",
			"content-type", "application/json", "authorization", "Bearer tok")}, {kind: opData, stream: 1, data: call, end: true}}},
		{"rls, two content types", []h2op{{kind: opHeaders, stream: 1, fields: rlsHead(append(auth, "content-type", "application/grpc")...), end: true}}},
		{"rls, not one message", []h2op{{kind: opHeaders, stream: 1, fields: rlsHead(auth...)}, {kind: opData, stream: 1, data: call[:len(call)-1], end: true}}},
		{"rls, compressed", []h2op{{kind: opHeaders, stream: 1, fields: rlsHead(auth...)}, {kind: opData, stream: 1, data: append([]byte{1}, call[1:]...), end: true}}},
		{"rls, no body", []h2op{{kind: opHeaders, stream: 1, fields: rlsHead(auth...), end: true}}},
		{"rls, too large", []h2op{{kind: opHeaders, stream: 1, fields: rlsHead(auth...)}, {kind: opData, stream: 1, data: big, end: true}}},
		{"mixed", []h2op{{kind: opHeaders, stream: 1, fields: checkHead(auth...)},
			{kind: opHeaders, stream: 3, fields: fields(":method", "GET", ":scheme", "http", ":path", "/v1/rate-limit/status/u/e", ":authority", "b", "authorization", "Bearer tok"), end: true},
			{kind: opData, stream: 1, data: body, end: true}, {kind: opHeaders, stream: 5, fields: fields(":method", "GET", ":scheme", "http", ":path", "/nope", ":authority", "b"), end: true},
			{kind: opHeaders, stream: 7, fields: checkHead(auth...)}, {kind: opData, stream: 7, data: wireCheck("m"), end: true}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Fresh bridges: every case starts from the same counters.
			compareH2(t, tc.name, startBridge(t, set), startNetHTTP(t, set), tc.ops)
		})
	}
}

// TestServer_H2CManyStreams: many concurrent checks on one connection,
// each answered exactly (distinct keys), as with a proxy's few
// connections with many streams each.
func TestServer_H2CManyStreams(t *testing.T) {
	set := testSettings()
	var ops []h2op
	for i := uint32(0); i < 200; i++ {
		id := 2*i + 1
		ops = append(ops, h2op{kind: opHeaders, stream: id, fields: checkHead()}, h2op{kind: opData, stream: id, data: wireCheck("many" + strconv.Itoa(int(i))), end: true})
	}
	compareH2(t, "200 streams", startBridge(t, set), startNetHTTP(t, set), ops)
}

// FuzzServer_H2C turns the input into frames (streams with checks and
// other requests, their heads varied, bodies, trailers, resets, window
// updates, settings, pings, priorities) and requires the bridge's answer
// to be net/http's, stream by stream and for the connection.
func FuzzServer_H2C(f *testing.F) {
	for _, s := range []string{
		"\x00\x01\x02\x03\x04", "\x00\x00\x00\x03\x00\x03\x01", "\x01\x07\x07\x00\x04\x00\x05\x00\x08\x09",
		"\x0b\x00\x00\x03\x00\x01\x06\x00\x02\x05\x01", "\x09\x00\x00\x00\x00\x03\x00\x01\x07\x00\x00",
		"\x02\x0c\x00\x00\x03\x01\x00\x05\x00\x01\x0a\x00\x00",
	} {
		f.Add([]byte(s))
	}
	set := testSettings()
	set.CheckToken = "tok"
	set.RLSConfig = rlsConfig(f, rlsTestConfig)
	fast, ref := startBridge(f, set), startNetHTTP(f, set)
	var run atomic.Int64
	f.Fuzz(func(t *testing.T, b []byte) {
		ops := fuzzH2Ops(b, "f"+strconv.FormatInt(run.Add(1), 10))
		compareH2(t, fmt.Sprintf("%q", b), fast, ref, ops)
	})
}

// fuzzH2Ops makes a script of at most 40 frames from b. Streams follow
// the protocol from the client's side (no DATA after the end of a
// stream): what happens then is a race in net/http too.
func fuzzH2Ops(b []byte, key string) []h2op {
	next := func() byte {
		if len(b) == 0 {
			return 0
		}
		c := b[0]
		b = b[1:]
		return c
	}
	var ops []h2op
	var open []uint32 // streams the client may still send on
	nextID := uint32(1)
	var gaps []uint32   // stream ids skipped
	budget := 256 << 10 // body bytes: the connection window is never the limit
	pick := func() (uint32, int) {
		if len(open) == 0 {
			return 0, -1
		}
		i := int(next()) % len(open)
		return open[i], i
	}
	bodies := func(id uint32) []byte {
		k := key + "s" + strconv.Itoa(int(id))
		switch next() % 8 {
		case 0:
			return wireCheck(k)
		case 1:
			return []byte(`{"user_id":"` + k + `","endpoint":"/x","limit":1}`)
		case 2:
			return []byte(`{"limits":`)
		case 3:
			return nil
		case 4:
			return bytes.Repeat([]byte("x"), maxBody+1)
		case 5:
			return []byte(`{"checks":[{"user_id":"` + k + `","endpoint":"/e"}]}`)
		case 6:
			return rlsFrame(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("remote_address", k)}})
		}
		return wireCheck(k)[:10]
	}
	for len(b) > 0 && len(ops) < 40 {
		switch op := next() % 12; op {
		case 0, 1, 2, 11:
			id := nextID
			switch next() % 16 {
			case 0:
				if len(gaps) > 0 {
					id = gaps[0] // never used, below the last: connection error
				}
			case 1:
				id = nextID + 1 // even
			case 2:
				gaps = append(gaps, nextID)
				id = nextID + 2
			}
			if id >= nextID && id%2 == 1 {
				nextID = id + 2
			}
			h := h2op{kind: opHeaders, stream: id, fields: fuzzHead(next), end: next()%3 == 0}
			// A request its handler may answer before reading the body
			// ends with its head: frames after such an answer race it in
			// net/http too.
			h.end = h.end || !readsBody(h.fields)
			if op == 11 {
				h.kind = opHeadersSplit
			}
			if next()%16 == 0 {
				h.val = id // depends on itself
			}
			ops = append(ops, h)
			if !h.end {
				open = append(open, id)
			}
		case 3, 4:
			id, i := pick()
			if i < 0 {
				continue
			}
			d := bodies(id)
			if len(d) > budget {
				d = d[:0]
			}
			budget -= len(d)
			end := next()%2 == 0
			ops = append(ops, h2op{kind: opData, stream: id, data: d, end: end})
			if end {
				open = append(open[:i], open[i+1:]...)
			}
		case 5:
			id, i := pick()
			if i < 0 {
				continue
			}
			t := h2op{kind: opHeaders, stream: id, fields: fields("x-trailer", "1"), end: next()%4 != 0}
			if next()%4 == 0 {
				t.fields = fields(":path", "/")
			}
			ops = append(ops, t)
			open = append(open[:i], open[i+1:]...) // one trailer block at most: a second is racy too
		case 6:
			id, i := pick()
			if i < 0 {
				continue
			}
			ops = append(ops, h2op{kind: opReset, stream: id, code: http2.ErrCode(next() % 14)})
			open = append(open[:i], open[i+1:]...)
		case 7:
			w := h2op{kind: opWindow, val: []uint32{0, 1, 1000, 1 << 20, 1<<31 - 1}[next()%5]}
			if id, i := pick(); i >= 0 && next()%2 == 0 {
				w.stream = id
			}
			ops = append(ops, w)
		case 8:
			ops = append(ops, h2op{kind: opPing, val: uint32(next())})
		case 9:
			s := []struct {
				id  http2.SettingID
				val uint32
			}{
				{http2.SettingInitialWindowSize, 0}, {http2.SettingInitialWindowSize, 16}, {http2.SettingInitialWindowSize, 1 << 31},
				{http2.SettingMaxFrameSize, 16384}, {http2.SettingMaxFrameSize, 100}, {http2.SettingHeaderTableSize, 0},
				{http2.SettingHeaderTableSize, 100}, {http2.SettingEnablePush, 2}, {http2.SettingMaxHeaderListSize, 100},
				{http2.SettingMaxConcurrentStreams, 1}, {0x99, 7},
			}[int(next())%11]
			ops = append(ops, h2op{kind: opSettings, id: s.id, val: s.val})
		case 10:
			id, _ := pick()
			if id == 0 {
				id = nextID
			}
			ops = append(ops, h2op{kind: opPriority, stream: id, val: []uint32{0, id, 1}[next()%3]})
		}
	}
	return ops
}

// readsBody tells a head the bridge answers itself (see h2fast's
// parseCheck), which waits for the whole body. Other requests go to
// net/http through the relay, whose answers come later than net/http's
// own: frames after their head would race them, so they end with it.
func readsBody(fs []hpack.HeaderField) bool {
	seen := map[string]int{}
	rls, grpc := false, false
	for _, f := range fs {
		seen[f.Name]++
		switch f.Name {
		case ":method":
			if f.Value != "POST" {
				return false
			}
		case ":path":
			rls = f.Value == rlsPath
			if f.Value != "/v1/rate-limit/check" && !rls {
				return false
			}
		case "content-type":
			grpc = h2fast.IsGRPC(f.Value)
		case ":scheme":
			if f.Value != "http" {
				return false
			}
		case ":authority":
			if f.Value == "" || strings.Contains(f.Value, "@") {
				return false
			}
		case "content-length":
			if _, err := strconv.ParseUint(f.Value, 10, 63); err != nil {
				return false
			}
		case "te":
			if f.Value != "trailers" && f.Value != "" {
				return false
			}
		case "connection", "expect", "trailer", "X-Upper", "x-bad":
			return false
		}
	}
	if rls && (!grpc || seen["content-type"] != 1) {
		return false
	}
	return seen[":authority"] == 1 && seen[":method"] == 1 && seen[":scheme"] == 1 && seen[":path"] == 1 &&
		seen["content-length"] <= 1 && seen["authorization"] <= 1 && seen["te"] <= 1
}

// fuzzHead is a request head: a check's, or one of its variations.
func fuzzHead(next func() byte) []hpack.HeaderField {
	method := []string{"POST", "POST", "POST", "GET", "PUT", "post", ""}[next()%7]
	path := []string{"/v1/rate-limit/check", "/v1/rate-limit/check", "/healthz", "/v1/rate-limit/batch-check",
		"/v1/rate-limit/check?a=1", "/nope", "v1", "", "/v1/rate-limit/status/u/e", rlsPath, rlsPath}[next()%11]
	scheme := []string{"http", "http", "https", "", "ftp"}[next()%5]
	authority := []string{"bridge", "bridge", "", "u@b", "b:80"}[next()%5]
	var fs []hpack.HeaderField
	add := func(k, v string) {
		if v != "" || k[0] != ':' {
			fs = append(fs, hpack.HeaderField{Name: k, Value: v})
		}
	}
	add(":method", method)
	add(":scheme", scheme)
	add(":path", path)
	add(":authority", authority)
	for range next() % 4 {
		switch next() % 20 {
		case 0:
			add("authorization", "Bearer tok")
		case 1:
			add("authorization", "Bearer wrong")
		case 2:
			add("x-request-id", "rid")
		case 3:
			add("x-request-id", "")
		case 4:
			add("content-length", strconv.Itoa(int(next())))
		case 5:
			add("content-length", "x")
		case 6:
			add("te", "trailers")
		case 7:
			add("te", "gzip")
		case 8:
			add("connection", "close")
		case 9:
			add("expect", "100-continue")
		case 10:
			add("trailer", "x-trailer")
		case 11:
			add("X-Upper", "1")
		case 12:
			add("x-bad", "a\x01b")
		case 13:
			add("host", "h")
		case 14:
			add("cookie", "a=1")
		case 15:
			add("content-type", "application/json")
		case 16, 17:
			add("content-type", "application/grpc")
		case 18:
			add("content-type", "application/grpc+proto")
		default:
			add("grpc-timeout", []string{"1S", "5m", "x"}[next()%3])
		}
	}
	return fs
}

// TestServer_H2CShutdown: a bridge shutting down sends its h2c clients a
// GOAWAY, finishes the check and the relayed request in flight on the
// connection, then closes it, and Serve returns.
func TestServer_H2CShutdown(t *testing.T) {
	set := testSettings()
	set.Logger = discardLogger()
	s, err := New(set)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	head := func(id uint32, fs []hpack.HeaderField) {
		hb.Reset()
		for _, f := range fs {
			enc.WriteField(f)
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
	}
	c.Write([]byte(http2.ClientPreface))
	fr.WriteSettings()
	head(1, checkHead())
	// Expect: net/http's 100 Continue says it has the stream.
	head(3, fields(":method", "POST", ":scheme", "http", ":path", "/v1/rate-limit/batch-check", ":authority", "b", "expect", "100-continue"))
	read := func(until func(http2.Frame) bool) {
		t.Helper()
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatal(err)
			}
			if until(f) {
				return
			}
		}
	}
	read(func(f http2.Frame) bool {
		h, ok := f.(*http2.MetaHeadersFrame)
		return ok && h.StreamID == 3 && h.PseudoValue("status") == "100"
	})
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	read(func(f http2.Frame) bool {
		g, ok := f.(*http2.GoAwayFrame)
		return ok && g.ErrCode == http2.ErrCodeNo && g.LastStreamID == 3
	})
	fr.WriteData(1, true, wireCheck("shutdown"))
	fr.WriteData(3, true, []byte(`{"checks":[{"user_id":"u","endpoint":"/e"}]}`))
	status := map[uint32]string{}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			break // closed once both are answered
		}
		if h, ok := f.(*http2.MetaHeadersFrame); ok {
			status[h.StreamID] = h.PseudoValue("status")
		}
	}
	if status[1] != "200" || status[3] != "200" {
		t.Fatalf("answers during shutdown: %v", status)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// TestServer_HTTP2TableSizeSettings: a client that changes
// SETTINGS_HEADER_TABLE_SIZE while answers are being written cannot
// crash the bridge's net/http server (what serves TLS and what the fast
// paths hand over): every request is answered.
func TestServer_HTTP2TableSizeSettings(t *testing.T) {
	addr := startNetHTTP(t, testSettings())
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	var wbuf bytes.Buffer
	fr := http2.NewFramer(&wbuf, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	wbuf.WriteString(http2.ClientPreface)
	fr.WriteSettings()
	const batches, perBatch = 40, 50
	id := uint32(1)
	for b := range batches {
		for i := range perBatch {
			hb.Reset()
			for _, f := range fields(":method", "GET", ":scheme", "http", ":path", "/healthz", ":authority", "bridge",
				"x-request-id", fmt.Sprintf("r-%d-%d", b, i)) {
				enc.WriteField(f)
			}
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true})
			id += 2
			// The answers index their request ids; a table size of 0
			// empties the server's table again.
			fr.WriteSettings(http2.Setting{ID: http2.SettingHeaderTableSize, Val: uint32(i%2) * 4096})
		}
		if _, err := c.Write(wbuf.Bytes()); err != nil {
			t.Fatal(err)
		}
		wbuf.Reset()
		for answered := 0; answered < perBatch; {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf("batch %d: %d of %d answered: %v", b, answered, perBatch, err)
			}
			switch f := f.(type) {
			case *http2.MetaHeadersFrame:
				if f.PseudoValue("status") != "200" {
					t.Fatalf("stream %d: status %s", f.StreamID, f.PseudoValue("status"))
				}
				if f.StreamEnded() {
					answered++
				}
			case *http2.DataFrame:
				if f.StreamEnded() {
					answered++
				}
			case *http2.RSTStreamFrame, *http2.GoAwayFrame:
				t.Fatalf("batch %d: %v", b, f)
			}
		}
	}
}
