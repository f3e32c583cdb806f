package redisbridge

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"net"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluicehq/sluice/internal/nettest"
	"github.com/sluicehq/sluice/internal/tlsfiles/tlsfilestest"
	"github.com/sluicehq/sluice/redisbridge/internal/rls"
)

// fakeADS is an xDS management server's aggregated discovery service, as
// go-control-plane's generated server serves it: each stream gets the
// responses the test sends on responses, and the test gets the requests
// of every stream on requests; a value on end ends the stream it reaches
// with UNAVAILABLE, as a server restarting does.
type fakeADS struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	responses chan *discoveryv3.DiscoveryResponse
	requests  chan *discoveryv3.DiscoveryRequest
	headers   chan metadata.MD // each stream's
	end       chan struct{}
}

func (f *fakeADS) StreamAggregatedResources(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	md, _ := metadata.FromIncomingContext(st.Context())
	select {
	case f.headers <- md:
	default: // a test that does not look
	}
	go func() {
		for {
			req, err := st.Recv()
			if err != nil {
				return
			}
			f.requests <- req
		}
	}()
	for {
		select {
		case r := <-f.responses:
			if err := st.Send(r); err != nil {
				return err
			}
		case <-f.end:
			return status.Error(codes.Unavailable, "restarting")
		case <-st.Context().Done():
			return nil
		}
	}
}

// startADS serves a fakeADS (serveADS) and returns it and its address.
func startADS(t *testing.T, creds credentials.TransportCredentials) (*fakeADS, string) {
	t.Helper()
	f := &fakeADS{responses: make(chan *discoveryv3.DiscoveryResponse), requests: make(chan *discoveryv3.DiscoveryRequest, 16),
		headers: make(chan metadata.MD, 1), end: make(chan struct{})}
	return f, serveADS(t, f, creds)
}

// serveADS serves ads on a loopback port until t ends, in the clear, or
// over TLS with creds, and returns its address.
func serveADS(t *testing.T, ads discoveryv3.AggregatedDiscoveryServiceServer, creds credentials.TransportCredentials) string {
	t.Helper()
	var opts []grpc.ServerOption
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	srv := grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, ads)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// xdsResponse is a response of version with resources, its nonce "n" and
// the version.
func xdsResponse(t *testing.T, version string, resources ...*rlsconf.RateLimitConfig) *discoveryv3.DiscoveryResponse {
	t.Helper()
	r := &discoveryv3.DiscoveryResponse{VersionInfo: version, TypeUrl: rls.XDSTypeURL, Nonce: "n" + version}
	for _, c := range resources {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		r.Resources = append(r.Resources, a)
	}
	return r
}

// oneLimit is a configuration of domain d whose key k has n calls an hour.
func oneLimit(n uint32) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: "cfg", Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: n}}}}
}

// nextRequest is the next request the server gets, within the test's
// bound.
func nextRequest(t *testing.T, f *fakeADS) *discoveryv3.DiscoveryRequest {
	t.Helper()
	select {
	case r := <-f.requests:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no request from the bridge in 10 s")
		return nil
	}
}

// wantRequest holds req to an ACK of version for nonce ("" for a
// stream's first request), or with nack to a NACK whose message has it.
func wantRequest(t *testing.T, req *discoveryv3.DiscoveryRequest, version, nonce, nack string) {
	t.Helper()
	if req.GetNode().GetId() != "node-1" || req.GetNode().GetUserAgentName() != "sluice-bridge" || req.GetTypeUrl() != rls.XDSTypeURL ||
		len(req.GetResourceNames()) != 0 || req.GetVersionInfo() != version || req.GetResponseNonce() != nonce {
		t.Fatalf("request %v; want node node-1, type %s, every resource, version %q, nonce %q", req, rls.XDSTypeURL, version, nonce)
	}
	switch msg := req.GetErrorDetail().GetMessage(); {
	case nack == "" && req.GetErrorDetail() != nil:
		t.Fatalf("a NACK (%s), want an ACK", msg)
	case nack != "" && (req.GetErrorDetail().GetCode() != int32(codes.InvalidArgument) || !strings.Contains(msg, nack)):
		t.Fatalf("error detail %v, want INVALID_ARGUMENT with %q", req.GetErrorDetail(), nack)
	}
}

