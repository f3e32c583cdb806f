package rls

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The examples of envoyproxy/ratelimit's README, in one domain each.
const exampleConfig = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: destination_cluster
    value: mongo_cps
    rate_limit: {unit: minute, requests_per_unit: 100, name: mongo}
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bar
        rate_limit: {unit: hour, requests_per_unit: 200}
      - key: destination_cluster
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    value: /api/*
    shadow_mode: true
    rate_limit: {unit: week, requests_per_unit: 7}
  - key: path
    value: /api/v2/*
    rate_limit: {unit: month, requests_per_unit: 8}
  - key: path
    value: /health
    rate_limit: {unlimited: true}
  - key: tier
    value: 200
    rate_limit: {unit: YEAR, requests_per_unit: 9, replaces: [{name: mongo}]}
  - key: path
    value: /v*/users/*/orders
    rate_limit: {unit: minute, requests_per_unit: 11}
  - key: files
    value: files/*
    share_threshold: true
    value_to_metric: true
    metadata: {team: storage}
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: tenant
    value: team-*
    share_threshold: true
    descriptors:
      - key: method
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 60}
      - key: region
        value: eu-*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 61}
  - key: tokens
    budget: true
    rate_limit: {unit: day, requests_per_unit: 100000}
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`

func TestConfig_Match(t *testing.T) {
	c := parseOne(t, exampleConfig)
	e := entries
	checkMatches(t, c, []matchCase{
		{"any value", "edge", e("remote_address", "10.0.0.1"), &Limit{Place: "edge.remote_address", RequestsPerUnit: 10, Unit: 1}},
		{"key and value, named", "edge", e("destination_cluster", "mongo_cps"), &Limit{Name: "mongo", Place: "edge.destination_cluster_mongo_cps", RequestsPerUnit: 100, Unit: 2}},
		{"a value not configured", "edge", e("destination_cluster", "other"), nil},
		{"nested, value", "edge", e("source_cluster", "proxy", "destination_cluster", "bar"), &Limit{Place: "edge.source_cluster_proxy.destination_cluster_bar", RequestsPerUnit: 200, Unit: 3}},
		{"nested, any value", "edge", e("source_cluster", "proxy", "destination_cluster", "baz"), &Limit{Place: "edge.source_cluster_proxy.destination_cluster", RequestsPerUnit: 5, Unit: 4}},
		{"a parent with no limit", "edge", e("source_cluster", "proxy"), nil},
		{"more entries than the tree", "edge", e("remote_address", "a", "x", "y"), nil},
		{"fewer entries than the tree", "edge", e("key1", "value1"), nil},
		{"nested key only", "edge", e("key1", "value1", "subkey1", "anything"), &Limit{Place: "edge.key1_value1.subkey1", RequestsPerUnit: 3, Unit: 1}},
		{"wildcard value", "edge", e("path", "/api/x"), &Limit{Place: "edge.path_/api/*", RequestsPerUnit: 7, Unit: 7, ShadowMode: true}},
		{"the first wildcard that matches", "edge", e("path", "/api/v2/x"), &Limit{Place: "edge.path_/api/*", RequestsPerUnit: 7, Unit: 7, ShadowMode: true}},
		{"exact before wildcard", "edge", e("path", "/health"), &Limit{Place: "edge.path_/health", Unlimited: true}},
		{"a number as value", "edge", e("tier", "200"), &Limit{Place: "edge.tier_200", RequestsPerUnit: 9, Unit: 6, Replaces: []string{"mongo"}}},
		{"a wildcard is per key", "edge", e("other", "/api/x"), nil},
		{"wildcards within the value", "edge", e("path", "/v2/users/42/orders"), &Limit{Place: "edge.path_/v*/users/*/orders", RequestsPerUnit: 11, Unit: 2}},
		{"each * takes nothing or more", "edge", e("path", "/v/users//orders"), &Limit{Place: "edge.path_/v*/users/*/orders", RequestsPerUnit: 11, Unit: 2}},
		{"the parts in order", "edge", e("path", "/v2/orders/users/orders"), nil},
		{"the last part ends the value", "edge", e("path", "/v2/users/42/orders/1"), nil},
		{"parts may not overlap", "edge", e("path", "/v/users/orders"), nil},
		{"a shared wildcard", "edge", e("files", "files/a.pdf"), &Limit{Place: "edge.files_files/*", RequestsPerUnit: 10, Unit: 3, Shared: []string{"files/*"}, Metadata: map[string]any{"team": "storage"}}},
		{"a shared wildcard above the limit", "edge", e("tenant", "team-a", "method", "GET"),
			&Limit{Place: "edge.tenant_team-*.method", RequestsPerUnit: 60, Unit: 2, Shared: []string{"team-*", ""}}},
		{"a budget", "edge", e("tokens", "team-a"), &Limit{Place: "edge.tokens", RequestsPerUnit: 100000, Unit: 4, Budget: true}},
		{"a quota", "edge", e("service", "service_1"), &Limit{Place: "edge.service_service_1", RequestsPerUnit: 1, Unit: 2, Quota: true}},
		{"shared wildcards on two levels", "edge", e("tenant", "team-b", "region", "eu-west"),
			&Limit{Place: "edge.tenant_team-*.region_eu-*", RequestsPerUnit: 61, Unit: 2, Shared: []string{"team-*", "eu-*"}}},
		{"unknown domain", "nope", e("remote_address", "a"), nil},
		{"no entries", "edge", nil, nil},
	})
}

func TestParse_Errors(t *testing.T) {
	for _, tt := range []struct{ yaml, want string }{
		{"descriptors: []", "f.yaml: domain: required"},
		{"domain: d\ndescriptor: []", "f.yaml: descriptor: unknown field (want domain, descriptors)"},
		{"domain: d\ndescriptors:\n  - value: x", "f.yaml: descriptors[0].key: required"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}",
			`f.yaml: descriptors[0].rate_limit.unit: "fortnight" is not second, minute, hour, day, week, month or year`},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}", "f.yaml: descriptors[0].rate_limit.requests_per_unit: required"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}",
			"f.yaml: descriptors[0].rate_limit.requests_per_unit: must be an integer from 0 to 1099511627776"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}",
			"f.yaml: descriptors[0].rate_limit.requests_per_unit: YAML reads this as the number 1.5, which envoyproxy/ratelimit refuses here"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: '5'}",
			"f.yaml: descriptors[0].rate_limit.requests_per_unit: must be an integer"},
		// YAML reads these as numbers envoyproxy/ratelimit refuses in a
		// text field; as text, in quotes, they are taken.
		{"domain: d\ndescriptors:\n  - key: version\n    value: 1.10", "f.yaml: descriptors[0].value: YAML reads this as the number 1.1, which envoyproxy/ratelimit refuses here"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: 1e3", "f.yaml: descriptors[0].value: YAML reads this as the number 1000,"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: 18446744073709551615", "f.yaml: descriptors[0].value: YAML reads this as the number 18446744073709551615,"},
		{"domain: d\ndescriptors:\n  - key: k\n    1: x", "f.yaml: descriptors[0].1: a key must be text"},
		// Of several faults in one mapping, the first by name, every time.
		{"domain: d\nzz: 1\naa: 2\nmm: 3", "f.yaml: aa: unknown field"},
		{"domain: d\ndescriptors:\n  - key: k\n    2: x\n    1: 1.5\n    0.5: y", "f.yaml: descriptors[0].0.5: a key must be text"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}", "f.yaml: descriptors[0].rate_limit.unit: must not be given with unlimited"},
		{"domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: a\n        rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 2}",
			"f.yaml: descriptors[0].descriptors[0].rate_limit.unit_multiplier: unknown field"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v", "f.yaml: descriptors[1]: descriptor d.k_v is configured twice"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}]}",
			"f.yaml: descriptors[0].rate_limit.replaces[0].name: a limit cannot replace itself"},
		{"domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes please", "f.yaml: descriptors[0].shadow_mode: want true or false"},
		{"domain: d\ndescriptors: {key: k}", "f.yaml: descriptors: want a list"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true", "f.yaml: descriptors[0].share_threshold: only for a value with a *"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: v*\n    share_threshold: 1", "f.yaml: descriptors[0].share_threshold: want true or false"},
		{"domain: d\ndescriptors:\n  - key: k\n    value_to_metric: yes please", "f.yaml: descriptors[0].value_to_metric: want true or false"},
		{"domain: d\ndescriptors:\n  - key: k\n    metadata: [a]", "f.yaml: descriptors[0].metadata: want a mapping"},
		{"domain: d\ndescriptors:\n  - key: k\n    quota_mode: 1", "f.yaml: descriptors[0].quota_mode: want true or false"},
		{"domain: d\ndescriptors:\n  - key: k\n    budget: true", "f.yaml: descriptors[0].budget: only with a rate_limit"},
		{"domain: d\ndescriptors:\n  - key: k\n    budget: 1\n    rate_limit: {unit: second, requests_per_unit: 1}", "f.yaml: descriptors[0].budget: want true or false"},
		{"domain: [d", "f.yaml: yaml: line 1"},
	} {
		_, err := Parse(map[string][]byte{"f.yaml": []byte(tt.yaml)}, false)
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want %q", tt.yaml, err, tt.want)
		}
	}
}

// A text field takes a scalar as written, as envoyproxy/ratelimit reads it
// (yaml.v2 into a string field): 007, 0x1F, 1_000 and yes are those texts,
// not the numbers and true YAML reads them as; metadata keeps the values,
// and the text of what YAML reads for a key below its own.
func TestParse_ScalarsAsWritten(t *testing.T) {
	const yaml = `domain: 0123
descriptors:
  - key: account
    value: 007
    rate_limit: {unit: minute, requests_per_unit: 1_000, name: 0x1F, replaces: [{name: yes}]}
    metadata: {code: 007, ratio: 1.50, big: 18446744073709551615, on: {on: on}}
  - key: flag
    value: yes
    descriptors:
      - key: 404
        value: +5
        rate_limit: {unit: second, requests_per_unit: 0x10}
  - key: quoted
    value: '1.10'
    rate_limit: {unit: hour, requests_per_unit: 1}
`
	c := parseOne(t, yaml)
	e := entries
	checkMatches(t, c, []matchCase{
		{"leading zeros kept", "0123", e("account", "007"), &Limit{Place: "0123.account_007", Name: "0x1F", RequestsPerUnit: 1000, Unit: 2, Replaces: []string{"yes"},
			Metadata: map[string]any{"code": json.Number("7"), "ratio": json.Number("1.5"), "big": json.Number("18446744073709551615"), "on": map[string]any{"true": true}}}},
		{"not the number YAML reads", "0123", e("account", "7"), nil},
		{"the domain as written", "123", e("account", "007"), nil},
		{"yes as written", "0123", e("flag", "yes", "404", "+5"), &Limit{Place: "0123.flag_yes.404_+5", RequestsPerUnit: 16, Unit: 1}},
		{"not true", "0123", e("flag", "true", "404", "+5"), nil},
		{"a quoted number", "0123", e("quoted", "1.10"), &Limit{Place: "0123.quoted_1.10", RequestsPerUnit: 1, Unit: 3}},
	})
}

// A directory's files each configure a domain; two may configure one only
// when merged.
func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]")
	write("b.yml", "domain: b\ndescriptors: [{key: k, rate_limit: {unit: minute, requests_per_unit: 2}}]")
	write("notes.txt", "not configuration")
	c, err := load(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Domains(); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Errorf("domains %v", got)
	}
	if l := c.Match("b", []Entry{{"k", "v"}}); l == nil || l.RequestsPerUnit != 2 || l.Unit.WindowMS() != 60_000 {
		t.Errorf("b's limit: %+v", l)
	}
	write("c.yaml", "domain: a\ndescriptors: [{key: j, rate_limit: {unit: hour, requests_per_unit: 3}}, {key: w, value: x*, rate_limit: {unit: day, requests_per_unit: 4}}]")
	if _, err := load(dir, false); err == nil || !strings.Contains(err.Error(), `c.yaml: domain "a" is configured in `+filepath.Join(dir, "a.yaml")+" too") {
		t.Errorf("a domain twice: %v", err)
	}
	// Merged, as with envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG: c.yaml's
	// descriptors join a's.
	c, err = load(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		entries []Entry
		per     int64
	}{{[]Entry{{"k", "v"}}, 1}, {[]Entry{{"j", "v"}}, 3}, {[]Entry{{"w", "xy"}}, 4}} {
		if l := c.Match("a", tt.entries); l == nil || l.RequestsPerUnit != tt.per {
			t.Errorf("merged, %v: %+v, want %d per unit", tt.entries, l, tt.per)
		}
	}
	write("d.yaml", "domain: a\ndescriptors: [{key: j, rate_limit: {unit: hour, requests_per_unit: 9}}]")
	if _, err := load(dir, true); err == nil || !strings.Contains(err.Error(), `d.yaml: descriptor a.j is configured in `+filepath.Join(dir, "a.yaml")+", "+filepath.Join(dir, "c.yaml")+" too") {
		t.Errorf("merged, a descriptor twice: %v", err)
	}
	if _, err := load(filepath.Join(dir, "none"), false); err == nil {
		t.Error("a missing path loaded")
	}
}

// examples/rls/ratelimit.yaml has a limit for each descriptor
// examples/rls/envoy.yaml's actions send.
func TestLoad_Example(t *testing.T) {
	c, err := load("../../../examples/rls/ratelimit.yaml", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		entries []Entry
		name    string
		per     int64
		unit    Unit
	}{
		{[]Entry{{"remote_address", "203.0.113.7"}}, "edge.remote_address", 100, 2},
		{[]Entry{{"remote_address", "203.0.113.7"}, {"path", "login"}}, "edge.remote_address.path_login", 5, 2},
		{[]Entry{{"tier", "premium"}}, "edge.tier_premium", 50, 1},
		{[]Entry{{"tier", "gold"}}, "edge.tier", 5, 1},
	} {
		l := c.Match("edge", tt.entries)
		if l == nil || l.Place != tt.name || l.RequestsPerUnit != tt.per || l.Unit != tt.unit || l.Unlimited {
			t.Errorf("%v: %+v, want %s %d per %v", tt.entries, l, tt.name, tt.per, tt.unit)
		}
	}
	if l := c.Match("edge", []Entry{{"tier", "internal"}}); l == nil || !l.Unlimited {
		t.Errorf("the internal tier: %+v, want unlimited", l)
	}
	if l := c.Match("edge", []Entry{{"team", "data"}}); l == nil || !l.Budget || l.RequestsPerUnit != 1_000_000_000 || l.Unit != 4 {
		t.Errorf("a team's exports: %+v, want a budget of 1e9 a day", l)
	}
}

// Dump lists every limit as envoyproxy/ratelimit's /rlconfig does.
func TestConfig_Dump(t *testing.T) {
	c := parseOne(t, `domain: d
descriptors:
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    value: /free
    rate_limit: {unlimited: true}
  - key: user
    shadow_mode: true
    quota_mode: true
    rate_limit: {unit: week, requests_per_unit: 9}
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 1}
`)
	want := `d.ip: unit=HOUR requests_per_unit=3, shadow_mode: false, quota_mode: false
d.path_/free: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false
d.user: unit=WEEK requests_per_unit=9, shadow_mode: true, quota_mode: true
d.user.path: unit=SECOND requests_per_unit=1, shadow_mode: false, quota_mode: false
`
	if got := c.Dump(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// A wildcard is matched against an entry's key and value as the tree
// names them, key_value, as envoyproxy/ratelimit matches it: the key takes
// part, and a "*" may be in the key of a descriptor without value.
func TestMatch_WildcardTakesKeyValue(t *testing.T) {
	const yaml = `domain: d
descriptors:
  - key: team
    value: a_*
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 3}
`
	c := parseOne(t, yaml)
	team := &Limit{Place: "d.team_a_*", RequestsPerUnit: 2, Unit: 3}
	path := &Limit{Place: "d.path*", RequestsPerUnit: 3, Unit: 3, Shared: []string{"path*"}}
	for _, tt := range []struct {
		key, value string
		want       *Limit
	}{
		{"team", "a_x", team},
		{"team_a", "x", team}, // team_a_x
		{"team_a", "", team},  // team_a_
		{"team", "b_x", nil},
		{"path", "/x", path},   // path_/x
		{"pathway", "", path},  // pathway_
		{"pat", "h", nil},      // pat_h
		{"other", "path", nil}, // other_path
	} {
		if got := c.Match("d", []Entry{{tt.key, tt.value}}); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s=%q: got %+v, want %+v", tt.key, tt.value, got, tt.want)
		}
	}
}

// Parse reads any file without panicking (a reload on SIGHUP runs it on
// whatever the directory holds), and the same file the same way every
// time: the same configuration, or the same error.
func FuzzParse(f *testing.F) {
	f.Add([]byte(exampleConfig))
	f.Add([]byte("domain: 0123\ndescriptors:\n  - key: a\n    value: 007\n    metadata: {on: {1: [1.5, x], '1': y}}\n" +
		"    rate_limit: {unit: second, requests_per_unit: 1_000, replaces: [{name: yes}]}\n    descriptors: [{key: b*, share_threshold: true}]"))
	f.Add([]byte("{X,A}"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    2: x\n    1: 1.5\n    0.5: y"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c1, err1 := Parse(map[string][]byte{"f.yaml": data}, false)
		c2, err2 := Parse(map[string][]byte{"f.yaml": data}, false)
		if fmt.Sprint(err1) != fmt.Sprint(err2) || !reflect.DeepEqual(c1, c2) {
			t.Fatalf("read twice: %v / %v, the same configuration: %t", err1, err2, reflect.DeepEqual(c1, c2))
		}
	})
}

// parseOne is the configuration of the one file yaml, which must load.
func parseOne(t *testing.T, yaml string) *Config {
	t.Helper()
	c, err := Parse(map[string][]byte{"f.yaml": []byte(yaml)}, false)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// entries is a request descriptor of key, value pairs.
func entries(kv ...string) []Entry {
	var out []Entry
	for i := 0; i < len(kv); i += 2 {
		out = append(out, Entry{kv[i], kv[i+1]})
	}
	return out
}

// matchCase is a request descriptor and the limit it should match.
type matchCase struct {
	name    string
	domain  string
	entries []Entry
	want    *Limit
}

// checkMatches matches each case's descriptor in c.
func checkMatches(t *testing.T, c *Config, cases []matchCase) {
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			if got := c.Match(tt.domain, tt.entries); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// A Kubernetes ConfigMap mounted as a directory holds each key as a link
// through ..data to a timestamped directory, and an update swaps ..data
// for a new one: ReadFiles reads the keys' files through the links, the
// new contents after the swap, and nothing of the directories and links
// the kubelet keeps beside them.
func TestReadFiles_ConfigMapLayout(t *testing.T) {
	dir := t.TempDir()
	version := func(name, data string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "ratelimit.yaml"), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		// As the kubelet swaps it: a new link renamed over ..data.
		if err := os.Symlink(name, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..2026_11_29_05_00_00.1", "domain: a")
	if err := os.Symlink("..data/ratelimit.yaml", filepath.Join(dir, "ratelimit.yaml")); err != nil {
		t.Fatal(err)
	}
	want := func(data string) {
		t.Helper()
		files, err := ReadFiles(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(files) != 1 || string(files[filepath.Join(dir, "ratelimit.yaml")]) != data {
			t.Fatalf("files %q, want ratelimit.yaml alone with %q", files, data)
		}
	}
	want("domain: a")
	version("..2026_11_29_05_01_00.2", "domain: b")
	want("domain: b")
}

// load is the configuration of path's files (ReadFiles, then Parse).
func load(path string, merge bool) (*Config, error) {
	files, err := ReadFiles(path)
	if err != nil {
		return nil, err
	}
	return Parse(files, merge)
}
