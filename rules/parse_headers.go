package rules

// Parsing of what the plugin answers with: response headers and the 429.

import "github.com/tidwall/gjson"

func (p *parser) headers(v gjson.Result, path string) HeaderConfig {
	h := HeaderConfig{Prefix: "X-RateLimit-", RetryAfter: true}
	if v.Exists() && p.object(v, path, "enabled", "prefix", "strategy", "draft", "retry_after") {
		h.Disabled = !p.boolean(v.Get("enabled"), join(path, "enabled"), true)
		h.Prefix = p.str(v.Get("prefix"), join(path, "prefix"), h.Prefix)
		for i := 0; i < len(h.Prefix); i++ {
			c := h.Prefix[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				p.fail(join(path, "prefix"), "%q is not a valid header name prefix", h.Prefix)
				break
			}
		}
		h.Strategy = p.boolean(v.Get("strategy"), join(path, "strategy"), false)
		h.Draft = p.boolean(v.Get("draft"), join(path, "draft"), false)
		h.RetryAfter = p.boolean(v.Get("retry_after"), join(path, "retry_after"), true)
	}
	h.compile()
	return h
}

func (p *parser) deny(v gjson.Result, path string) DenyConfig {
	d := DenyConfig{Status: 429, FailClosedStatus: 503}
	if !v.Exists() || !p.object(v, path, "status", "message", "fail_closed_status") {
		return d
	}
	d.Status = uint32(p.integer(v.Get("status"), join(path, "status"), 429, 400, 599))
	d.Message = p.str(v.Get("message"), join(path, "message"), "")
	if len(d.Message) > 1024 {
		p.fail(join(path, "message"), "must be at most 1024 bytes")
	}
	d.FailClosedStatus = uint32(p.integer(v.Get("fail_closed_status"), join(path, "fail_closed_status"), 503, 400, 599))
	return d
}
