package rules

import (
	"strings"
	"testing"
)

func TestValidHostPattern(t *testing.T) {
	tests := []struct {
		in      string
		wantErr string
	}{
		{"api.example.com", ""},
		{"localhost", ""},
		{"*.example.com", ""},
		{"*.com", ""},
		{"my_host-1.example.com", ""},
		{"10.0.0.1", ""},
		{"[2001:db8::1]", ""},
		{"[::1]", ""},
		{"", "empty"},
		{strings.Repeat("a.", 127) + "ab", "longer than 253"},
		{"API.example.com", "lower-case"},
		{"api.example.com:8080", "port"},
		{"[::1]:8080", "port"},
		{"[2001:DB8::1]", "IPv6"},
		{"[2001:db8:0::1]", "IPv6"},
		{"[1.2.3.4]", "IPv6"},
		{"[fe80::1%eth0]", "IPv6"},
		{"*", `"*" only`},
		{"*.", "empty label"},
		{"api.*.com", `"*" only`},
		{"*api.example.com", `"*" only`},
		{"*.*.example.com", `"*" only`},
		{"api..example.com", "empty label"},
		{".example.com", "empty label"},
		{"example.com.", "empty label"},
		{strings.Repeat("a", 64) + ".com", "longer than 63"},
		{"exa mple.com", "a-z, 0-9"},
		{"exämple.com", "a-z, 0-9"},
		{"example.com/", "a-z, 0-9"},
	}
	for _, tt := range tests {
		err := ValidHostPattern(tt.in)
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("ValidHostPattern(%q): %v", tt.in, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("ValidHostPattern(%q) = %v, want an error containing %q", tt.in, err, tt.wantErr)
		}
	}
}

func TestMatchHost(t *testing.T) {
	tests := []struct {
		pattern, host string
		want          bool
	}{
		{"api.example.com", "api.example.com", true},
		{"api.example.com", "API.Example.COM", true},
		{"api.example.com", "api.example.com:8080", true},
		{"api.example.com", "api.example.com.", true},
		{"api.example.com", "api.example.com.:443", true},
		{"api.example.com", "api.example.co", false},
		{"api.example.com", "xapi.example.com", false},
		{"api.example.com", "api.example.com.evil.org", false},
		{"api.example.com", "", false},
		{"*.example.com", "a.example.com", true},
		{"*.example.com", "A.B.EXAMPLE.com:8443", true},
		{"*.example.com", "example.com", false},
		{"*.example.com", ".example.com", false},
		{"*.example.com", "badexample.com", false},
		{"*.example.com", "a.example.com.evil.org", false},
		{"*.example.com", "example.com:80", false},
		{"10.0.0.1", "10.0.0.1:8080", true},
		{"10.0.0.1", "10.0.0.10", false},
		{"[::1]", "[::1]:8080", true},
		{"[::1]", "[::1]", true},
		{"[2001:db8::1]", "[2001:DB8::1]:443", true},
		{"[2001:db8::1]", "[2001:db8::2]:443", false},
		{"[::1]", "::1", false},
		{"localhost", "localhost:", true},
	}
	for _, tt := range tests {
		if err := ValidHostPattern(tt.pattern); err != nil {
			t.Fatalf("test pattern %q is invalid: %v", tt.pattern, err)
		}
		if got := MatchHost(tt.pattern, tt.host); got != tt.want {
			t.Errorf("MatchHost(%q, %q) = %v, want %v", tt.pattern, tt.host, got, tt.want)
		}
	}
}

func BenchmarkMatchHost(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		MatchHost("*.example.com", "API.eu.Example.com:8443")
	}
}
