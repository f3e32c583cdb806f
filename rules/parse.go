package rules

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// MaxConfigSize bounds the configuration a host may hand the plugin.
const MaxConfigSize = 1 << 20

// ConfigError is a configuration error at a field path such as rules[2].limit.
type ConfigError struct {
	Path string
	Err  error
}

func (e *ConfigError) Error() string {
	if e.Path == "" {
		return e.Err.Error()
	}
	return e.Path + ": " + e.Err.Error()
}

func (e *ConfigError) Unwrap() error { return e.Err }

// ParseConfig parses and validates a plugin configuration (docs/config.md).
// It either returns a complete Config or an error naming the first bad
// field; unknown fields are errors, so a typo never silently disables a limit.
func ParseConfig(data []byte) (*Config, error) { return ParseConfigEnv(data, nil) }

// ParseConfigEnv is ParseConfig for a plugin VM with environment variables:
// lookupEnv (os.LookupEnv, syscall.Getenv or nil for none) supplies the
// category defaults RATE_LIMIT_<NAME>_REQUESTS and _WINDOW, which fields set
// in data override. A bad value is an error naming the variable.
func ParseConfigEnv(data []byte, lookupEnv func(string) (string, bool)) (*Config, error) {
	if len(data) > MaxConfigSize {
		return nil, &ConfigError{Err: fmt.Errorf("configuration is %d bytes, more than %d", len(data), MaxConfigSize)}
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil, &ConfigError{Err: errors.New("configuration is empty")}
	}
	if err := jsonText(data, "configuration"); err != nil {
		return nil, err
	}
	root := gjson.ParseBytes(data)
	p := parser{lookupEnv: lookupEnv}
	p.envDefaults()
	if p.err != nil {
		return nil, p.err
	}
	c := p.config(root)
	if p.err != nil {
		return nil, p.err
	}
	return c, nil
}

// jsonText refuses data that is not JSON text, which is UTF-8: a string
// with other bytes would not read back as written once a store or a
// proxy encodes it (a path pattern would come back with U+FFFD in it).
func jsonText(data []byte, what string) error {
	if !gjson.ValidBytes(data) {
		return &ConfigError{Err: fmt.Errorf("%s is not valid JSON", what)}
	}
	if !utf8.Valid(data) {
		return &ConfigError{Err: fmt.Errorf("%s is not UTF-8", what)}
	}
	return nil
}

// parser keeps the first error; later calls become no-ops so that each
// parse step reads straight through without checking after every field.
type parser struct {
	err       error
	lookupEnv func(string) (string, bool)
	envSpecs  map[string]LimitSpec // category defaults after the environment
}