// The rate limit service takes its configuration from an xDS server
// (--rls-xds), as envoyproxy/ratelimit with CONFIG_TYPE=GRPC_XDS_SOTW:
// calls fail UNAVAILABLE until the first response; a response is applied
// and acknowledged; one refused is NACKed with the error, and the
// configuration in use stays; when the stream ends, a new one starts from
// the version last applied.
func TestServer_RLSFromXDS(t *testing.T) {
	ads, addr := startADS(t, nil)
	set := testSettings()
	set.RLSXDS, set.RLSXDSNodeID = "http://"+addr, "node-1"
	ts := startServer(t, set)
	bridge := strings.TrimPrefix(ts.URL, "http://")
	client := rlsClient(t, bridge)
	call := func() (rlsv3.RateLimitResponse_Code, error) {
		res, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
		return res.GetOverallCode(), err
	}
	dump := func() string { // /rlconfig, which cmd/redisbridge serves on --debug-listen
		rec := httptest.NewRecorder()
		ts.RLSConfigHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/rlconfig", nil))
		return fmt.Sprintf("%d %s", rec.Code, strings.TrimSpace(rec.Body.String()))
	}

	wantRequest(t, nextRequest(t, ads), "", "", "")
	if _, err := call(); status.Code(err) != codes.Unavailable {
		t.Errorf("a call before any configuration: %v, want UNAVAILABLE", err)
	}
	if got := dump(); got != "503 no rate limit service configuration from the xDS server yet (--rls-xds)" {
		t.Errorf("before any configuration, /rlconfig: %s", got)
	}
	if r := do(t, nil, "POST", ts.URL+"/json", `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`); r.status != 503 ||
		!strings.Contains(string(r.body), "SERVICE_UNAVAILABLE") {
		t.Errorf("POST /json before any configuration: %d %s, want 503", r.status, r.body)
	}
	health := healthpb.NewHealthClient(grpcConn(t, bridge))
	healthOf := func() string {
		var out []string
		for _, service := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
			r, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
			out = append(out, fmt.Sprint(r.GetStatus(), err))
		}
		return strings.Join(out, ", ")
	}
	if got := healthOf(); got != "NOT_SERVING <nil>, NOT_SERVING <nil>" {
		t.Errorf("gRPC health before any configuration: %s", got)
	}
	ads.responses <- xdsResponse(t, "1", oneLimit(1))
	wantRequest(t, nextRequest(t, ads), "1", "n1", "")
	if got := healthOf(); got != "SERVING <nil>, SERVING <nil>" {
		t.Errorf("gRPC health on version 1: %s", got)
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if code, err := call(); code != want || err != nil {
			t.Errorf("call %d on version 1: %v %v, want %v", i+1, code, err, want)
		}
	}
	bad := oneLimit(1)
	bad.Descriptors[0].RateLimit.Unit = rlsconf.RateLimitUnit_UNKNOWN
	ads.responses <- xdsResponse(t, "2", bad)
	wantRequest(t, nextRequest(t, ads), "1", "n2", `xds:cfg: descriptors[0].rate_limit.unit: "" is not second`)
	if got := dump(); got != "200 d.k: unit=HOUR requests_per_unit=1, shadow_mode: false, quota_mode: false" {
		t.Errorf("after version 2 was refused, /rlconfig: %s", got)
	}
	ads.responses <- xdsResponse(t, "3", oneLimit(5))
	wantRequest(t, nextRequest(t, ads), "3", "n3", "")
	if got := dump(); got != "200 d.k: unit=HOUR requests_per_unit=5, shadow_mode: false, quota_mode: false" {
		t.Errorf("version 3, /rlconfig: %s", got)
	}
	// The counter goes on from its count under the new number, as after
	// an edited file: the second call of the hour is allowed now.
	if code, err := call(); code != rlsv3.RateLimitResponse_OK || err != nil {
		t.Errorf("a call on version 3: %v %v, want OK", code, err)
	}

	ads.end <- struct{}{}
	wantRequest(t, nextRequest(t, ads), "3", "", "") // a new stream
	ads.responses <- xdsResponse(t, "4", oneLimit(7), &rlsconf.RateLimitConfig{Name: "other", Domain: "e"})
	wantRequest(t, nextRequest(t, ads), "4", "n4", "")
	if got := dump(); got != "200 d.k: unit=HOUR requests_per_unit=7, shadow_mode: false, quota_mode: false" {
		t.Errorf("version 4, /rlconfig: %s", got)
	}
	metrics := do(t, nil, "GET", ts.URL+"/metrics", "")
	for _, line := range []string{`sluice_bridge_rls_xds_updates_total{result="applied"} 3`, `sluice_bridge_rls_xds_updates_total{result="refused"} 1`} {
		if !strings.Contains(string(metrics.body), line) {
			t.Errorf("/metrics has no line %s", line)
		}
	}
}

