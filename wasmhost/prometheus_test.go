package wasmhost

import (
	"fmt"
	"strings"
	"testing"
)

func TestPrometheusName(t *testing.T) {
	for _, tc := range []struct {
		metric, want string
		ok           bool
	}{
		{"sluice_requests_total", "sluice_requests_total", true},
		{"my.metric-x", "my_metric_x", true},
		{"Caps:ok", "Caps_ok", true},
		{"9lives", "", false},
		{".9lives", "_9lives", true},
		{"", "", false},
	} {
		got, ok := PrometheusName(tc.metric)
		if got != tc.want || ok != tc.ok {
			t.Errorf("PrometheusName(%q) = %q, %v; want %q, %v", tc.metric, got, ok, tc.want, tc.ok)
		}
	}
}

// The whole exposition: names as Envoy exports them, sorted, a metric
// Envoy leaves out left out, histogram buckets cumulative with a value on
// a bound counted in that bound's bucket, values above the last bound
// only in +Inf, and every value recorded counted, beyond the samples kept
// for Host.Histogram.
func TestHost_WritePrometheus(t *testing.T) {
	h := &Host{}
	h.metrics.init()
	def := func(typ MetricType, name string) uint32 {
		id, st := h.metrics.define(typ, name)
		if st != StatusOK {
			t.Fatalf("define %s: %v", name, st)
		}
		return id
	}
	c := def(MetricCounter, "b.requests-total")
	g := def(MetricGauge, "a_waiting")
	def(MetricCounter, "9lives")
	hist := def(MetricHistogram, "c_delay_ms")
	def(MetricCounter, "a_zero_total")
	h.metrics.increment(c, 3)
	h.metrics.increment(c, 4)
	h.metrics.record(g, 5)
	h.metrics.increment(g, -2)
	for range maxHistogramSamples {
		h.metrics.record(hist, 30)
	}
	for _, v := range []uint64{0, 1, 1, 2, 60000, 3600000, 3600001} {
		h.metrics.record(hist, v)
	}
	var b strings.Builder
	if err := h.WritePrometheus(&b); err != nil {
		t.Fatal(err)
	}
	// Thirty for each kept sample, then seven values around the bounds.
	k := maxHistogramSamples
	want := fmt.Sprintf(`# TYPE a_waiting gauge
a_waiting 3
# TYPE a_zero_total counter
a_zero_total 0
# TYPE b_requests_total counter
b_requests_total 7
# TYPE c_delay_ms histogram
c_delay_ms_bucket{le="0.5"} 1
c_delay_ms_bucket{le="1"} 3
c_delay_ms_bucket{le="5"} 4
c_delay_ms_bucket{le="10"} 4
c_delay_ms_bucket{le="25"} 4
c_delay_ms_bucket{le="50"} %[1]d
c_delay_ms_bucket{le="100"} %[1]d
c_delay_ms_bucket{le="250"} %[1]d
c_delay_ms_bucket{le="500"} %[1]d
c_delay_ms_bucket{le="1000"} %[1]d
c_delay_ms_bucket{le="2500"} %[1]d
c_delay_ms_bucket{le="5000"} %[1]d
c_delay_ms_bucket{le="10000"} %[1]d
c_delay_ms_bucket{le="30000"} %[1]d
c_delay_ms_bucket{le="60000"} %[2]d
c_delay_ms_bucket{le="300000"} %[2]d
c_delay_ms_bucket{le="600000"} %[2]d
c_delay_ms_bucket{le="1800000"} %[2]d
c_delay_ms_bucket{le="3600000"} %[3]d
c_delay_ms_bucket{le="+Inf"} %[4]d
c_delay_ms_sum %[5]d
c_delay_ms_count %[4]d
`, 4+k, 5+k, 6+k, 7+k, 30*k+0+1+1+2+60000+3600000+3600001)
	if got := b.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	if s := h.metrics.samples("c_delay_ms"); len(s) != maxHistogramSamples {
		t.Errorf("%d samples kept, want %d", len(s), maxHistogramSamples)
	}
}
