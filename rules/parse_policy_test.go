package rules

import (
	"reflect"
	"strings"
	"testing"
)

// A rule on its own is refused exactly when the same rule inside a
// configuration is, with the configuration's field path less "rules[0].".
func TestParseRule_SameAsParseConfig(t *testing.T) {
	for _, rule := range []string{
		`{"name":"a","limit":1,"window":"1m"}`,
		`{"name":"a","limit":0,"window":"1m"}`,
		`{"name":"a","limit":1.0,"window":"1m"}`,
		`{"name":"a","limit":1,"window":"400d"}`,
		`{"name":"a","limit":10,"window":"1m","burst":20}`,
		`{"name":"a","limit":1,"window":"1m","cost":2}`,
		`{"name":"Search","limit":1,"window":"1m"}`,
		`{"name":"a","limit":1,"window":"1m","scope":"global+ip"}`,
		`{"name":"a","limit":10,"window":"1m","match":{"paths":["api/v1"]}}`,
		`{"name":"a","limit":10,"window":"1m","match":{"headers":[{"name":"x","present":true,"equals":"y"}]}}`,
		`{"name":"a","limit":10,"window":"1m","penalty":{"multipliers":[4,2]}}`,
		`{"name":"a","limit":10,"window":"1m","zz":1}`,
		`{"limit":10,"window":"1m"}`,
		`{"name":"a","limit":10,"window":"1m","action":"throttle"}`,
		`{"name":"a","limit":10,"window":"1m","priority":2000000}`,
		`{"name":"a","algorithm":"token_bucket","limit":10,"window":"1m","burst":20,"cost":15,"match":{"methods":["get"],"hosts":["*.Example.com"]}}`,
		`[]`,
		`"a"`,
	} {
		r, err := ParseRule([]byte(rule))
		c, cerr := ParseConfig([]byte(`{"rules":[` + rule + `]}`))
		if (err == nil) != (cerr == nil) {
			t.Errorf("%s: ParseRule %v, ParseConfig %v", rule, err, cerr)
			continue
		}
		if err == nil {
			if !reflect.DeepEqual(r, c.Rules[0]) {
				t.Errorf("%s: ParseRule %+v, ParseConfig %+v", rule, r, c.Rules[0])
			}
			continue
		}
		re, ce := err.(*ConfigError), cerr.(*ConfigError)
		want := strings.TrimPrefix(strings.TrimPrefix(ce.Path, "rules[0]"), ".")
		if re.Path != want || re.Err.Error() != ce.Err.Error() {
			t.Errorf("%s:\n ParseRule   %q: %v\n ParseConfig %q: %v", rule, re.Path, re.Err, ce.Path, ce.Err)
		}
	}
}

func TestParseRule_NotJSON(t *testing.T) {
	if _, err := ParseRule([]byte(`{"name":`)); err == nil || err.Error() != "rule is not valid JSON" {
		t.Errorf("got %v", err)
	}
}