func (p *parser) fail(path, format string, args ...any) {
	if p.err == nil {
		p.err = &ConfigError{Path: path, Err: fmt.Errorf(format, args...)}
	}
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func index(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// object checks v is an object with only the given fields, each at most
// once: JSON readers disagree on which of two values of a field counts
// (this parser would read the first, most tools the last).
func (p *parser) object(v gjson.Result, path string, fields ...string) bool {
	if p.err != nil {
		return false
	}
	if !v.IsObject() {
		p.fail(path, "must be an object")
		return false
	}
	seen := make([]bool, len(fields))
	v.ForEach(func(k, _ gjson.Result) bool {
		switch i := slices.Index(fields, k.Str); {
		case i < 0:
			p.fail(join(path, k.Str), "unknown field (known: %s)", strings.Join(fields, ", "))
		case seen[i]:
			p.fail(join(path, k.Str), "given twice")
		default:
			seen[i] = true
			return true
		}
		return false
	})
	return p.err == nil
}

func (p *parser) str(v gjson.Result, path, def string) string {
	if !v.Exists() {
		return def
	}
	if v.Type != gjson.String {
		p.fail(path, "must be a string")
		return def
	}
	return v.Str
}

func (p *parser) boolean(v gjson.Result, path string, def bool) bool {
	if !v.Exists() {
		return def
	}
	if v.Type != gjson.True && v.Type != gjson.False {
		p.fail(path, "must be true or false")
		return def
	}
	return v.Type == gjson.True
}

func (p *parser) integer(v gjson.Result, path string, def, lo, hi int64) int64 {
	if !v.Exists() {
		return def
	}
	n, ok := exactInt(v)
	if !ok {
		p.fail(path, "must be an integer")
		return def
	}
	if n < lo || n > hi {
		p.fail(path, "must be from %d to %d, got %d", lo, hi, n)
		return def
	}
	return n
}

func (p *parser) duration(v gjson.Result, path string, def, lo, hi int64) int64 {
	if !v.Exists() {
		return def
	}
	if v.Type != gjson.String {
		p.fail(path, `must be a duration string such as "30s", "1m", "1h"`)
		return def
	}
	ms, err := ParseDurationMS(v.Str)
	if err != nil {
		p.fail(path, "%v", err)
		return def
	}
	if ms < lo || ms > hi {
		p.fail(path, "must be from %s to %s, got %s", FormatDurationMS(lo), FormatDurationMS(hi), v.Str)
		return def
	}
	return ms
}

// window reads a limit's window (ParseWindow): its length, and its
// calendar months (0: a duration).
func (p *parser) window(v gjson.Result, path string) (ms, months int64) {
	if v.Type != gjson.String {
		p.fail(path, `must be a duration string such as "30s", "1h", or calendar months such as "1mo"`)
		return 0, 0
	}
	ms, months, err := ParseWindow(v.Str)
	switch {
	case err != nil:
		p.fail(path, "%v", err)
		return 0, 0
	case months == 0 && (ms < 1 || ms > MaxWindowMS):
		p.fail(path, "must be from %s to %s, got %s", FormatDurationMS(1), FormatDurationMS(MaxWindowMS), v.Str)
		return 0, 0
	}
	return ms, months
}

func (p *parser) strings(v gjson.Result, path string, each func(s, path string) string) []string {
	if !v.Exists() {
		return nil
	}
	if !v.IsArray() {
		p.fail(path, "must be an array of strings")
		return nil
	}
	var out []string
	for i, e := range v.Array() {
		ep := index(path, i)
		if e.Type != gjson.String {
			p.fail(ep, "must be a string")
			return nil
		}
		s := e.Str
		if each != nil {
			s = each(s, ep)
		}
		out = append(out, s)
	}
	return out
}

func (p *parser) config(root gjson.Result) *Config {
	c := &Config{}
	if !p.object(root, "", "enabled", "failure_mode", "bridge", "identity", "tiers", "categories",
		"rules", "rules_from", "exemptions", "penalty", "headers", "deny", "local_cache", "throttle") {
		return nil
	}
	c.Enabled = p.boolean(root.Get("enabled"), "enabled", true)
	switch fm := p.str(root.Get("failure_mode"), "failure_mode", "fail_open"); fm {
	case "fail_open":
		c.FailureMode = FailOpen
	case "fail_closed":
		c.FailureMode = FailClosed
	default:
		p.fail("failure_mode", `must be "fail_open" or "fail_closed", got %q`, fm)
	}
	c.Bridge = p.bridge(root.Get("bridge"), "bridge")
	c.RulesFrom = p.rulesFrom(root.Get("rules_from"), "rules_from", c.Bridge)
	c.Identity = p.identity(root.Get("identity"), "identity")
	c.Penalty = p.penalty(root.Get("penalty"), "penalty", nil)
	var defPenalty *Penalty
	if c.Penalty.Enabled {
		defPenalty = &c.Penalty
	}
	c.Tiers = p.tiers(root.Get("tiers"), "tiers", defPenalty)
	c.Categories = p.categories(root.Get("categories"), "categories", defPenalty)
	c.Rules = p.rules(root.Get("rules"), "rules", defPenalty)
	c.Exemptions = p.exemptions(root.Get("exemptions"), "exemptions")
	c.Headers = p.headers(root.Get("headers"), "headers")
	c.Deny = p.deny(root.Get("deny"), "deny")
	c.LocalCache = p.localCache(root.Get("local_cache"), "local_cache")
	c.Throttle = p.throttleConfig(root.Get("throttle"), "throttle")
	if p.err != nil {
		return nil
	}
	p.checkNames(c)
	// Every limit that can apply to one request travels in one check.
	if n := len(c.Rules) + len(c.Categories) + 1; n > MaxLimitsPerCheck {
		p.fail("rules", "%d rules and categories: at most %d together, since all that match one request are checked in one call", n-1, MaxLimitsPerCheck-1)
	}
	peers := 0
	for i, s := range c.Identity.Sources {
		if s.Kind == SourcePeerCertificate {
			if peers++; peers > 1 {
				p.fail(index("identity.sources", i), "a second source of type peer_certificate: a request has one certificate, and one source reads it")
			}
		}
	}
	if c.Tiers.Claim != "" && !hasJWTSource(c.Identity.Sources) {
		p.fail("tiers.claim", "needs an identity source of type jwt or jwt_payload to read the claim from")
	}
	return c
}

func hasJWTSource(srcs []IdentitySource) bool {
	for _, s := range srcs {
		if s.Kind == SourceJWT || s.Kind == SourceJWTPayload {
			return true
		}
	}
	return false
}

// checkNames makes sure no two limits share a counter name.
func (p *parser) checkNames(c *Config) {
	seen := map[string]string{}
	for i, r := range c.Rules {
		seen[r.Name] = index("rules", i)
	}
	for i, cat := range c.Categories {
		if prev, dup := seen[cat.Name]; dup {
			p.fail(index("categories", i)+".name", "%q is already the name of %s", cat.Name, prev)
			return
		}
		seen[cat.Name] = index("categories", i)
	}
}

func (p *parser) bridge(v gjson.Result, path string) Bridge {
	b := Bridge{Cluster: "sluice_bridge", Authority: "sluice-bridge", Path: "/v1/rate-limit/check", TimeoutMS: 200}
	if !v.Exists() {
		return b
	}
	if !p.object(v, path, "cluster", "authority", "path", "timeout", "token") {
		return b
	}
	p.callTarget(v, path, &b.Cluster, &b.Authority, &b.Path)
	b.TimeoutMS = uint32(p.duration(v.Get("timeout"), join(path, "timeout"), int64(b.TimeoutMS), 1, 60_000))
	b.Token = p.str(v.Get("token"), join(path, "token"), "")
	return b
}

// callTarget reads where a call-out goes: cluster, authority and path,
// each keeping its default when absent.
func (p *parser) callTarget(v gjson.Result, path string, cluster, authority, callPath *string) {
	*cluster = p.str(v.Get("cluster"), join(path, "cluster"), *cluster)
	if *cluster == "" {
		p.fail(join(path, "cluster"), "must not be empty")
	}
	*authority = p.str(v.Get("authority"), join(path, "authority"), *authority)
	*callPath = p.str(v.Get("path"), join(path, "path"), *callPath)
	if !strings.HasPrefix(*callPath, "/") {
		p.fail(join(path, "path"), `must start with "/"`)
	}
}

func (p *parser) throttleConfig(v gjson.Result, path string) ThrottleConfig {
	c := ThrottleConfig{MaxWaiting: DefaultMaxWaiting}
	if !v.Exists() || !p.object(v, path, "max_waiting") {
		return c
	}
	c.MaxWaiting = p.integer(v.Get("max_waiting"), join(path, "max_waiting"), c.MaxWaiting, 1, MaxMaxWaitingPerVM)
	return c
}

func (p *parser) localCache(v gjson.Result, path string) LocalCacheConfig {
	c := LocalCacheConfig{Enabled: true, MaxEntries: 10_000, MaxHoldMS: 60_000}
	if !v.Exists() || !p.object(v, path, "enabled", "max_entries", "max_hold") {
		return c
	}
	c.Enabled = p.boolean(v.Get("enabled"), join(path, "enabled"), true)
	c.MaxEntries = p.integer(v.Get("max_entries"), join(path, "max_entries"), c.MaxEntries, 1, 1_000_000)
	c.MaxHoldMS = p.duration(v.Get("max_hold"), join(path, "max_hold"), c.MaxHoldMS, 1000, MaxWindowMS)
	return c
}
