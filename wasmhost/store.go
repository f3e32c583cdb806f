package wasmhost

import (
	"slices"
	"sync"
	"time"
)

// sharedStore is proxy_{get,set}_shared_data across all VMs of a host.
// Tokens follow Envoy: every write takes a fresh non-zero token; a non-zero
// cas must match the current token of an existing key.
type sharedStore struct {
	mu      sync.Mutex
	data    map[string]sharedEntry
	lastCAS uint32
}

type sharedEntry struct {
	value []byte
	cas   uint32
}

func (s *sharedStore) init() { s.data = map[string]sharedEntry{} }

func (s *sharedStore) get(key string) ([]byte, uint32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.data[key]
	if !ok {
		return nil, 0, false
	}
	return append([]byte(nil), e.value...), e.cas, true
}

// getView returns the stored value itself; callers copy it before the lock
// of a later set could replace it (values are never mutated in place).
func (s *sharedStore) getView(key string) ([]byte, uint32, bool) {
	s.mu.Lock()
	e, ok := s.data[key]
	s.mu.Unlock()
	return e.value, e.cas, ok
}

func (s *sharedStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.data)
}

func (s *sharedStore) set(key string, value []byte, cas uint32) Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.data[key]; ok && cas != 0 && cas != e.cas {
		return StatusCASMismatch
	}
	s.lastCAS++
	if s.lastCAS == 0 {
		s.lastCAS = 1
	}
	s.data[key] = sharedEntry{value: append([]byte(nil), value...), cas: s.lastCAS}
	return StatusOK
}

// MetricType is a proxy-wasm metric type.
type MetricType uint32

const (
	MetricCounter   MetricType = 0
	MetricGauge     MetricType = 1
	MetricHistogram MetricType = 2
)

type metric struct {
	name  string
	typ   MetricType
	value int64 // a histogram's: how many values it recorded
	// A histogram's recorded values: the first maxHistogramSamples of them
	// for Host.Histogram, and all of them counted in buckets (buckets[i]:
	// values above envoyBuckets[i-1], up to envoyBuckets[i]) and summed, for
	// WritePrometheus.
	samples []uint64
	buckets []uint64
	sum     uint64
}

// metricStore holds metrics by name; every VM that defines a name gets the
// same id, so values aggregate across workers as Envoy's stats do.
type metricStore struct {
	mu     sync.Mutex
	byName map[string]uint32
	list   []*metric // id-1 indexes
}

const maxHistogramSamples = 1 << 16

func (m *metricStore) init() { m.byName = map[string]uint32{} }

func (m *metricStore) define(t MetricType, name string) (uint32, Status) {
	if t > MetricHistogram {
		return 0, StatusBadArgument
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if id, ok := m.byName[name]; ok {
		if m.list[id-1].typ != t {
			return 0, StatusBadArgument
		}
		return id, StatusOK
	}
	x := &metric{name: name, typ: t}
	if t == MetricHistogram {
		x.buckets = make([]uint64, len(envoyBuckets))
	}
	m.list = append(m.list, x)
	id := uint32(len(m.list))
	m.byName[name] = id
	return id, StatusOK
}

func (m *metricStore) get(id uint32) *metric {
	if id == 0 || int(id) > len(m.list) {
		return nil
	}
	return m.list[id-1]
}

func (m *metricStore) increment(id uint32, delta int64) Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	x := m.get(id)
	switch {
	case x == nil:
		return StatusNotFound
	case x.typ == MetricHistogram, x.typ == MetricCounter && delta <= 0:
		return StatusBadArgument // Envoy: a counter only takes a positive offset
	}
	x.value += delta
	return StatusOK
}

func (m *metricStore) record(id uint32, v uint64) Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	x := m.get(id)
	if x == nil {
		return StatusNotFound
	}
	switch x.typ {
	case MetricCounter:
		x.value += int64(v) // Envoy's Context::recordMetric adds to a counter
	case MetricGauge:
		x.value = int64(v)
	case MetricHistogram:
		if len(x.samples) < maxHistogramSamples {
			x.samples = append(x.samples, v)
		}
		if i, _ := slices.BinarySearch(envoyBuckets[:], float64(v)); i < len(x.buckets) {
			x.buckets[i]++ // the first bound at or above v
		}
		x.sum += v
		x.value++
	}
	return StatusOK
}

func (m *metricStore) read(id uint32) (uint64, Status) {
	m.mu.Lock()
	defer m.mu.Unlock()
	x := m.get(id)
	switch {
	case x == nil:
		return 0, StatusNotFound
	case x.typ == MetricHistogram:
		return 0, StatusBadArgument
	}
	return uint64(x.value), StatusOK
}

func (m *metricStore) value(name string) (int64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	id, ok := m.byName[name]
	if !ok {
		return 0, false
	}
	return m.list[id-1].value, true
}

func (m *metricStore) names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.list))
	for _, x := range m.list {
		out = append(out, x.name)
	}
	slices.Sort(out)
	return out
}

func (m *metricStore) typeOf(name string) (MetricType, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	id, ok := m.byName[name]
	if !ok {
		return 0, false
	}
	return m.list[id-1].typ, true
}

func (m *metricStore) samples(name string) []uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	id, ok := m.byName[name]
	if !ok {
		return nil
	}
	return append([]uint64(nil), m.list[id-1].samples...)
}

// LogLevel is a proxy_log_level_t.
type LogLevel uint32

const (
	LogLevelTrace LogLevel = iota
	LogLevelDebug
	LogLevelInfo
	LogLevelWarn
	LogLevelError
	LogLevelCritical
)

func (l LogLevel) String() string {
	names := [...]string{"trace", "debug", "info", "warn", "error", "critical"}
	if int(l) < len(names) {
		return names[l]
	}
	return "unknown"
}

// LogEntry is one plugin log line.
type LogEntry struct {
	Time    time.Time
	VM      int // worker index
	Level   LogLevel
	Message string
}

// logStore keeps the newest cap entries in a ring, so that adding one
// costs the same however full it is.
type logStore struct {
	mu      sync.Mutex
	cap     int
	entries []LogEntry
	next    int // where the next entry goes once the ring is full
}

func (l *logStore) add(e LogEntry) {
	l.mu.Lock()
	if len(l.entries) < l.cap {
		l.entries = append(l.entries, e)
	} else {
		l.entries[l.next] = e
		l.next = (l.next + 1) % l.cap
	}
	l.mu.Unlock()
}

// snapshot returns the entries oldest first.
func (l *logStore) snapshot() []LogEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]LogEntry, 0, len(l.entries))
	out = append(out, l.entries[l.next:]...)
	return append(out, l.entries[:l.next]...)
}

// Status is a proxy_status_t.
type Status uint32

const (
	StatusOK                  Status = 0
	StatusNotFound            Status = 1
	StatusBadArgument         Status = 2
	StatusSerializationFailed Status = 3
	StatusInvalidMemoryAccess Status = 6
	StatusEmpty               Status = 7
	StatusCASMismatch         Status = 8
	StatusInternalFailure     Status = 10
	StatusBrokenConnection    Status = 11
	StatusUnimplemented       Status = 12
)