func TestParseConfig_RulesFrom(t *testing.T) {
	c, err := ParseConfig([]byte(`{"bridge":{"cluster":"b","authority":"br"},"rules_from":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := RulesFrom{Cluster: "b", Authority: "br", Path: PolicyPath, IntervalMS: 5000, TimeoutMS: 1000}
	if *c.RulesFrom != want {
		t.Errorf("defaults %+v, want %+v", *c.RulesFrom, want)
	}
	c, err = ParseConfig([]byte(`{"rules_from":{"cluster":"p","authority":"pa","path":"/p","interval":"250ms","timeout":"2s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	want = RulesFrom{Cluster: "p", Authority: "pa", Path: "/p", IntervalMS: 250, TimeoutMS: 2000}
	if *c.RulesFrom != want {
		t.Errorf("got %+v, want %+v", *c.RulesFrom, want)
	}
	if c, _ := ParseConfig([]byte(`{}`)); c.RulesFrom != nil {
		t.Error("rules_from without the field")
	}
	for cfg, want := range map[string]string{
		`{"rules_from":{"interval":"10ms"}}`: "rules_from.interval: must be from 100ms to 1h, got 10ms",
		`{"rules_from":{"path":"x"}}`:        `rules_from.path: must start with "/"`,
		`{"rules_from":{"cluster":""}}`:      "rules_from.cluster: must not be empty",
		`{"rules_from":{"zz":1}}`:            "rules_from.zz: unknown field (known: cluster, authority, path, interval, timeout)",
		`{"rules_from":[]}`:                  "rules_from: must be an object",
	} {
		if _, err := ParseConfig([]byte(cfg)); err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %s", cfg, err, want)
		}
	}
}

func TestConfig_WithPolicy(t *testing.T) {
	base, err := ParseConfig([]byte(`{
  "penalty": {"enabled": true, "violation_threshold": 7},
  "categories": [{"name": "chat", "paths": ["/chat"]}],
  "rules": [{"name": "own", "limit": 5, "window": "1m", "priority": 50},
            {"name": "own-late", "limit": 5, "window": "1m", "priority": 200}]}`))
	if err != nil {
		t.Fatal(err)
	}
	c, v, err := base.WithPolicy([]byte(`{"store":"s1","version":7,"rules":[
  {"name":"remote-b","limit":9,"window":"1s","priority":100},
  {"name":"remote-a","limit":3,"window":"1m","priority":50,"penalty":{"multipliers":[2]}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if v != (PolicyVersion{"s1", 7}) || v.ETag() != `"s1:7"` {
		t.Errorf("version %+v etag %s", v, v.ETag())
	}
	var names []string
	for _, r := range c.Rules {
		names = append(names, r.Name)
	}
	if got := strings.Join(names, ","); got != "own,remote-a,remote-b,own-late" {
		t.Errorf("rules in order %s", got)
	}
	if len(base.Rules) != 2 {
		t.Errorf("base changed: %d rules", len(base.Rules))
	}
	// Remote rules inherit the plugin's top-level penalty as its own rules do.
	if p := c.Rules[2].Spec.Penalty; p == nil || p.ViolationThreshold != 7 {
		t.Errorf("remote-b penalty %+v, want the top-level one", p)
	}
	if p := c.Rules[1].Spec.Penalty; p == nil || p.ViolationThreshold != 7 || p.Multipliers[0] != 2 {
		t.Errorf("remote-a penalty %+v, want threshold 7 inherited, multipliers [2]", p)
	}
	// The merged configuration limits what either would.
	var plan Plan
	c.Evaluate(&Request{Method: "GET", Path: "/x", Source: "192.0.2.1:1", Headers: mapHeaders{}}, &plan)
	if len(plan.Limits) != 4 {
		t.Errorf("%d limits, want 4", len(plan.Limits))
	}

	for doc, want := range map[string]string{
		`{"store":"s1","version":8,"rules":[{"name":"own","limit":1,"window":"1m"}]}`:                                    `rules: "own" is already the name of a rule in the plugin configuration`,
		`{"store":"s1","version":8,"rules":[{"name":"chat","limit":1,"window":"1m"}]}`:                                   `rules: "chat" is already the name of a category in the plugin configuration`,
		`{"store":"s1","version":8,"rules":[{"name":"a","limit":1,"window":"1m"},{"name":"b","limit":0,"window":"1m"}]}`: "rules[1].limit: must be from 1 to 1099511627776, got 0",
		`{"store":"s1","version":8,"rules":[{"name":"a","limit":1,"window":"1m"},{"name":"a","limit":1,"window":"1m"}]}`: `rules[1].name: "a" is already the name of rules[0]`,
		`{"store":"s1","rules":[]}`:          "needs store and version",
		`{"version":1,"rules":[]}`:           "needs store and version",
		`{"store":"s1","version":1`:          "policy is not valid JSON",
		`{"store":"s1","version":1,"zz":[]}`: "zz: unknown field (known: store, version, rules)",
	} {
		if _, _, err := base.WithPolicy([]byte(doc)); err == nil || err.Error() != want {
			t.Errorf("%s:\n got %v\nwant %s", doc, err, want)
		}
	}
	many := `{"store":"s","version":1,"rules":[`
	for i := 0; i < 61; i++ {
		if i > 0 {
			many += ","
		}
		many += `{"name":"r` + strings.Repeat("x", i) + `","limit":1,"window":"1m"}`
	}
	many += `]}`
	if _, _, err := base.WithPolicy([]byte(many)); err == nil || !strings.Contains(err.Error(), "64 rules and categories with the plugin's own: at most 63") {
		t.Errorf("61 remote rules: %v", err)
	}
}

func TestPolicyVersion_Newer(t *testing.T) {
	cur := PolicyVersion{"a", 5}
	for v, want := range map[PolicyVersion]bool{{"a", 6}: true, {"a", 5}: false, {"a", 4}: false, {"b", 1}: true} {
		if v.Newer(cur) != want {
			t.Errorf("%+v.Newer(%+v) = %v", v, cur, !want)
		}
	}
}
