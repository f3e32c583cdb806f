package redisbridge

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/syncbuf"
	"github.com/sluicehq/sluice/redisbridge/internal/rls"
	"github.com/sluicehq/sluice/redisbridge/redistest"
)

const rlsTestConfig = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /login
    rate_limit: {unit: hour, requests_per_unit: 3, name: login}
  - key: path
    value: /shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: /health
    rate_limit: {unlimited: true}
  - key: plan
    value: free
    rate_limit: {unit: minute, requests_per_unit: 5, replaces: [{name: login}]}
  - key: path
    value: /blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: path
    value: /blocked-shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: file
    value: shared/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: file
    value: own/*
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tenant
    value: team-*
    share_threshold: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tokens
    budget: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: service
    value: service_0
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {service_with_quota: {name: service_1}}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata: {service_with_quota: {name: service_2, tier: 2}}
  - key: service
    value: service_3
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: service
    value: service_shadow
    quota_mode: true
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
`

// rlsConfig writes config to a file and returns its path.
func rlsConfig(t testing.TB, config string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ratelimit.yaml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// rlsClient is a gRPC client (grpc-go, as Envoy's gRPC clients speak it:
// HTTP/2 with prior knowledge) of the bridge at addr.
func rlsClient(t testing.TB, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	return rlsv3.NewRateLimitServiceClient(grpcConn(t, addr))
}

// wantAnswer calls client with req and holds its answer to want, whole;
// name says which call in a failure.
func wantAnswer(t *testing.T, client rlsv3.RateLimitServiceClient, name string, req *rlsv3.RateLimitRequest, want *rlsv3.RateLimitResponse) {
	t.Helper()
	got, err := client.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if !proto.Equal(got, want) {
		t.Errorf("%s:\n got %v\nwant %v", name, got, want)
	}
}

// grpcConn is a gRPC client connection to addr, closed when t ends.
func grpcConn(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// rlsFrame is req as the body of a gRPC call: one uncompressed message.
func rlsFrame(req *rlsv3.RateLimitRequest) []byte {
	msg, err := proto.Marshal(req)
	if err != nil {
		panic(err) // a message built here always marshals
	}
	frame := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(frame[1:], uint32(len(msg)))
	return append(frame, msg...)
}

// override is d with Envoy's limit override of n a minute.
func override(d *ratelimitv3.RateLimitDescriptor, n uint32) *ratelimitv3.RateLimitDescriptor {
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: typev3.RateLimitUnit_MINUTE}
	return d
}

// hits is d with its own hits_addend n.
func hits(d *ratelimitv3.RateLimitDescriptor, n uint64) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// descriptor is a request descriptor of key, value pairs.
func descriptor(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// TestRLS_ShouldRateLimit: calls of Envoy's rate limit filter, in order,
// and the whole answers, on the memory store at a fixed time: each
// descriptor's limit found as envoyproxy/ratelimit finds it, and the
// limits of a call decided together, so a call refused consumes nothing.
// rlsSettings is a bridge on its memory store serving rlsTestConfig, on
// the clock now.
func rlsSettings(t testing.TB, now func() int64) Settings {
	return Settings{Listen: "127.0.0.1:0", Store: "memory", RedisTimeout: time.Second, RedisPipelines: 1, RedisBatch: 1,
		DefaultLimit: 100, DefaultWindow: time.Minute, DefaultAlgorithm: "sliding_window", MemoryMaxKeys: 1000, LogLevel: "error",
		RLSConfig: rlsConfig(t, rlsTestConfig), Now: now}
}

// addressStatus is the status of a remote_address descriptor of
// rlsTestConfig (2 a minute) with remaining left, untilReset before its
// window ends.
func addressStatus(code rlsv3.RateLimitResponse_Code, remaining uint32, untilReset time.Duration) *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: code, LimitRemaining: remaining, DurationUntilReset: durationpb.New(untilReset),
		CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 2, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}}
}

func TestRLS_ShouldRateLimit(t *testing.T) {
	const now = 1_800_000_030_000 // 30 s into a minute
	set := rlsSettings(t, func() int64 { return now })
	addr := startBridge(t, set)
	client := rlsClient(t, addr)
	const (
		ok   = rlsv3.RateLimitResponse_OK
		over = rlsv3.RateLimitResponse_OVER_LIMIT
	)
	untilMinute := durationpb.New(time.Duration(60_000-now%60_000) * time.Millisecond)
	untilHour := durationpb.New(time.Duration(3_600_000-now%3_600_000) * time.Millisecond)
	perAddress := func(code rlsv3.RateLimitResponse_Code, remaining uint32) *rlsv3.RateLimitResponse_DescriptorStatus {
		return addressStatus(code, remaining, 30*time.Second)
	}
	login := func(remaining uint32) *rlsv3.RateLimitResponse_DescriptorStatus {
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: ok, LimitRemaining: remaining, DurationUntilReset: untilHour,
			CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "login", RequestsPerUnit: 3, Unit: rlsv3.RateLimitResponse_RateLimit_HOUR}}
	}
	none := &rlsv3.RateLimitResponse_DescriptorStatus{Code: ok}
	unlimited := &rlsv3.RateLimitResponse_DescriptorStatus{Code: ok, LimitRemaining: math.MaxUint32} // as envoyproxy/ratelimit says it
	perMinute := func(code rlsv3.RateLimitResponse_Code, limit, remaining uint32) *rlsv3.RateLimitResponse_DescriptorStatus {
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: code, LimitRemaining: remaining, DurationUntilReset: untilMinute,
			CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: limit, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}}
	}
	call := func(d ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: d}
	}
	answer := func(code rlsv3.RateLimitResponse_Code, st ...*rlsv3.RateLimitResponse_DescriptorStatus) *rlsv3.RateLimitResponse {
		return &rlsv3.RateLimitResponse{OverallCode: code, Statuses: st}
	}
	for _, tt := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want *rlsv3.RateLimitResponse
	}{
		{"first", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("remote_address", "10.0.0.1")}},
			&rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{perAddress(ok, 1)}}},
		{"second", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("remote_address", "10.0.0.1")}},
			&rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{perAddress(ok, 0)}}},
		{"over", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("remote_address", "10.0.0.1")}},
			&rlsv3.RateLimitResponse{OverallCode: over, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{perAddress(over, 0)}}},
		{"another address, and a path", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			descriptor("remote_address", "10.0.0.2"), descriptor("path", "/login")}},
			&rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{perAddress(ok, 1), login(2)}}},
		{"refused by one descriptor: the other consumes nothing", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			descriptor("remote_address", "10.0.0.1"), descriptor("path", "/login")}},
			&rlsv3.RateLimitResponse{OverallCode: over, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{perAddress(over, 0), login(2)}}},
		{"the path alone", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("path", "/login")}},
			&rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{login(1)}}},
		{"no limit, unlimited, unknown", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			descriptor("path", "/other"), descriptor("path", "/health"), descriptor("nope", "x")}},
			&rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{none, unlimited, none}}},
		{"an unknown domain", &rlsv3.RateLimitRequest{Domain: "other", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("remote_address", "10.0.0.1")}},
			&rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{none}}},
		{"shadow mode, within", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("path", "/shadow")}},
			&rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: ok, LimitRemaining: 0, DurationUntilReset: untilMinute,
				CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}}}}},
		{"shadow mode, over: reported, not refused", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("path", "/shadow")}},
			&rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: ok, LimitRemaining: 0, DurationUntilReset: untilMinute,
				CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}}}}},
		{"hits_addend", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("remote_address", "10.0.0.3")}},
			&rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{perAddress(ok, 0)}}},
		{"a descriptor's own hits_addend", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 1, Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: descriptor("remote_address", "10.0.0.4").Entries, HitsAddend: wrapperspb.UInt64(3)}}},
			&rlsv3.RateLimitResponse{OverallCode: over, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{perAddress(over, 0)}}},
		{"a limit the caller gives", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: descriptor("user", "u1").Entries, Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: 4}}}},
			&rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: ok, LimitRemaining: 6,
				DurationUntilReset: durationpb.New(time.Duration(86_400_000-now%86_400_000) * time.Millisecond),
				CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 7, Unit: rlsv3.RateLimitResponse_RateLimit_DAY}}}}},
		{"a limit the caller gives, of ten minutes", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: descriptor("user", "u1").Entries, Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: 2, UnitMultiplier: wrapperspb.UInt32(10)}}}},
			&rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: ok, LimitRemaining: 6,
				DurationUntilReset: durationpb.New(time.Duration(600_000-now%600_000) * time.Millisecond),
				CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 7, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE, UnitMultiplier: wrapperspb.UInt32(10)}}}}},
		{"a limit of 0: refused, nothing counted", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			descriptor("remote_address", "10.0.0.9"), descriptor("path", "/blocked")}},
			&rlsv3.RateLimitResponse{OverallCode: over, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{none,
				{Code: over, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 0, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE},
					DurationUntilReset: durationpb.New(30 * time.Second)}}}},
		{"the address the refused call named", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("remote_address", "10.0.0.9")}},
			&rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{perAddress(ok, 1)}}},
		{"a limit of 0 in shadow mode", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			descriptor("remote_address", "10.0.0.9"), descriptor("path", "/blocked-shadow")}},
			&rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{perAddress(ok, 0),
				{Code: ok, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 0, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}, DurationUntilReset: untilMinute}}}},
		{"a limit that replaces another", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			descriptor("path", "/login"), descriptor("plan", "free")}},
			&rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{none, {Code: ok, LimitRemaining: 4, DurationUntilReset: untilMinute,
				CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 5, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}}}}},
		{"a peek counts nothing", call(hits(descriptor("remote_address", "10.0.0.20"), 0)), answer(ok, perMinute(ok, 2, 2))},
		{"after a peek", call(descriptor("remote_address", "10.0.0.20")), answer(ok, perMinute(ok, 2, 1))},
		// Over says 0 left, as in envoyproxy/ratelimit, though 2 are.
		{"a cost past the limit: refused, nothing counted", call(hits(descriptor("remote_address", "10.0.0.20"), 5)), answer(over, perMinute(over, 2, 0))},
		{"the unit the refusal left", call(descriptor("remote_address", "10.0.0.20")), answer(ok, perMinute(ok, 2, 0))},
		{"the budget's peek", call(hits(descriptor("tokens", "team-a"), 0)), answer(ok, perMinute(ok, 100, 100))},
		{"a charge", call(hits(descriptor("tokens", "team-a"), 60)), answer(ok, perMinute(ok, 100, 40))},
		{"a peek after it", call(hits(descriptor("tokens", "team-a"), 0)), answer(ok, perMinute(ok, 100, 40))},
		{"a charge above what is left takes what is left", call(hits(descriptor("tokens", "team-a"), 70)), answer(ok, perMinute(ok, 100, 0))},
		{"a peek of a spent budget", call(hits(descriptor("tokens", "team-a"), 0)), answer(over, perMinute(over, 100, 0))},
		{"a charge of a spent budget", call(hits(descriptor("tokens", "team-a"), 10)), answer(over, perMinute(over, 100, 0))},
		{"a peek of a spent budget refuses a call, which counts nothing", call(hits(descriptor("tokens", "team-a"), 0), descriptor("remote_address", "10.0.0.21")),
			answer(over, perMinute(over, 100, 0), perAddress(ok, 2))},
		{"the address of that call", call(descriptor("remote_address", "10.0.0.21")), answer(ok, perAddress(ok, 1))},
		{"a budget in a call another limit refuses takes nothing", call(hits(descriptor("tokens", "team-b"), 10), descriptor("remote_address", "10.0.0.1")),
			answer(over, perMinute(ok, 100, 100), perAddress(over, 0))},
		{"the budget it did not take", call(hits(descriptor("tokens", "team-b"), 0)), answer(ok, perMinute(ok, 100, 100))},
		{"quotas", call(descriptor("service", "service_1"), descriptor("service", "service_2")), answer(ok, perMinute(ok, 1, 0), perMinute(ok, 2, 1))},
		{"a quota over, another not", call(descriptor("service", "service_1"), descriptor("service", "service_2")), answer(ok, perMinute(over, 1, 0), perMinute(ok, 2, 0))},
		{"every quota over", call(descriptor("service", "service_1"), descriptor("service", "service_2")), answer(over, perMinute(over, 1, 0), perMinute(over, 2, 0))},
		{"a quota of 0 alone refuses", call(descriptor("service", "service_0"), descriptor("remote_address", "10.0.0.30")),
			answer(over, &rlsv3.RateLimitResponse_DescriptorStatus{Code: over, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}, DurationUntilReset: untilMinute}, none)},
		{"a quota of 0 with another quota", call(descriptor("service", "service_0"), descriptor("service", "service_3")),
			answer(ok, &rlsv3.RateLimitResponse_DescriptorStatus{Code: over, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}, DurationUntilReset: untilMinute}, perMinute(ok, 5, 4))},
		{"a quota of 0 with a quota in shadow mode", call(descriptor("service", "service_0"), descriptor("service", "service_shadow")),
			answer(over, &rlsv3.RateLimitResponse_DescriptorStatus{Code: over, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}, DurationUntilReset: untilMinute}, none)},
		{"a quota with a limit over: refused, the quota takes nothing", call(descriptor("remote_address", "10.0.0.1"), descriptor("service", "service_3")),
			answer(over, perAddress(over, 0), perMinute(ok, 5, 4))},
		{"a shared wildcard", call(descriptor("file", "shared/a")), answer(ok, perMinute(ok, 2, 1))},
		{"a shared wildcard: another value counts with it", call(descriptor("file", "shared/b")), answer(ok, perMinute(ok, 2, 0))},
		{"a shared wildcard: over for every value", call(descriptor("file", "shared/c")), answer(over, perMinute(over, 2, 0))},
		// Descriptors of one counter in one call each count in it, one
		// after the other, as envoyproxy/ratelimit counts them.
		{"one counter twice in a call", call(descriptor("remote_address", "10.0.0.30"), descriptor("remote_address", "10.0.0.30")),
			answer(ok, perMinute(ok, 2, 1), perMinute(ok, 2, 0))},
		{"one counter twice, spent", call(descriptor("remote_address", "10.0.0.30"), descriptor("remote_address", "10.0.0.30")),
			answer(over, perMinute(over, 2, 0), perMinute(over, 2, 0))},
		{"one counter twice, the second past the limit: refused, nothing counted",
			call(hits(descriptor("remote_address", "10.0.0.31"), 1), descriptor("path", "/other"), hits(descriptor("remote_address", "10.0.0.31"), 2)),
			answer(over, perMinute(ok, 2, 2), none, perMinute(over, 2, 0))},
		{"what the refusal left", call(descriptor("remote_address", "10.0.0.31")), answer(ok, perMinute(ok, 2, 1))},
		// A limit override of a configured descriptor counts in its
		// counter, each against its own limit.
		{"one counter, a limit override and its limit", call(override(descriptor("remote_address", "10.0.0.40"), 5), descriptor("remote_address", "10.0.0.40")),
			answer(ok, perMinute(ok, 5, 4), perMinute(ok, 2, 0))},
		{"one counter, its limit spent: refused, nothing counted", call(override(descriptor("remote_address", "10.0.0.40"), 5), descriptor("remote_address", "10.0.0.40")),
			answer(over, perMinute(ok, 5, 3), perMinute(over, 2, 0))},
		{"the override alone", call(override(descriptor("remote_address", "10.0.0.40"), 5)), answer(ok, perMinute(ok, 5, 2))},
		{"a wildcard not shared", call(descriptor("file", "own/a")), answer(ok, perMinute(ok, 1, 0))},
		{"a wildcard not shared: each value on its own", call(descriptor("file", "own/b")), answer(ok, perMinute(ok, 1, 0))},
		{"shared above the limit", call(descriptor("tenant", "team-a", "method", "GET")), answer(ok, perMinute(ok, 1, 0))},
		{"shared above the limit: another tenant of the wildcard", call(descriptor("tenant", "team-b", "method", "GET")), answer(over, perMinute(over, 1, 0))},
		{"shared above the limit: the entry below is the request's", call(descriptor("tenant", "team-b", "method", "POST")), answer(ok, perMinute(ok, 1, 0))},
	} {
		wantAnswer(t, client, tt.name, tt.req, tt.want)
	}
}

// TestRLS_OneCounterShadowAndEnforced: a descriptor in shadow mode and
// its limit override (never in shadow mode) make one counter; the call
// is held back by the override alone, which counts after the other.
func TestRLS_OneCounterShadowAndEnforced(t *testing.T) {
	const now = 1_800_000_030_000 // 30 s into a minute
	addr := startBridge(t, rlsSettings(t, func() int64 { return now }))
	client := rlsClient(t, addr)
	status := func(code rlsv3.RateLimitResponse_Code, limit, remaining uint32) *rlsv3.RateLimitResponse_DescriptorStatus {
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: code, LimitRemaining: remaining, DurationUntilReset: durationpb.New(30 * time.Second),
			CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: limit, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}}
	}
	const (
		ok   = rlsv3.RateLimitResponse_OK
		over = rlsv3.RateLimitResponse_OVER_LIMIT
	)
	for _, tt := range []struct {
		name string
		d    []*ratelimitv3.RateLimitDescriptor
		want *rlsv3.RateLimitResponse
	}{
		// /shadow: 1 a minute, in shadow mode.
		{"over the shadow limit, within the override", []*ratelimitv3.RateLimitDescriptor{hits(descriptor("path", "/shadow"), 2), override(descriptor("path", "/shadow"), 3)},
			&rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{status(ok, 1, 0), status(ok, 3, 0)}}},
		{"the override spent", []*ratelimitv3.RateLimitDescriptor{descriptor("path", "/shadow"), override(descriptor("path", "/shadow"), 3)},
			&rlsv3.RateLimitResponse{OverallCode: over, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{status(ok, 1, 0), status(over, 3, 0)}}},
	} {
		wantAnswer(t, client, tt.name, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: tt.d}, tt.want)
	}
}

// TestRLS_JSON: ShouldRateLimit in JSON on POST /json, as on
// envoyproxy/ratelimit's HTTP port: the answer in protobuf's JSON
// mapping, 429 when refused; errors in the bridge's envelope: a bad
// request 400 with the field at fault, the check token required, 404
// without a rate limit service.
func TestRLS_JSON(t *testing.T) {
	const now = 1_800_000_030_000 // 30 s into a minute
	set := rlsSettings(t, func() int64 { return now })
	set.CheckToken = "tok"
	ts := startServer(t, set)
	call := `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.50"}]}]}`
	auth := []string{"Authorization", "Bearer tok"}
	for i, want := range []struct {
		status int
		answer *rlsv3.RateLimitResponse
	}{
		{200, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{addressStatus(rlsv3.RateLimitResponse_OK, 1, 30*time.Second)}}},
		{200, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{addressStatus(rlsv3.RateLimitResponse_OK, 0, 30*time.Second)}}},
		{429, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{addressStatus(rlsv3.RateLimitResponse_OVER_LIMIT, 0, 30*time.Second)}}},
	} {
		r := do(t, nil, "POST", ts.URL+"/json", call, auth...)
		var got rlsv3.RateLimitResponse
		if err := protojson.Unmarshal(r.body, &got); err != nil || r.status != want.status || r.header.Get("Content-Type") != "application/json" || !proto.Equal(&got, want.answer) {
			t.Errorf("call %d: %d %s %v, want %d %v", i+1, r.status, r.body, err, want.status, want.answer)
		}
	}
	for _, tt := range []struct {
		name, body string
		hdr        []string
		status     int
		text       string
	}{
		{"no token", call, nil, 401, `"code":"UNAUTHORIZED"`},
		{"a field misspelled", `{"domain":"edge","descriptors":[{"entrys":[]}]}`, auth, 400, `"details":{"field":"descriptors[0].entrys","reason":"unknown field"}`},
		{"not JSON", `domain=edge`, auth, 400, `"details":{"field":"body","reason":"not JSON"}`},
		{"is_negative_hits", `{"domain":"edge","descriptors":[{"entries":[{"key":"k","value":"v"}],"isNegativeHits":true}]}`, auth, 400, "is_negative_hits is not supported"},
	} {
		r := do(t, nil, "POST", ts.URL+"/json", tt.body, tt.hdr...)
		if r.status != tt.status || !strings.Contains(string(r.body), tt.text) {
			t.Errorf("%s: %d %s, want %d with %q", tt.name, r.status, r.body, tt.status, tt.text)
		}
	}
	set.RLSConfig, set.CheckToken = "", ""
	unconfigured := startServer(t, set).URL + "/json"
	for _, body := range []string{call, `domain=edge`} { // the body unread
		if r := do(t, nil, "POST", unconfigured, body); r.status != 404 || !strings.Contains(string(r.body), `"code":"NOT_FOUND"`) {
			t.Errorf("without --rls-config, %s: %d %s, want 404", body, r.status, r.body)
		}
	}
}

// TestRLS_ResponseHeaders: with --rls-response-headers each answer
// carries the RateLimit headers of the descriptor closest to its limit:
// the last one over it, else the first with the least remaining; none
// when no descriptor has a limit. --rls-response-header-names renames
// them.
func TestRLS_ResponseHeaders(t *testing.T) {
	t.Run("renamed", func(t *testing.T) {
		set := rlsSettings(t, func() int64 { return 1_800_000_030_000 })
		set.RLSResponseHeaders, set.RLSResponseHeaderNames = true, "X-Limit, X-Left,X-Reset"
		client := rlsClient(t, startBridge(t, set))
		got, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("remote_address", "10.0.0.1")}})
		if err != nil {
			t.Fatal(err)
		}
		want := []*corev3.HeaderValue{{Key: "X-Limit", Value: "2"}, {Key: "X-Left", Value: "1"}, {Key: "X-Reset", Value: "30"}}
		if !proto.Equal(&rlsv3.RateLimitResponse{ResponseHeadersToAdd: got.ResponseHeadersToAdd}, &rlsv3.RateLimitResponse{ResponseHeadersToAdd: want}) {
			t.Errorf("got %v, want %v", got.ResponseHeadersToAdd, want)
		}
	})
	const now = 1_800_000_030_500 // 30.5 s into a minute
	set := rlsSettings(t, func() int64 { return now })
	set.RLSResponseHeaders = true
	addr := startBridge(t, set)
	client := rlsClient(t, addr)
	headers := func(limit, remaining, reset string) []*corev3.HeaderValue {
		return []*corev3.HeaderValue{{Key: "RateLimit-Limit", Value: limit}, {Key: "RateLimit-Remaining", Value: remaining}, {Key: "RateLimit-Reset", Value: reset}}
	}
	call := func(d ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: d}
	}
	for _, tt := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want []*corev3.HeaderValue
	}{
		{"the least remaining", call(descriptor("path", "/login"), descriptor("remote_address", "10.0.0.1")), headers("2", "1", "30")},
		{"the first of equals", call(descriptor("remote_address", "10.0.0.2"), descriptor("remote_address", "10.0.0.3")), headers("2", "1", "30")},
		// The address is over (3 asked, 2 left); the file, refused with
		// it, has 1 left.
		{"over its limit, after one with less left", call(descriptor("file", "own/a"), hits(descriptor("remote_address", "10.0.0.5"), 3)),
			headers("2", "0", "30")},
		{"a limit of 0", call(descriptor("remote_address", "10.0.0.4"), descriptor("path", "/blocked")), headers("0", "0", "30")},
		{"no limit", call(descriptor("path", "/health")), nil},
	} {
		got, err := client.ShouldRateLimit(context.Background(), tt.req)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if !proto.Equal(&rlsv3.RateLimitResponse{ResponseHeadersToAdd: got.ResponseHeadersToAdd}, &rlsv3.RateLimitResponse{ResponseHeadersToAdd: tt.want}) {
			t.Errorf("%s: got %v, want %v", tt.name, got.ResponseHeadersToAdd, tt.want)
		}
	}
}

// TestRLS_OverLimitCache: with --rls-over-limit-cache a counter left
// with nothing refuses its calls without a store call until its window
// ends, counting nothing of the call's other descriptors; limits in
// shadow mode are never cached.
func TestRLS_OverLimitCache(t *testing.T) {
	var now atomic.Int64
	now.Store(1_800_000_030_000) // 30 s into a minute
	set := rlsSettings(t, now.Load)
	set.RLSOverLimitCache = 100
	ts := startServer(t, set)
	client := rlsClient(t, strings.TrimPrefix(ts.URL, "http://"))
	const (
		ok   = rlsv3.RateLimitResponse_OK
		over = rlsv3.RateLimitResponse_OVER_LIMIT
	)
	login := func(remaining uint32) *rlsv3.RateLimitResponse_DescriptorStatus {
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: ok, LimitRemaining: remaining, DurationUntilReset: durationpb.New(time.Hour - 40*time.Second),
			CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "login", RequestsPerUnit: 3, Unit: rlsv3.RateLimitResponse_RateLimit_HOUR}}
	}
	shadow := func(code rlsv3.RateLimitResponse_Code) *rlsv3.RateLimitResponse_DescriptorStatus {
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: code, DurationUntilReset: durationpb.New(30 * time.Second),
			CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}}
	}
	call := func(d ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: d}
	}
	answer := func(code rlsv3.RateLimitResponse_Code, st ...*rlsv3.RateLimitResponse_DescriptorStatus) *rlsv3.RateLimitResponse {
		return &rlsv3.RateLimitResponse{OverallCode: code, Statuses: st}
	}
	storeCalls := func() string {
		t.Helper()
		var out []string
		for _, l := range strings.Split(string(do(t, nil, "GET", ts.URL+"/metrics", "").body), "\n") {
			if strings.HasPrefix(l, `sluice_bridge_store_duration_seconds_count{op="check"} `) || strings.HasPrefix(l, "sluice_bridge_rls_over_limit_cache_hits_total ") {
				out = append(out, l)
			}
		}
		return strings.Join(out, "\n")
	}
	address, path := descriptor("remote_address", "10.0.0.1"), descriptor("path", "/login")
	for _, tt := range []struct {
		name    string
		advance time.Duration
		req     *rlsv3.RateLimitRequest
		want    *rlsv3.RateLimitResponse
		metrics string // after the call
	}{
		{"first", 0, call(address), answer(ok, addressStatus(ok, 1, 30*time.Second)), ""},
		{"the last, which leaves nothing", 0, call(address), answer(ok, addressStatus(ok, 0, 30*time.Second)),
			"sluice_bridge_rls_over_limit_cache_hits_total 0\nsluice_bridge_store_duration_seconds_count{op=\"check\"} 2"},
		{"refused by the cache", 10 * time.Second, call(address), answer(over, addressStatus(over, 0, 20*time.Second)),
			"sluice_bridge_rls_over_limit_cache_hits_total 1\nsluice_bridge_store_duration_seconds_count{op=\"check\"} 2"},
		{"with another descriptor, not decided", 0, call(path, address), answer(over, &rlsv3.RateLimitResponse_DescriptorStatus{Code: ok}, addressStatus(over, 0, 20*time.Second)),
			"sluice_bridge_rls_over_limit_cache_hits_total 2\nsluice_bridge_store_duration_seconds_count{op=\"check\"} 2"},
		{"which counted nothing", 0, call(path), answer(ok, login(2)), ""},
		{"the next window", 20 * time.Second, call(address), answer(ok, addressStatus(ok, 1, time.Minute)),
			"sluice_bridge_rls_over_limit_cache_hits_total 2\nsluice_bridge_store_duration_seconds_count{op=\"check\"} 4"},
		{"shadow mode", 30 * time.Second, call(descriptor("path", "/shadow")), answer(ok, shadow(ok)), ""},
		{"shadow mode over", 0, call(descriptor("path", "/shadow")), answer(ok, shadow(ok)), ""},
		{"shadow mode over, from the store", 0, call(descriptor("path", "/shadow")), answer(ok, shadow(ok)),
			"sluice_bridge_rls_over_limit_cache_hits_total 2\nsluice_bridge_store_duration_seconds_count{op=\"check\"} 7"},
	} {
		now.Add(tt.advance.Milliseconds())
		wantAnswer(t, client, tt.name, tt.req, tt.want)
		if m := storeCalls(); tt.metrics != "" && m != tt.metrics {
			t.Errorf("%s: metrics\n%s\nwant\n%s", tt.name, m, tt.metrics)
		}
	}
}

// TestRLS_OverLimitCacheRedisDown: a counter the over-limit cache holds
// as spent is refused while Redis is down; others are UNAVAILABLE.
func TestRLS_OverLimitCacheRedisDown(t *testing.T) {
	rs := redistest.Start(t)
	set := DefaultSettings()
	set.Listen, set.LogLevel, set.Store, set.RedisURL = "127.0.0.1:0", "error", "redis", rs.URL
	// A day's window: the calls do not straddle two.
	set.RLSConfig = rlsConfig(t, "domain: edge\ndescriptors:\n  - {key: remote_address, rate_limit: {unit: day, requests_per_unit: 2}}")
	set.RLSOverLimitCache = 100
	client := rlsClient(t, startBridge(t, set))
	call := func(addr string) (*rlsv3.RateLimitResponse, error) {
		return client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("remote_address", addr)}})
	}
	for range 2 {
		if res, err := call("10.0.0.1"); err != nil || res.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("a call within the limit: %v, %v", res, err)
		}
	}
	rs.Stop()
	if res, err := call("10.0.0.1"); err != nil || res.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("the spent address with Redis down: %v, %v; want OVER_LIMIT", res, err)
	}
	if _, err := call("10.0.0.2"); status.Code(err) != codes.Unavailable {
		t.Errorf("another address with Redis down: %v; want UNAVAILABLE", err)
	}
}

// TestRLS_ResponseMetadata: with --rls-response-metadata each answer
// carries the request in its dynamic metadata, and the metadata of the
// limits that were not over, merged (the first descriptor's value of a
// field stays).
func TestRLS_ResponseMetadata(t *testing.T) {
	const now = 1_800_000_030_000
	set := rlsSettings(t, func() int64 { return now })
	set.RLSResponseMetadata = true
	addr := startBridge(t, set)
	client := rlsClient(t, addr)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		descriptor("service", "service_1"), descriptor("service", "service_2")}}
	meta := func(merged map[string]any) *structpb.Struct {
		f := map[string]any{"domain": "edge", "descriptors": []any{
			map[string]any{"entries": []any{"service=service_1"}}, map[string]any{"entries": []any{"service=service_2"}}}}
		if merged != nil {
			f["metadata"] = merged
		}
		s, err := structpb.NewStruct(f)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, tt := range []struct {
		name string
		want *structpb.Struct
	}{
		{"both quotas pass", meta(map[string]any{"service_with_quota": map[string]any{"name": "service_1", "tier": 2}})},
		{"the second passes", meta(map[string]any{"service_with_quota": map[string]any{"name": "service_2", "tier": 2}})},
		{"neither passes", meta(nil)},
	} {
		got, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if !proto.Equal(got.DynamicMetadata, tt.want) {
			t.Errorf("%s:\n got %v\nwant %v", tt.name, got.DynamicMetadata, tt.want)
		}
	}
}

// TestRLS_QuotaMode: with --rls-quota-mode every limit is in quota mode:
// a call is refused only when all its limits are over, a limit of 0
// among them.
func TestRLS_QuotaMode(t *testing.T) {
	const now = 1_800_000_030_000 // 30 s into a minute
	set := rlsSettings(t, func() int64 { return now })
	set.RLSQuotaMode = true
	addr := startBridge(t, set)
	client := rlsClient(t, addr)
	const (
		ok   = rlsv3.RateLimitResponse_OK
		over = rlsv3.RateLimitResponse_OVER_LIMIT
	)
	perAddress := func(code rlsv3.RateLimitResponse_Code, remaining uint32) *rlsv3.RateLimitResponse_DescriptorStatus {
		return addressStatus(code, remaining, 30*time.Second)
	}
	blocked := &rlsv3.RateLimitResponse_DescriptorStatus{Code: over, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}, DurationUntilReset: durationpb.New(30 * time.Second)}
	call := func(d ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: d}
	}
	address, blockedPath := descriptor("remote_address", "10.0.0.1"), descriptor("path", "/blocked")
	for _, tt := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want *rlsv3.RateLimitResponse
	}{
		{"a limit of 0 with one that is not over", call(address, blockedPath), &rlsv3.RateLimitResponse{OverallCode: ok,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{perAddress(ok, 1), blocked}}},
		{"the last", call(address), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{perAddress(ok, 0)}}},
		{"over", call(address), &rlsv3.RateLimitResponse{OverallCode: over, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{perAddress(over, 0)}}},
		{"all over", call(address, blockedPath), &rlsv3.RateLimitResponse{OverallCode: over,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{perAddress(over, 0), blocked}}},
	} {
		wantAnswer(t, client, tt.name, tt.req, tt.want)
	}
}

// TestRLS_ShadowMode: with --rls-shadow-mode every call is answered OK;
// its descriptors still say which limits it went over, each call is
// counted, and what would have been refused is counted as log-only
// denials.
func TestRLS_ShadowMode(t *testing.T) {
	const now = 1_800_000_030_000 // 30 s into a minute
	set := rlsSettings(t, func() int64 { return now })
	set.RLSShadowMode = true
	ts := startServer(t, set)
	client := rlsClient(t, strings.TrimPrefix(ts.URL, "http://"))
	const (
		ok   = rlsv3.RateLimitResponse_OK
		over = rlsv3.RateLimitResponse_OVER_LIMIT
	)
	perAddress := func(code rlsv3.RateLimitResponse_Code, remaining uint32) *rlsv3.RateLimitResponse_DescriptorStatus {
		return addressStatus(code, remaining, 30*time.Second)
	}
	address := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("remote_address", "10.0.0.1")}}
	for _, tt := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want *rlsv3.RateLimitResponse
	}{
		{"first", address, &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{perAddress(ok, 1)}}},
		{"second", address, &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{perAddress(ok, 0)}}},
		{"over: said, not refused", address, &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{perAddress(over, 0)}}},
		{"a limit of 0: said, not refused, and the call counted", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			descriptor("remote_address", "10.0.0.2"), descriptor("path", "/blocked")}},
			&rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{perAddress(ok, 1),
				{Code: over, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 0, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE},
					DurationUntilReset: durationpb.New(30 * time.Second)}}}},
	} {
		wantAnswer(t, client, tt.name, tt.req, tt.want)
	}
	m := string(do(t, nil, "GET", ts.URL+"/metrics", "").body)
	for _, line := range []string{
		`sluice_bridge_decisions_total{algorithm="fixed_window",result="log_only_denied",rule="edge.remote_address"} 1`,
		`sluice_bridge_decisions_total{algorithm="fixed_window",result="log_only_denied",rule="edge.path_/blocked"} 1`,
	} {
		if !strings.Contains(m, line+"\n") {
			t.Errorf("metrics lack %s", line)
		}
	}
}

// What a call gets when it cannot be decided: gRPC's errors, which
// Envoy's filter answers with its failure_mode_deny.
func TestRLS_Errors(t *testing.T) {
	set := DefaultSettings()
	set.Listen, set.LogLevel, set.RLSConfig, set.CheckToken = "127.0.0.1:0", "error", rlsConfig(t, rlsTestConfig), "secret"
	client := rlsClient(t, startBridge(t, set))
	authorized := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer secret")
	many := &rlsv3.RateLimitRequest{Domain: "edge"}
	for range 65 {
		many.Descriptors = append(many.Descriptors, descriptor("remote_address", "a"))
	}
	var long []string // 20 entries of 100-byte values: each written as a 33-byte hash
	for i := range 20 {
		long = append(long, "k"+strconv.Itoa(i), strings.Repeat("v", 100))
	}
	set.RLSConfig, set.CheckToken = "", ""
	unconfigured := rlsClient(t, startBridge(t, set))
	for _, tt := range []struct {
		name   string
		client rlsv3.RateLimitServiceClient
		ctx    context.Context
		req    *rlsv3.RateLimitRequest
		code   codes.Code
		msg    string
	}{
		{"no token", client, context.Background(), &rlsv3.RateLimitRequest{Domain: "edge"}, codes.Unauthenticated, "missing bearer token"},
		{"wrong token", client, metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer nope"),
			&rlsv3.RateLimitRequest{Domain: "edge"}, codes.Unauthenticated, "wrong bearer token"},
		{"too many descriptors", client, authorized, many, codes.InvalidArgument, "more than 64 descriptors"},
		{"negative hits", client, authorized, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: descriptor("remote_address", "a").Entries, IsNegativeHits: true}}}, codes.InvalidArgument, "descriptors[0]: is_negative_hits is not supported"},
		{"an override without a unit", client, authorized, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: descriptor("user", "a").Entries, Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}}}},
			codes.InvalidArgument, "descriptors[0].limit: requests_per_unit and unit are required"},
		{"an override's unit_multiplier of 0", client, authorized, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: descriptor("user", "a").Entries, Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: 1, UnitMultiplier: wrapperspb.UInt32(0)}}}},
			codes.InvalidArgument, "descriptors[0].limit.unit_multiplier: must be at least 1, and the window at most 366 days"},
		{"an override's window over a year", client, authorized, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: descriptor("user", "a").Entries, Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: 4, UnitMultiplier: wrapperspb.UInt32(367)}}}},
			codes.InvalidArgument, "descriptors[0].limit.unit_multiplier: must be at least 1, and the window at most 366 days"},
		{"a key too long", client, authorized, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: descriptor(long...).Entries, Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: 1}}}},
			codes.InvalidArgument, "descriptors[0]: its entries make a key longer than 512 bytes"},
		{"no configuration", unconfigured, context.Background(), &rlsv3.RateLimitRequest{Domain: "edge"}, codes.Unimplemented,
			"no rate limit service configuration (--rls-config)"},
	} {
		_, err := tt.client.ShouldRateLimit(tt.ctx, tt.req)
		if st, _ := status.FromError(err); st.Code() != tt.code || st.Message() != tt.msg {
			t.Errorf("%s: %v, want %v %q", tt.name, err, tt.code, tt.msg)
		}
	}
	// Two files of one domain: refused, unless merged.
	set = DefaultSettings()
	set.RLSConfig = filepath.Dir(rlsConfig(t, "domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]"))
	if err := os.WriteFile(filepath.Join(set.RLSConfig, "more.yaml"), []byte("domain: d\ndescriptors: [{key: j, rate_limit: {unit: second, requests_per_unit: 2}}]"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(set); err == nil || !strings.Contains(err.Error(), `--rls-config: `+filepath.Join(set.RLSConfig, "ratelimit.yaml")+`: domain "d" is configured in `) {
		t.Errorf("a domain in two files: %v", err)
	}
	set.RLSMergeDomainConfig = true
	if s, err := New(set); err != nil {
		t.Errorf("a domain in two files, merged: %v", err)
	} else {
		s.Close()
	}
	set = DefaultSettings()
	set.RLSConfig = rlsConfig(t, "domain: d\ndescriptors: [{key: k, rate_limit: {unit: fortnight}}]")
	if _, err := New(set); err == nil ||
		err.Error() != "--rls-config: "+set.RLSConfig+`: descriptors[0].rate_limit.unit: "fortnight" is not second, minute, hour, day, week, month or year` {
		t.Errorf("a configuration refused: %v", err)
	}
}

// Bridges that share Redis, single or Cluster, admit exactly the limit of
// concurrent calls, and a call refused by one descriptor consumes nothing
// of the other, whose counter is in another slot; when Redis is gone a
// call fails within the timeout with UNAVAILABLE.
func TestRLS_ExactOnRedis(t *testing.T) {
	config := rlsConfig(t, `domain: d
descriptors:
  - {key: k, rate_limit: {unit: hour, requests_per_unit: 25}}
  - {key: j, rate_limit: {unit: hour, requests_per_unit: 1000}}`)
	call := func(client rlsv3.RateLimitServiceClient, kv ...string) (*rlsv3.RateLimitResponse, error) {
		req := &rlsv3.RateLimitRequest{Domain: "d"}
		for i := 0; i < len(kv); i += 2 {
			req.Descriptors = append(req.Descriptors, descriptor(kv[i], kv[i+1]))
		}
		return client.ShouldRateLimit(context.Background(), req)
	}
	for _, topology := range []string{"single", "cluster"} {
		t.Run(topology, func(t *testing.T) {
			var url string
			var stop func()
			if topology == "single" {
				rs := redistest.Start(t)
				url, stop = rs.URL, rs.Stop
			} else {
				c := redistest.StartCluster(t, 3, 0)
				if a, _ := c.Slot(rlsKey("d", []rls.Entry{{Key: "k", Value: "shared"}}, &rls.Limit{Unit: 3})); a < 0 {
					t.Fatal("no slot")
				} else if b, _ := c.Slot(rlsKey("d", []rls.Entry{{Key: "j", Value: "other"}}, &rls.Limit{Unit: 3})); a == b {
					t.Fatalf("both descriptors in slot %d: the test needs two", a)
				}
				url, stop = c.URL, nil
			}
			var clients []rlsv3.RateLimitServiceClient
			for i := range 3 {
				set := DefaultSettings()
				set.Listen, set.LogLevel, set.Store, set.RedisURL, set.RLSConfig = "127.0.0.1:0", "error", "redis", url, config
				if i > 0 { // two of them refuse from their over-limit cache once they saw k spent
					set.RLSOverLimitCache = 100
				}
				clients = append(clients, rlsClient(t, startBridge(t, set)))
			}
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for i := range 90 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := call(clients[i%3], "k", "shared", "j", "other")
					if err != nil {
						t.Error(err)
						return
					}
					if res.OverallCode == rlsv3.RateLimitResponse_OK {
						admitted.Add(1)
					}
				}()
			}
			wg.Wait()
			if n := admitted.Load(); n != 25 {
				t.Errorf("%d of 90 concurrent calls admitted through 3 bridges, want 25", n)
			}
			// j counted the 25 admitted calls and none of the 65 refused.
			res, err := call(clients[0], "j", "other")
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Statuses[0].LimitRemaining; got != 1000-25-1 {
				t.Errorf("j has %d left, want %d: refused calls consumed it", got, 1000-25-1)
			}
			if stop == nil {
				return
			}
			stop()
			start := time.Now()
			_, err = call(clients[0], "k", "gone")
			if st, _ := status.FromError(err); st.Code() != codes.Unavailable || st.Message() != "counter store unavailable" {
				t.Errorf("Redis gone: %v, want UNAVAILABLE", err)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("Redis gone: the answer took %v", took)
			}
			_, err = clients[0].ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d",
				Descriptors: []*ratelimitv3.RateLimitDescriptor{hits(descriptor("k", "gone"), 0)}})
			if st, _ := status.FromError(err); st.Code() != codes.Unavailable || st.Message() != "counter store unavailable" {
				t.Errorf("Redis gone, a peek: %v, want UNAVAILABLE", err)
			}
		})
	}
}

// TestRLS_BudgetOnRedis: a budget charged after the fact (Envoy's
// apply_on_stream_done with hits_addend, as token budgets are) through
// three bridges on one Redis: concurrent charges pass while anything is
// left and take exactly the budget, the one that finds less than it costs
// taking what is left; then the peeks (hits_addend 0), which count
// nothing, refuse.
func TestRLS_BudgetOnRedis(t *testing.T) {
	config := rlsConfig(t, `domain: ai
descriptors:
  - {key: team, budget: true, rate_limit: {unit: day, requests_per_unit: 100}}`)
	rs := redistest.Start(t)
	var clients []rlsv3.RateLimitServiceClient
	for range 3 {
		set := DefaultSettings()
		set.Listen, set.LogLevel, set.Store, set.RedisURL, set.RLSConfig = "127.0.0.1:0", "error", "redis", rs.URL, config
		clients = append(clients, rlsClient(t, startBridge(t, set)))
	}
	call := func(client rlsv3.RateLimitServiceClient, n uint64) *rlsv3.RateLimitResponse {
		t.Helper()
		res, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "ai",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{hits(descriptor("team", "a"), n)}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	left := func() uint32 {
		t.Helper()
		res := call(clients[0], 0)
		if (res.OverallCode == rlsv3.RateLimitResponse_OK) != (res.Statuses[0].LimitRemaining > 0) {
			t.Errorf("a peek answered %v with %d left", res.OverallCode, res.Statuses[0].LimitRemaining)
		}
		return res.Statuses[0].LimitRemaining
	}
	for range 10 {
		if n := left(); n != 100 {
			t.Fatalf("peeks counted: %d left of 100", n)
		}
	}
	// The budget's counter, as Redis holds it: the window's count.
	key := rlsKey("ai", []rls.Entry{{Key: "team", Value: "a"}}, &rls.Limit{Unit: 4}) + ":fw"
	counted := func() int64 {
		t.Helper()
		v, err := redistest.DoString(rs.Addr, time.Second, "HGET", key, "c")
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	var wg sync.WaitGroup
	var passed atomic.Int64
	for i := range 30 {
		wg.Go(func() {
			if call(clients[i%3], 7).OverallCode == rlsv3.RateLimitResponse_OK {
				passed.Add(1)
			}
		})
	}
	wg.Wait()
	// 210 charged: 14 charges of 7 and one of the 2 left, in whatever
	// order they came.
	if n, p := counted(), passed.Load(); n != 100 || p != 15 {
		t.Fatalf("30 concurrent charges of 7: %d passed, %d counted; want 15 passing and the budget of 100 spent", p, n)
	}
	if n := left(); n != 0 {
		t.Errorf("%d left of a spent budget", n)
	}
	if res := call(clients[2], 7); res.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("a charge of a spent budget: %v", res.OverallCode)
	}
}

// BenchmarkRLS_ShouldRateLimit: calls of two descriptors each, 16 users,
// from a grpc-go client in this process to a bridge on its memory store
// (client and bridge share the CPUs and the allocation figures).
// BenchmarkRLS_Refused: calls for 16 spent counters on Redis, from a
// grpc-go client in this process, with and without the over-limit
// cache; redis-calls/op is the script calls Redis ran per call.
func BenchmarkRLS_Refused(b *testing.B) {
	rs := redistest.Start(b)
	for _, cache := range []int{0, 1000} {
		b.Run(fmt.Sprintf("over-limit-cache=%d", cache), func(b *testing.B) {
			set := DefaultSettings()
			set.Listen, set.LogLevel, set.Store, set.RedisURL = "127.0.0.1:0", "error", "redis", rs.URL
			set.RLSConfig, set.RLSOverLimitCache = rlsConfig(b, "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: day, requests_per_unit: 1}}"), cache
			client := rlsClient(b, startBridge(b, set))
			var reqs []*rlsv3.RateLimitRequest
			for i := range 16 {
				reqs = append(reqs, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{
					descriptor("k", fmt.Sprintf("spent-%d-%d", cache, i))}})
				for range 2 {
					if _, err := client.ShouldRateLimit(context.Background(), reqs[i]); err != nil {
						b.Fatal(err)
					}
				}
			}
			evalsha := func() int64 {
				v, err := redistest.DoString(rs.Addr, time.Second, "INFO", "commandstats")
				if err != nil {
					b.Fatal(err)
				}
				_, after, _ := strings.Cut(v, "cmdstat_evalsha:calls=")
				n, _ := strconv.ParseInt(after[:strings.IndexByte(after, ',')], 10, 64)
				return n
			}
			before := evalsha()
			b.ReportAllocs()
			b.SetParallelism(8)
			var n atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					res, err := client.ShouldRateLimit(context.Background(), reqs[n.Add(1)%16])
					if err != nil || res.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
						b.Errorf("%v, %v: want OVER_LIMIT", res, err)
						return
					}
				}
			})
			b.ReportMetric(float64(evalsha()-before)/float64(b.N), "redis-calls/op")
		})
	}
}

func BenchmarkRLS_ShouldRateLimit(b *testing.B) {
	set := DefaultSettings()
	set.Listen, set.LogLevel, set.RLSConfig = "127.0.0.1:0", "error", rlsConfig(b, rlsTestConfig)
	client := rlsClient(b, startBridge(b, set))
	var reqs []*rlsv3.RateLimitRequest
	for i := range 16 {
		reqs = append(reqs, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			descriptor("remote_address", "10.0.0."+string(rune('a'+i))), descriptor("plan", "free")}})
	}
	b.ReportAllocs()
	b.SetParallelism(8)
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := client.ShouldRateLimit(context.Background(), reqs[n.Add(1)%16]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// Reload puts a new configuration in force, counters kept, and leaves
// the running one when the new one is refused; /rlconfig lists the one in
// force.
func TestServer_Reload_RLS(t *testing.T) {
	set := DefaultSettings()
	set.Listen, set.LogLevel = "127.0.0.1:0", "error"
	set.RLSConfig = rlsConfig(t, "domain: d\ndescriptors: [{key: k, rate_limit: {unit: hour, requests_per_unit: 1}}]")
	srv := startServer(t, set)
	client := rlsClient(t, strings.TrimPrefix(srv.URL, "http://"))
	call := func() rlsv3.RateLimitResponse_Code {
		t.Helper()
		res, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("k", "v")}})
		if err != nil {
			t.Fatal(err)
		}
		return res.OverallCode
	}
	if a, b := call(), call(); a != rlsv3.RateLimitResponse_OK || b != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("1 an hour: %v then %v", a, b)
	}
	rlconfig := func(want string) {
		t.Helper()
		rec := httptest.NewRecorder()
		srv.RLSConfigHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/rlconfig", nil))
		if rec.Code != 200 || rec.Body.String() != want {
			t.Errorf("/rlconfig: %d %q, want %q", rec.Code, rec.Body, want)
		}
	}
	rlconfig("d.k: unit=HOUR requests_per_unit=1, shadow_mode: false, quota_mode: false\n")
	if err := os.WriteFile(set.RLSConfig, []byte("domain: d\ndescriptors: [{key: k, rate_limit: {unit: hour, requests_per_unit: 2}}]"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if a, b := call(), call(); a != rlsv3.RateLimitResponse_OK || b != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("2 an hour, 1 counted before: %v then %v", a, b)
	}
	rlconfig("d.k: unit=HOUR requests_per_unit=2, shadow_mode: false, quota_mode: false\n")
	if err := os.WriteFile(set.RLSConfig, []byte("domain: d\ndescriptors: [{key: k, rate_limit: {unit: hour}}]"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err == nil || !strings.Contains(err.Error(), "descriptors[0].rate_limit.requests_per_unit: required") {
		t.Errorf("a refused configuration: %v", err)
	}
	if c := call(); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("after a refused reload: %v, want the running limit's OVER_LIMIT", c)
	}
	rlconfig("d.k: unit=HOUR requests_per_unit=2, shadow_mode: false, quota_mode: false\n")
	set.RLSConfig = ""
	rec := httptest.NewRecorder()
	startServer(t, set).RLSConfigHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/rlconfig", nil))
	if rec.Code != 404 {
		t.Errorf("/rlconfig without --rls-config: %d %s", rec.Code, rec.Body)
	}
}

// ReloadChanged reads --rls-config again when a file was added,
// removed or changed, and only then: files refused, or a directory gone,
// are logged once and the running configuration stays; Reload (SIGHUP)
// reads it whatever changed.
func TestServer_ReloadChanged_RLS(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\ndescriptors: [{key: k, rate_limit: {unit: hour, requests_per_unit: 1}}]")
	var logs syncbuf.Buffer
	set := DefaultSettings()
	set.Listen, set.RLSConfig = "127.0.0.1:0", dir
	set.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	set.AuditLog = filepath.Join(t.TempDir(), "audit.log")
	srv, err := New(set)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	const a = "a.k: unit=HOUR requests_per_unit=1, shadow_mode: false, quota_mode: false\n"
	const b = "b.k: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false\n"
	step := func(name string, wantErr bool, rlconfig string, reloaded, refused int) {
		t.Helper()
		if err := srv.ReloadChanged(); (err != nil) != wantErr {
			t.Fatalf("%s: error %v, want one: %t", name, err, wantErr)
		}
		rec := httptest.NewRecorder()
		srv.RLSConfigHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/rlconfig", nil))
		if rec.Body.String() != rlconfig {
			t.Errorf("%s: /rlconfig %q, want %q", name, rec.Body, rlconfig)
		}
		if n := logCount(&logs, "rate limit service configuration reloaded"); n != reloaded {
			t.Errorf("%s: %d reloads logged, want %d", name, n, reloaded)
		}
		if n := logCount(&logs, "rate limit service configuration refused"); n != refused {
			t.Errorf("%s: %d refusals logged, want %d", name, n, refused)
		}
	}
	step("nothing changed", false, a, 0, 0)
	write("a.yaml", "domain: a\ndescriptors: [{key: k, rate_limit: {unit: hour, requests_per_unit: 1}}]")
	step("written again, the same", false, a, 0, 0)
	write("b.yaml", "domain: b\ndescriptors: [{key: k, rate_limit: {unit: minute, requests_per_unit: 2}}]")
	step("a file added", false, a+b, 1, 0)
	write("b.yaml", "domain: b\ndescriptors: [{key: k, rate_limit: {unit: fortnight, requests_per_unit: 2}}]")
	step("a file refused", true, a+b, 1, 1)
	step("still refused: logged once", false, a+b, 1, 1)
	if err := os.Remove(filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	step("the file removed", false, a, 2, 1)
	if err := os.Rename(dir, dir+".away"); err != nil {
		t.Fatal(err)
	}
	step("the directory gone", true, a, 2, 2)
	step("still gone: logged once", false, a, 2, 2)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	step("another reason: an empty directory", true, a, 2, 3)
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dir+".away", dir); err != nil {
		t.Fatal(err)
	}
	step("back, as it was", false, a, 3, 3)
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	step("SIGHUP reads it whatever changed", false, a, 4, 3)
}

// logCount is how many lines of a text log carry msg.
func logCount(logs *syncbuf.Buffer, msg string) int {
	return strings.Count(logs.String(), "msg=\""+msg)
}

// CheckFiles reads what a start would read, and names the setting whose
// file is refused.
func TestSettings_CheckFiles(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not PEM"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		set  func(*Settings)
		err  string // "" accepted; else the error's start
	}{
		{"nothing to read", func(*Settings) {}, ""},
		{"a rate limit configuration", func(s *Settings) { s.RLSConfig = rlsConfig(t, rlsTestConfig) }, ""},
		{"one refused", func(s *Settings) {
			s.RLSConfig = rlsConfig(t, "domain: d\ndescriptors: [{key: k, rate_limit: {unit: hour}}]")
		}, "--rls-config: "},
		{"no such directory", func(s *Settings) { s.RLSConfig = filepath.Join(dir, "none") }, "--rls-config: stat "},
		{"a TLS pair that is not one", func(s *Settings) { s.TLSCert, s.TLSKey = junk, junk }, "--tls-cert, --tls-key: "},
		{"a Redis CA that is not one", func(s *Settings) { s.RedisURL, s.RedisTLSCA = "rediss://r:6379", junk }, "--redis-tls-ca: no PEM certificate in " + junk},
		{"client CAs that are not any", func(s *Settings) { s.TLSClientCA = junk }, "--tls-client-ca: no PEM certificate in " + junk},
	} {
		t.Run(tt.name, func(t *testing.T) {
			set := DefaultSettings()
			tt.set(&set)
			err := set.CheckFiles()
			if tt.err == "" && err != nil || tt.err != "" && (err == nil || !strings.HasPrefix(err.Error(), tt.err)) {
				t.Errorf("error %v, want %q", err, tt.err)
			}
		})
	}
}

// grpc.health.v1 Check, as Envoy's grpc_health_check sends it: SERVING
// while the store answers, NOT_SERVING when it does not, NOT_FOUND for a
// service the bridge does not serve.
func TestServer_GRPCHealth(t *testing.T) {
	rs := redistest.Start(t)
	set := DefaultSettings()
	set.Listen, set.LogLevel, set.Store, set.RedisURL, set.CheckToken = "127.0.0.1:0", "error", "redis", rs.URL, "tok"
	set.RLSConfig = rlsConfig(t, rlsTestConfig)
	withRLS := startBridge(t, set)
	set.RLSConfig = ""
	without := startBridge(t, set)
	check := func(addr, service string) string {
		res, err := healthpb.NewHealthClient(grpcConn(t, addr)).Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			st, _ := status.FromError(err)
			return st.Code().String()
		}
		return res.Status.String()
	}
	for _, tt := range []struct{ name, addr, service, want string }{
		{"the server", withRLS, "", "SERVING"},
		{"the rate limit service", withRLS, "envoy.service.ratelimit.v3.RateLimitService", "SERVING"},
		{"another service", withRLS, "grpc.other.v1.Other", "NotFound"},
		{"the rate limit service, not configured", without, "envoy.service.ratelimit.v3.RateLimitService", "NotFound"},
		{"the server, no rate limit service", without, "", "SERVING"},
	} {
		if got := check(tt.addr, tt.service); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
	rs.Stop()
	if got := check(withRLS, ""); got != "NOT_SERVING" {
		t.Errorf("Redis gone: %s, want NOT_SERVING", got)
	}
}

func TestGRPCTimeout(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"150m", 150 * time.Millisecond, true}, {"2S", 2 * time.Second, true}, {"1H", time.Hour, true}, {"3M", 3 * time.Minute, true},
		{"7u", 7 * time.Microsecond, true}, {"9n", 9, true}, {"99999999m", 99999999 * time.Millisecond, true},
		{"m", 0, false}, {"150", 0, false}, {"150x", 0, false}, {"-1m", 0, false}, {"123456789m", 0, false}, {"", 0, false},
	} {
		if got, ok := grpcTimeout([]byte(tt.in)); got != tt.want || ok != tt.ok {
			t.Errorf("grpcTimeout(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}
