//go:build long

package redisbridge

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/sluicehq/sluice/redisbridge/redistest"
)

// snapshotADS is an xDS server that gives every stream the resources of
// its current version, when the stream opens and when the version
// changes, as go-control-plane's snapshot cache does; it keeps, by node,
// what each client said of each nonce: "" for an ACK, else the NACK's
// error.
type snapshotADS struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	mu      sync.Mutex
	current *discoveryv3.DiscoveryResponse
	changed chan struct{} // closed and replaced when current changes
	said    map[string]map[string]string
	heard   chan struct{} // closed and replaced when said changes
}

func (s *snapshotADS) StreamAggregatedResources(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	first, err := st.Recv()
	if err != nil {
		return err
	}
	node := first.GetNode().GetId()
	go func() {
		for {
			req, err := st.Recv()
			if err != nil {
				return
			}
			if req.GetResponseNonce() == "" {
				continue
			}
			s.mu.Lock()
			if s.said[node] == nil {
				s.said[node] = map[string]string{}
			}
			s.said[node][req.GetResponseNonce()] = req.GetErrorDetail().GetMessage()
			close(s.heard)
			s.heard = make(chan struct{})
			s.mu.Unlock()
		}
	}()
	var sent *discoveryv3.DiscoveryResponse
	for {
		s.mu.Lock()
		cur, changed := s.current, s.changed
		s.mu.Unlock()
		if cur != nil && cur != sent {
			if err := st.Send(cur); err != nil {
				return err
			}
			sent = cur
		}
		select {
		case <-changed:
		case <-st.Context().Done():
			return nil
		}
	}
}

// set makes resources the current version.
func (s *snapshotADS) set(t *testing.T, version string, resources ...*rlsconf.RateLimitConfig) {
	r := xdsResponse(t, version, resources...)
	s.mu.Lock()
	s.current = r
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// answer is what node said of the response with nonce, once it has.
func (s *snapshotADS) answer(t *testing.T, node, nonce string) string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		s.mu.Lock()
		msg, ok := s.said[node][nonce]
		heard := s.heard
		s.mu.Unlock()
		if ok {
			return msg
		}
		select {
		case <-heard:
		case <-deadline:
			t.Fatalf("%s has not answered %s in 30 s", node, nonce)
		}
	}
}