// Over TLS (https://), the bridge verifies the server with --rls-xds-ca
// and shows its own certificate (--rls-xds-cert, --rls-xds-key) to a
// server that asks for one.
func TestServer_RLSFromXDSOverTLS(t *testing.T) {
	ca := tlsfilestest.NewCA(t)
	dir := t.TempDir()
	serverCert, serverKey := ca.Issue(t, dir, "xds")
	pair, err := tls.LoadX509KeyPair(serverCert, serverKey)
	if err != nil {
		t.Fatal(err)
	}
	ads, addr := startADS(t, credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: ca.Pool,
		ClientAuth: tls.RequireAndVerifyClientCert}))
	set := testSettings()
	set.RLSXDS, set.RLSXDSNodeID = "https://"+addr, "node-1"
	set.RLSXDSCA = filepath.Join(dir, "ca.PEM")
	ca.WriteCert(t, set.RLSXDSCA)
	set.RLSXDSCert, set.RLSXDSKey = ca.Issue(t, dir, "bridge")
	startServer(t, set)
	wantRequest(t, nextRequest(t, ads), "", "", "")
	ads.responses <- xdsResponse(t, "1", oneLimit(1))
	wantRequest(t, nextRequest(t, ads), "1", "n1", "")
}

// A server whose certificate names it otherwise than the URL's host (here
// only xds.internal, reached at 127.0.0.1) is verified by that name with
// --rls-xds-server-name; without it, the handshake fails and the server
// hears nothing.
func TestServer_RLSFromXDSServerName(t *testing.T) {
	ca := tlsfilestest.NewCA(t)
	dir := t.TempDir()
	pair, err := tls.LoadX509KeyPair(ca.IssueFor(t, dir, "xds", nil, "xds.internal"))
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.PEM")
	ca.WriteCert(t, caFile)
	for _, name := range []string{"", "xds.internal"} {
		handshakes := make(chan error, 16)
		ads, addr := startADS(t, credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair},
			VerifyConnection: func(tls.ConnectionState) error { handshakes <- nil; return nil }}))
		set := testSettings()
		set.RLSXDS, set.RLSXDSNodeID, set.RLSXDSCA, set.RLSXDSServerName = "https://"+addr, "node-1", caFile, name
		startServer(t, set)
		if name != "" {
			wantRequest(t, nextRequest(t, ads), "", "", "")
			continue
		}
		// The client refuses the certificate after the server's part of the
		// handshake: the server saw a connection, and no request follows
		// it before the next attempt.
		select {
		case <-handshakes:
		case <-time.After(10 * time.Second):
			t.Fatal("without --rls-xds-server-name: no handshake in 10 s")
		}
		select {
		case r := <-ads.requests:
			t.Errorf("without --rls-xds-server-name, the server heard %v", r)
		case <-handshakes: // the next attempt, after the backoff
		case <-time.After(10 * time.Second):
			t.Fatal("without --rls-xds-server-name: no request and no new attempt in 10 s")
		}
	}
}

