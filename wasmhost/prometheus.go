package wasmhost

import (
	"bufio"
	"cmp"
	"io"
	"slices"
	"strconv"
)

// envoyBuckets are the upper bounds Envoy exports a histogram's buckets
// with unless its bootstrap sets histogram_bucket_settings (source/common/
// stats/histogram_impl.cc, HistogramSettingsImpl::defaultBuckets), so a
// dashboard's histogram_quantile reads the gateway as it reads Envoy.
var envoyBuckets = [...]float64{0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 600000, 1800000, 3600000}

// PrometheusName is the name Envoy's /stats/prometheus gives a metric a
// plugin defined. Envoy keeps such metrics in its wasmcustom stat namespace
// (source/extensions/common/wasm/context.cc, Context::defineMetric), and
// for a stat in a custom namespace it strips the namespace, adds no
// "envoy_" prefix, turns every character outside [a-zA-Z0-9_] into "_",
// and leaves out a name that then starts with a digit (source/server/
// admin/prometheus_stats.cc, metricName): ok is false for those.
func PrometheusName(metric string) (name string, ok bool) {
	b := []byte(metric)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	if len(b) == 0 || b[0] >= '0' && b[0] <= '9' {
		return "", false
	}
	return string(b), true
}

// WritePrometheus writes every metric the plugin defined, summed over the
// VMs, in Prometheus' text format (version 0.0.4), as Envoy's
// /stats/prometheus exports them: named by PrometheusName, sorted by name,
// counters and gauges as one sample each from the moment they are
// defined, histograms as cumulative buckets with Envoy's default bounds
// (in the unit the plugin records, such as milliseconds), _sum and _count.
// The dashboard and alerts in deploy/ read a gateway's scrape as they read
// Envoy's.
func (h *Host) WritePrometheus(w io.Writer) error {
	type family struct {
		name string
		m    metric
	}
	h.metrics.mu.Lock()
	fams := make([]family, 0, len(h.metrics.list))
	for _, x := range h.metrics.list {
		if name, ok := PrometheusName(x.name); ok {
			fams = append(fams, family{name, metric{typ: x.typ, value: x.value, sum: x.sum, buckets: slices.Clone(x.buckets)}})
		}
	}
	h.metrics.mu.Unlock()
	slices.SortFunc(fams, func(a, b family) int { return cmp.Compare(a.name, b.name) })
	bw := bufio.NewWriter(w)
	var digits [32]byte
	num := digits[:0]
	for _, f := range fams {
		bw.WriteString("# TYPE ")
		bw.WriteString(f.name)
		switch f.m.typ {
		case MetricCounter:
			bw.WriteString(" counter\n")
		case MetricGauge:
			bw.WriteString(" gauge\n")
		case MetricHistogram:
			bw.WriteString(" histogram\n")
			var below uint64
			for i, le := range envoyBuckets {
				below += f.m.buckets[i]
				bw.WriteString(f.name)
				bw.WriteString(`_bucket{le="`)
				bw.Write(strconv.AppendFloat(num[:0], le, 'f', -1, 64))
				bw.WriteString(`"} `)
				bw.Write(strconv.AppendUint(num[:0], below, 10))
				bw.WriteByte('\n')
			}
			bw.WriteString(f.name)
			bw.WriteString(`_bucket{le="+Inf"} `)
			bw.Write(strconv.AppendInt(num[:0], f.m.value, 10))
			bw.WriteString("\n")
			bw.WriteString(f.name)
			bw.WriteString("_sum ")
			bw.Write(strconv.AppendUint(num[:0], f.m.sum, 10))
			bw.WriteString("\n")
			bw.WriteString(f.name)
			bw.WriteString("_count ")
			bw.Write(strconv.AppendInt(num[:0], f.m.value, 10))
			bw.WriteString("\n")
			continue
		}
		bw.WriteString(f.name)
		bw.WriteByte(' ')
		bw.Write(strconv.AppendInt(num[:0], f.m.value, 10))
		bw.WriteByte('\n')
	}
	return bw.Flush()
}