// TestLong_RLS_XDSReadAsEnvoyRatelimit gives envoyproxy/ratelimit
// (CONFIG_TYPE=GRPC_XDS_SOTW) and the bridge (--rls-xds) the same
// RateLimitConfig resources from one xDS server, version after version,
// and compares what each holds then (/rlconfig): both take a version and
// hold the same limits, or both refuse it (a NACK) and keep the version
// before. Quota mode and metadata are left out: the version of the
// service the module proxy serves predates them in xDS.
func TestLong_RLS_XDSReadAsEnvoyRatelimit(t *testing.T) {
	bin := envoyRatelimitBinary(t)
	rs := redistest.Start(t)
	ads := &snapshotADS{changed: make(chan struct{}), heard: make(chan struct{}), said: map[string]map[string]string{}}
	addr := serveADS(t, ads, nil)

	limit := func(u rlsconf.RateLimitUnit, n uint32) *rlsconf.RateLimitPolicy {
		return &rlsconf.RateLimitPolicy{Unit: u, RequestsPerUnit: n}
	}
	d := func(key, value string, rl *rlsconf.RateLimitPolicy, children ...*rlsconf.RateLimitDescriptor) *rlsconf.RateLimitDescriptor {
		return &rlsconf.RateLimitDescriptor{Key: key, Value: value, RateLimit: rl, Descriptors: children}
	}
	cfg := func(name, domain string, ds ...*rlsconf.RateLimitDescriptor) *rlsconf.RateLimitConfig {
		return &rlsconf.RateLimitConfig{Name: name, Domain: domain, Descriptors: ds}
	}
	versions := []struct {
		name      string
		resources []*rlsconf.RateLimitConfig
	}{
		{"limits, nested, a wildcard", []*rlsconf.RateLimitConfig{cfg("edge", "edge",
			d("remote_address", "", limit(rlsconf.RateLimitUnit_SECOND, 10)),
			d("path", "/login", &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 5, Name: "login"}),
			d("user", "", nil, d("path", "/login", &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: 1,
				Replaces: []*rlsconf.RateLimitReplace{{Name: "login"}}}), d("path", "", limit(rlsconf.RateLimitUnit_DAY, 4))),
			d("file", "a/*", limit(rlsconf.RateLimitUnit_WEEK, 2)),
			&rlsconf.RateLimitDescriptor{Key: "shadow", RateLimit: limit(rlsconf.RateLimitUnit_MONTH, 3), ShadowMode: true, DetailedMetric: true},
		), cfg("other", "internal", d("k", "v", limit(rlsconf.RateLimitUnit_YEAR, 7)))}},
		{"requests_per_unit left out, unlimited", []*rlsconf.RateLimitConfig{cfg("edge", "edge",
			d("blocked", "", limit(rlsconf.RateLimitUnit_HOUR, 0)),
			d("free", "", &rlsconf.RateLimitPolicy{Unlimited: true}))}},
		{"no unit: refused", []*rlsconf.RateLimitConfig{cfg("edge", "edge", d("k", "", limit(rlsconf.RateLimitUnit_UNKNOWN, 5)))}},
		{"a unit with unlimited: refused", []*rlsconf.RateLimitConfig{cfg("edge", "edge",
			d("k", "", &rlsconf.RateLimitPolicy{Unlimited: true, Unit: rlsconf.RateLimitUnit_SECOND}))}},
		{"one domain twice: refused", []*rlsconf.RateLimitConfig{cfg("a", "edge", d("k", "", limit(rlsconf.RateLimitUnit_SECOND, 1))),
			cfg("b", "edge", d("j", "", limit(rlsconf.RateLimitUnit_SECOND, 1)))}},
		{"two domains, numbers as written", []*rlsconf.RateLimitConfig{cfg("a", "007", d("1.10", "yes", limit(rlsconf.RateLimitUnit_SECOND, 1))),
			cfg("b", "edge", d("k", "0x1F", &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 4_000_000_000, Name: "007"}))}},
		{"a descriptor twice: refused", []*rlsconf.RateLimitConfig{cfg("edge", "edge", d("k", "", limit(rlsconf.RateLimitUnit_SECOND, 1)),
			d("k", "", limit(rlsconf.RateLimitUnit_SECOND, 2)))}},
		{"no domain: refused", []*rlsconf.RateLimitConfig{cfg("edge", "", d("k", "", limit(rlsconf.RateLimitUnit_SECOND, 1)))}},
		{"empty", nil},
	}
	ads.set(t, "0", versions[0].resources...)
	them := startEnvoyRatelimit(t, bin, rs.Addr, nil, "CONFIG_TYPE=GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL="+addr, "CONFIG_GRPC_XDS_NODE_ID=ratelimit")
	set := DefaultSettings()
	set.Store, set.RedisURL = "redis", rs.URL
	set.RLSXDS, set.RLSXDSNodeID = "http://"+addr, "bridge"
	bridge := startServer(t, set)
	dump := func(which string) string {
		var body string
		if which == "ratelimit" {
			res, err := http.Get("http://" + them.debug + "/rlconfig")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			body = string(b)
		} else {
			rec := httptest.NewRecorder()
			bridge.RLSConfigHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/rlconfig", nil))
			body = rec.Body.String()
		}
		lines := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
		slices.Sort(lines)
		return strings.Join(lines, "\n")
	}
	for i, v := range versions {
		version := strconv.Itoa(i)
		if i > 0 {
			ads.set(t, version, v.resources...)
		}
		theirs, ours := ads.answer(t, "ratelimit", "n"+version), ads.answer(t, "bridge", "n"+version)
		if (theirs == "") != (ours == "") {
			t.Errorf("version %s (%s): envoyproxy/ratelimit %s, the bridge %s", version, v.name, verdict(theirs), verdict(ours))
			continue
		}
		if a, b := dump("ratelimit"), dump("bridge"); a != b {
			t.Errorf("version %s (%s), %s by both; envoyproxy/ratelimit holds:\n%s\nthe bridge:\n%s", version, v.name, verdict(ours), a, b)
		}
	}
}

// verdict says what a client said of a response.
func verdict(nack string) string {
	if nack == "" {
		return "took it"
	}
	return "refused it (" + nack + ")"
}
