package filter

import (
	"strings"
	"testing"
)

const policyConfig = `{
  "bridge": {"cluster": "bridge", "token": "t0k"},
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
  "rules_from": {"interval": "250ms"},
  "rules": [{"name": "own", "match": {"paths": ["/own"]}, "limit": 10, "window": "1m"}]
}`

func policyDoc(version, limit string) string {
	return `{"store":"s1","version":` + version + `,"rules":[{"name":"remote","match":{"paths":["/remote"]},"limit":` + limit + `,"window":"1m"}]}`
}

// limitsFor runs a request to path and returns the rules its check named.
func limitsFor(t *testing.T, h *fakeHost, p *Plugin, path string) string {
	t.Helper()
	n := len(h.calls)
	h.request(p, 100, map[string]string{":path": path, "x-user-id": "u"})
	if len(h.calls) == n {
		return ""
	}
	body := h.calls[len(h.calls)-1].body
	var names []string
	for _, part := range strings.Split(body, `"rule":"`)[1:] {
		names = append(names, part[:strings.IndexByte(part, '"')])
	}
	return strings.Join(names, ",")
}

func TestPlugin_RulesFromBridge(t *testing.T) {
	h := newFakeHost(policyConfig)
	p := NewPlugin(h, 1)
	if !p.OnPluginStart(0) {
		t.Fatal(h.logs)
	}
	if h.tickMS != 250 {
		t.Errorf("tick %d ms, want the interval, 250", h.tickMS)
	}
	// Asked for at once, with the check token and no version.
	c := h.calls[0]
	if c.cluster != "bridge" || c.headers[":path"] != "/v1/rate-limit/policy" || c.headers[":method"] != "GET" ||
		c.headers["authorization"] != "Bearer t0k" || c.headers["if-none-match"] != "" || c.timeout != 1000 {
		t.Fatalf("policy call-out %+v", c)
	}
	h.answer(p, "200", policyDoc("1", "3"))
	if h.counters[MetricPolicyApplied] != 1 {
		t.Fatalf("not applied: %v", h.logs)
	}
	if got := limitsFor(t, h, p, "/remote"); got != "remote" {
		t.Errorf("/remote checks %q, want the bridge's rule", got)
	}
	if got := limitsFor(t, h, p, "/own"); got != "own" {
		t.Errorf("/own checks %q, want the plugin's own rule", got)
	}

	// Every tick at this interval asks again, with the version held;
	// 304 changes nothing.
	n := len(h.calls)
	h.tick(p)
	if len(h.calls) != n+1 || h.calls[n].headers["if-none-match"] != `"s1:1"` {
		t.Fatalf("tick: %d calls, last %+v", len(h.calls)-n, h.calls[len(h.calls)-1])
	}
	h.tick(p) // one in flight: not asked twice
	if len(h.calls) != n+1 {
		t.Fatalf("asked again while a call was in flight")
	}
	h.answer(p, "304", "")
	cfg := p.Config()

	// A policy the plugin's validation refuses is refused whole; the rules
	// in force stay, and it is not fetched again until it changes.
	h.tick(p)
	h.answer(p, "200", policyDoc("2", "0"))
	if p.Config() != cfg || h.counters[MetricPolicyRefused] != 1 {
		t.Fatalf("refused policy applied: %v", h.logs)
	}
	if last := h.logs[len(h.logs)-1]; !strings.Contains(last, "sluice: policy from the bridge refused, keeping version 1: rules[0].limit: must be from 1") {
		t.Errorf("log %q", last)
	}
	h.tick(p)
	if got := h.calls[len(h.calls)-1].headers["if-none-match"]; got != `"s1:2"` {
		t.Errorf("after a refusal if-none-match %q, want the refused version", got)
	}
	// An older version, from a bridge behind another, is not applied.
	h.answer(p, "200", policyDoc("0", "7"))
	if p.Config() != cfg {
		t.Fatal("older policy applied")
	}

	// Failures are counted, logged once, and keep the policy in force.
	h.tick(p)
	h.answer(p, "503", "")
	h.tick(p)
	p.OnHTTPCallResponse(uint32(len(h.calls)), 0, 0, 0)
	if h.counters[MetricPolicyErrors] != 2 || p.Config() != cfg {
		t.Fatalf("errors %d", h.counters[MetricPolicyErrors])
	}
	warned := 0
	for _, l := range h.logs {
		if strings.Contains(l, "cannot fetch the policy") {
			warned++
		}
	}
	if warned != 1 {
		t.Errorf("%d warnings for two failures, want 1", warned)
	}
	h.tick(p)
	h.answer(p, "200", policyDoc("3", "5"))
	if got := p.Config().Rules; len(got) != 2 || got[1].Spec.Limit != 5 {
		t.Fatalf("version 3 not applied: %+v", got)
	}
	if !strings.Contains(strings.Join(h.logs, "\n"), "the bridge answers again") {
		t.Error("recovery not logged")
	}

	// A new configuration keeps the policy applied when it still fits.
	h.config = []byte(strings.Replace(policyConfig, `"limit": 10`, `"limit": 20`, 1))
	if !p.OnPluginStart(0) {
		t.Fatal(h.logs)
	}
	if got := limitsFor(t, h, p, "/remote"); got != "remote" {
		t.Errorf("after reconfiguring /remote checks %q", got)
	}
}

func TestPlugin_RulesFromInterval(t *testing.T) {
	h := newFakeHost(strings.Replace(policyConfig, `"250ms"`, `"3s"`, 1))
	p := NewPlugin(h, 1)
	p.OnPluginStart(0)
	h.answer(p, "304", "")
	if h.tickMS != 1000 {
		t.Fatalf("tick %d", h.tickMS)
	}
	var fetchedAt []int
	for i := 1; i <= 6; i++ {
		n := len(h.calls)
		h.tick(p)
		if len(h.calls) > n {
			fetchedAt = append(fetchedAt, i)
			h.answer(p, "304", "")
		}
	}
	if len(fetchedAt) != 2 || fetchedAt[0] != 3 || fetchedAt[1] != 6 {
		t.Fatalf("fetched at ticks %v, want 3 and 6 (every 3 s)", fetchedAt)
	}
}

func TestPlugin_NoRulesFromNoCallOut(t *testing.T) {
	h := newFakeHost(strings.Replace(policyConfig, `"rules_from": {"interval": "250ms"},`, "", 1))
	p := NewPlugin(h, 1)
	p.OnPluginStart(0)
	h.tick(p)
	if len(h.calls) != 0 || h.tickMS != 1000 {
		t.Fatalf("%d call-outs, tick %d", len(h.calls), h.tickMS)
	}
}