// The --rls-xds settings refused, with the flag at fault.
// The node's metadata and the extra headers reach the xDS server: the
// metadata as the Node's Struct of strings, the headers as the stream's
// gRPC metadata, names lower-cased.
func TestServer_RLSFromXDSNodeMetadata(t *testing.T) {
	ads, addr := startADS(t, nil)
	set := testSettings()
	set.RLSXDS, set.RLSXDSNodeID = "http://"+addr, "node-1"
	set.RLSXDSNodeMetadata, set.RLSXDSHeaders = "cluster=edge, zone=eu-west-1,empty=", "X-XDS-Token=secret,x-tenant=a=b"
	startServer(t, set)
	req := nextRequest(t, ads)
	wantRequest(t, req, "", "", "")
	got := map[string]string{}
	for k, v := range req.GetNode().GetMetadata().GetFields() {
		got[k] = v.GetStringValue()
	}
	if want := map[string]string{"cluster": "edge", "zone": "eu-west-1", "empty": ""}; !maps.Equal(got, want) {
		t.Errorf("node metadata %v, want %v", got, want)
	}
	select {
	case md := <-ads.headers:
		if tok, tenant := md.Get("x-xds-token"), md.Get("x-tenant"); !slices.Equal(tok, []string{"secret"}) || !slices.Equal(tenant, []string{"a=b"}) {
			t.Errorf("stream headers %v: want x-xds-token secret, x-tenant a=b", md)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no stream's headers in 10 s")
	}
}

func TestSettings_ValidateXDS(t *testing.T) {
	for _, tc := range []struct {
		change func(*Settings)
		err    string
	}{
		{func(s *Settings) { s.RLSXDS = "xds.example:18000" }, `--rls-xds "xds.example:18000": want http://HOST:PORT or https://HOST:PORT`},
		{func(s *Settings) { s.RLSXDS = "http://xds:1/path" }, "want http://HOST:PORT"},
		{func(s *Settings) { s.RLSXDS, s.RLSConfig = "http://xds:1", "r.yaml" }, "--rls-xds: not with --rls-config"},
		{func(s *Settings) { s.RLSXDS, s.RLSXDSCA = "http://xds:1", "ca.PEM" }, "--rls-xds-ca, --rls-xds-cert, --rls-xds-server-name: only with an https:// --rls-xds"},
		{func(s *Settings) { s.RLSXDS, s.RLSXDSServerName = "http://xds:1", "xds" }, "only with an https:// --rls-xds"},
		{func(s *Settings) { s.RLSXDSCert = "c.pem" }, "only with --rls-xds"},
		{func(s *Settings) { s.RLSXDS, s.RLSXDSCert = "https://xds:1", "c.pem" }, "--rls-xds-cert, --rls-xds-key: set both or neither"},
		{func(s *Settings) { s.RLSXDS, s.RLSXDSNodeID = "https://xds:1", "" }, "--rls-xds-node-id: empty"},
		{func(s *Settings) { s.RLSXDSHeaders = "a=b" }, "--rls-xds-node-metadata, --rls-xds-headers: only with --rls-xds"},
		{func(s *Settings) { s.RLSXDS, s.RLSXDSNodeMetadata = "http://xds:1", "zone" }, `--rls-xds-node-metadata "zone": want KEY=VALUE pairs`},
		{func(s *Settings) { s.RLSXDS, s.RLSXDSNodeMetadata = "http://xds:1", "a=1,a=2" }, `--rls-xds-node-metadata: key "a" given twice`},
		{func(s *Settings) { s.RLSXDS, s.RLSXDSHeaders = "http://xds:1", "bad name=1" }, `--rls-xds-headers: "bad name" is not a header name`},
		{func(s *Settings) { s.RLSXDS, s.RLSXDSHeaders = "http://xds:1", "Grpc-Timeout=1S" }, "--rls-xds-headers: Grpc-Timeout is gRPC's own header"},
		{func(s *Settings) { s.RLSXDS, s.RLSXDSHeaders = "http://xds:1", "=v" }, "want KEY=VALUE pairs"},
	} {
		set := DefaultSettings()
		tc.change(&set)
		if err := set.Validate(); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%v, want %q", err, tc.err)
		}
	}
	set := DefaultSettings()
	set.RLSXDS = "https://xds.example:18000"
	if err := set.Validate(); err != nil || set.RLSXDSNodeID != "default" {
		t.Errorf("https:// with the system roots: %v, node id %q", err, set.RLSXDSNodeID)
	}
}

// With --rls-ready-needs-config the bridge is ready, on /readyz,
// /healthcheck and the gRPC health check, only while its xDS server has
// given it a domain: not before the first configuration, and not again
// after one with none. Without it /readyz follows the store alone.
func TestServer_RLSReadyNeedsConfig(t *testing.T) {
	ads, addr := startADS(t, nil)
	set := testSettings()
	set.RLSXDS, set.RLSXDSNodeID, set.RLSReadyNeedsConfig = "http://"+addr, "node-1", true
	ts := startServer(t, set)
	health := healthpb.NewHealthClient(grpcConn(t, strings.TrimPrefix(ts.URL, "http://")))
	readiness := func() string {
		var out []string
		for _, path := range []string{"/readyz", "/healthcheck"} {
			r := do(t, nil, "GET", ts.URL+path, "")
			out = append(out, fmt.Sprint(r.status))
			if r.status != 200 && !strings.Contains(string(r.body), "no configuration with a domain yet (--rls-ready-needs-config)") {
				t.Errorf("GET %s: %d %s", path, r.status, r.body)
			}
		}
		res, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{})
		return strings.Join(append(out, fmt.Sprint(res.GetStatus(), err)), " ")
	}

	wantRequest(t, nextRequest(t, ads), "", "", "")
	if got := readiness(); got != "503 503 NOT_SERVING <nil>" {
		t.Errorf("before any configuration: %s", got)
	}
	ads.responses <- xdsResponse(t, "1", oneLimit(1))
	wantRequest(t, nextRequest(t, ads), "1", "n1", "")
	if got := readiness(); got != "200 200 SERVING <nil>" {
		t.Errorf("with a domain: %s", got)
	}
	ads.responses <- xdsResponse(t, "2")
	wantRequest(t, nextRequest(t, ads), "2", "n2", "")
	if got := readiness(); got != "503 503 NOT_SERVING <nil>" {
		t.Errorf("with no domain left: %s", got)
	}

	set.RLSReadyNeedsConfig = false
	set.RLSXDS = "http://" + nettest.FreeAddr(t) // no server: no configuration ever
	without := startServer(t, set)
	if r := do(t, nil, "GET", without.URL+"/readyz", ""); r.status != 200 {
		t.Errorf("without the flag, /readyz before any configuration: %d %s, want 200", r.status, r.body)
	}
}
