package overrides

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules"
)

const hour = 3_600_000

// perUser is a per-user limit of 5 an hour with a cost and a penalty.
func perUser(key string) rules.LimitRequest {
	return rules.LimitRequest{Key: key, PerUser: true, Spec: rules.LimitSpec{
		Algorithm: rules.FixedWindow, Limit: 5, WindowMS: hour, Burst: 5, Cost: 2,
		Penalty: &rules.Penalty{Enabled: true, DetectionWindowMS: hour, ViolationThreshold: 1, Multipliers: []int64{2}},
	}}
}

func TestSet_Apply(t *testing.T) {
	s := New(NewMemory(), nil)
	defer s.Close()
	ctx := context.Background()
	exact := Override{User: "alice", Endpoint: "/x", Algorithm: rules.TokenBucket, Limit: 1, WindowMS: 1000, Burst: 3}
	star := Override{User: "alice", Endpoint: AllEndpoints, Algorithm: rules.SlidingLog, Limit: 7, WindowMS: hour}
	for _, o := range []Override{exact, star} {
		if _, had, err := s.Put(ctx, o); err != nil || had {
			t.Fatalf("Put %+v: had=%v err=%v", o, had, err)
		}
	}
	shared := perUser("rl:{g}:all")
	shared.PerUser = false
	for _, tc := range []struct {
		name, user, endpoint string
		want                 rules.LimitSpec // of the per-user limit
	}{
		{"exact endpoint wins over *", "alice", "/x", exact.Apply(perUser("").Spec)},
		{"* covers other endpoints", "alice", "/y", star.Apply(perUser("").Spec)},
		{"other user", "bob", "/x", perUser("").Spec},
		{"no user", "", "/x", perUser("").Spec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := rules.CheckRequest{User: tc.user, Endpoint: tc.endpoint, Limits: []rules.LimitRequest{perUser("rl:{u:a}:x"), shared}}
			s.Apply(&req)
			got := req.Limits[0].Spec
			if got.Algorithm != tc.want.Algorithm || got.Limit != tc.want.Limit || got.WindowMS != tc.want.WindowMS ||
				got.Burst != tc.want.Burst || got.Cost != 2 || got.Penalty == nil {
				t.Fatalf("per-user limit %+v, want %+v with cost and penalty kept", got, tc.want)
			}
			if req.Limits[1].Spec.Limit != 5 || req.Limits[1].Spec.Algorithm != rules.FixedWindow {
				t.Fatalf("a limit not kept per user changed: %+v", req.Limits[1].Spec)
			}
		})
	}
	if got := exact.Apply(rules.LimitSpec{}); got.Burst != 3 {
		t.Fatalf("burst %d, want 3", got.Burst)
	}
	if got := star.Apply(rules.LimitSpec{}); got.Burst != 7 {
		t.Fatalf("burst %d, want the limit, 7", got.Burst)
	}
}

func TestSet_PutGet(t *testing.T) {
	s := New(NewMemory(), nil)
	defer s.Close()
	ctx := context.Background()
	o := Override{User: "u", Endpoint: "/e", Algorithm: rules.TokenBucket, Limit: 1, WindowMS: hour}
	s.Put(ctx, o)
	o2 := o
	o2.Limit = 3
	prev, had, err := s.Put(ctx, o2)
	if err != nil || !had || prev != o {
		t.Fatalf("replace: prev=%+v had=%v err=%v, want %+v", prev, had, err, o)
	}
	if got, ok := s.Get("u", "/e"); !ok || got != o2 {
		t.Fatalf("Get: %+v %v", got, ok)
	}
	if _, ok := s.Get("u", AllEndpoints); ok {
		t.Fatal("Get of * found the exact override")
	}
}

func TestSet_Delete(t *testing.T) {
	s := New(NewMemory(), nil)
	defer s.Close()
	ctx := context.Background()
	o := Override{User: "u", Endpoint: "/e", Algorithm: rules.TokenBucket, Limit: 1, WindowMS: hour}
	s.Put(ctx, o)
	prev, had, err := s.Delete(ctx, "u", "/e")
	if err != nil || !had || prev != o {
		t.Fatalf("Delete: prev=%+v had=%v err=%v", prev, had, err)
	}
	if _, ok := s.Lookup("u", "/e"); ok {
		t.Fatal("still applied after Delete")
	}
	if _, had, err := s.Delete(ctx, "u", "/e"); err != nil || had {
		t.Fatalf("second Delete: had=%v err=%v", had, err)
	}
	if n := len(s.All()); n != 0 {
		t.Fatalf("All: %d overrides", n)
	}
}

// stepBackend is a Backend whose reads a test hands out one at a time.
type stepBackend struct {
	mu      sync.Mutex
	next    []Override
	version int64
	fail    error
	loads   chan struct{} // a Load happened
	changed chan struct{} // releases one Wait
	waits   chan struct{} // a Wait began: what the Load before it read is applied
}

func (b *stepBackend) Load(context.Context) (int64, []Override, error) {
	b.mu.Lock()
	defer func() { b.mu.Unlock(); b.loads <- struct{}{} }()
	if b.fail != nil {
		return 0, nil, b.fail
	}
	return b.version, b.next, nil
}

func (b *stepBackend) Put(_ context.Context, o Override) (Override, bool, int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.version++
	return Override{}, false, b.version, nil
}

func (b *stepBackend) Delete(context.Context, string, string) (Override, bool, int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.version++
	return Override{}, false, b.version, nil
}

func (b *stepBackend) Wait(ctx context.Context, _ int64) error {
	if b.waits != nil {
		select {
		case b.waits <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	select {
	case <-b.changed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestSet_FollowsBackend: changes made elsewhere arrive, and while the
// backend cannot be read the last overrides read stay in force.
func TestSet_FollowsBackend(t *testing.T) {
	o := Override{User: "u", Endpoint: "/e", Algorithm: rules.FixedWindow, Limit: 9, WindowMS: 1000}
	b := &stepBackend{next: []Override{o}, version: 1, loads: make(chan struct{}), changed: make(chan struct{}), waits: make(chan struct{})}
	s := newSet(b, nil, time.Millisecond)
	defer s.Close()
	<-b.loads
	<-b.waits
	if got, ok := s.Lookup("u", "/e"); !ok || got != o {
		t.Fatalf("after the first load: %+v %v", got, ok)
	}
	b.mu.Lock()
	b.fail = errors.New("backend down")
	b.mu.Unlock()
	b.changed <- struct{}{}
	<-b.loads // the failed read
	if got, ok := s.Lookup("u", "/e"); !ok || got != o {
		t.Fatalf("backend down: %+v %v, want the last override read", got, ok)
	}
	o2 := o
	o2.Limit = 4
	b.mu.Lock()
	b.fail, b.next, b.version = nil, []Override{o2}, 2
	b.mu.Unlock()
	// Failed retries may still come before the one that reads o2; a Wait
	// begins only once a read succeeded and was applied.
	for applied := false; !applied; {
		select {
		case <-b.loads:
		case <-b.waits:
			applied = true
		}
	}
	if got, _ := s.Lookup("u", "/e"); got != o2 {
		t.Fatalf("after the backend came back: %+v, want %+v", got, o2)
	}
}

func TestOverride_Valid(t *testing.T) {
	good := Override{User: "u", Endpoint: "*", Algorithm: rules.SlidingLog, Limit: 1, WindowMS: 1}
	if !good.Valid() {
		t.Fatal("a good override refused")
	}
	for name, bad := range map[string]func(*Override){
		"no user": func(o *Override) { o.User = "" }, "no endpoint": func(o *Override) { o.Endpoint = "" },
		"no algorithm": func(o *Override) { o.Algorithm = 0 }, "zero limit": func(o *Override) { o.Limit = 0 },
		"zero window": func(o *Override) { o.WindowMS = 0 }, "negative burst": func(o *Override) { o.Burst = -1 },
		"huge limit": func(o *Override) { o.Limit = rules.MaxLimitValue + 1 },
	} {
		o := good
		bad(&o)
		if o.Valid() {
			t.Errorf("%s: accepted", name)
		}
	}
}
