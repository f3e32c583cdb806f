package rules

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseIPPrefix(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr string
	}{
		{in: "10.0.0.0/8", want: "10.0.0.0/8"},
		{in: "10.1.2.3/8", want: "10.0.0.0/8"},
		{in: "2001:db8::/32", want: "2001:db8::/32"},
		{in: "2001:DB8:ffff::/32", want: "2001:db8::/32"},
		{in: "1.2.3.4", want: "1.2.3.4/32"},
		{in: " 1.2.3.4 ", want: "1.2.3.4/32"},
		{in: "::1", want: "::1/128"},
		{in: "::ffff:1.2.3.4", want: "1.2.3.4/32"},
		{in: "::ffff:10.0.0.0/104", want: "10.0.0.0/8"},
		{in: "::ffff:0:0/96", want: "0.0.0.0/0"},
		{in: "0.0.0.0/0", want: "0.0.0.0/0"},
		{in: "", wantErr: "empty"},
		{in: "fe80::1%eth0", wantErr: "zone"},
		{in: "10.0.0.0/33", wantErr: "prefix length"},
		{in: "2001:db8::/129", wantErr: "prefix length"},
		{in: "10.0.0.0/", wantErr: "prefix length"},
		{in: "10.0.0/8", wantErr: "not an IP"},
		{in: "localhost", wantErr: "not an IP"},
		{in: "1.2.3.4:80", wantErr: "not an IP"},
		{in: "010.0.0.1", wantErr: "not an IP"},
	}
	for _, tt := range tests {
		got, err := ParseIPPrefix(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseIPPrefix(%q) = %v, %v; want an error containing %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got.String() != tt.want {
			t.Errorf("ParseIPPrefix(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}

func TestParseSourceAddress(t *testing.T) {
	tests := []struct {
		in   string
		want string // "" = not ok
	}{
		{"1.2.3.4:5678", "1.2.3.4"},
		{"1.2.3.4", "1.2.3.4"},
		{"[2001:db8::1]:443", "2001:db8::1"},
		{"[2001:DB8:0:0::1]", "2001:db8::1"},
		{"2001:db8::1", "2001:db8::1"},
		{"[::ffff:1.2.3.4]:80", "1.2.3.4"},
		{"::ffff:1.2.3.4", "1.2.3.4"},
		{"[fe80::1%eth0]:80", "fe80::1"},
		{"fe80::1%eth0", "fe80::1"},
		{"", ""},
		{"1.2.3.4:", ""},
		{"1.2.3.4:65536", ""},
		{"1.2.3.4:80x", ""},
		{"[1.2.3.4]:80", ""},
		{"[2001:db8::1]x", ""},
		{"[2001:db8::1", ""},
		{"1.2.3.256", ""},
		{"01.2.3.4", ""},
		{"unknown", ""},
		{"envoy://internal", ""},
		{"fe80::1%", ""},
	}
	for _, tt := range tests {
		got, ok := ParseSourceAddress(tt.in)
		if tt.want == "" {
			if ok || got.IsValid() {
				t.Errorf("ParseSourceAddress(%q) = %v, %v; want not ok", tt.in, got, ok)
			}
			continue
		}
		if !ok || got.String() != tt.want {
			t.Errorf("ParseSourceAddress(%q) = %v, %v; want %s", tt.in, got, ok, tt.want)
		}
	}
}

func mustPrefixes(t testing.TB, ss ...string) []netip.Prefix {
	t.Helper()
	var out []netip.Prefix
	for _, s := range ss {
		p, err := ParseIPPrefix(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

func TestClientIP(t *testing.T) {
	trusted := mustPrefixes(t, "10.0.0.0/8", "2001:db8:ffff::/48")
	none := ClientIPConfig{}
	depth1 := ClientIPConfig{TrustedProxyDepth: 1}
	depth2 := ClientIPConfig{TrustedProxyDepth: 2}
	depth2RealIP := ClientIPConfig{TrustedProxyDepth: 2, UseXRealIP: true}
	cidr := ClientIPConfig{TrustedProxies: trusted}
	cidrRealIP := ClientIPConfig{TrustedProxies: trusted, UseXRealIP: true}
	// CIDR mode wins over a depth set alongside it.
	cidrAndDepth := ClientIPConfig{TrustedProxies: trusted, TrustedProxyDepth: 1}
	realIPOnly := ClientIPConfig{UseXRealIP: true}

	tests := []struct {
		name             string
		cfg              *ClientIPConfig
		xff, xri, source string
		want             string // "" = zero Addr
	}{
		// No trust configured: headers are ignored.
		{"none/peer", &none, "1.1.1.1", "2.2.2.2", "3.3.3.3:1234", "3.3.3.3"},
		{"none/no peer", &none, "1.1.1.1", "", "", ""},
		{"none/x-real-ip opt-in", &realIPOnly, "1.1.1.1", "2.2.2.2", "3.3.3.3:1", "2.2.2.2"},

		// Depth mode.
		{"depth1/last entry", &depth1, "1.1.1.1, 2.2.2.2", "", "10.0.0.1:1", "2.2.2.2"},
		{"depth2/second from right", &depth2, "9.9.9.9, 1.1.1.1, 2.2.2.2", "", "10.0.0.1:1", "1.1.1.1"},
		{"depth2/spoofed leftmost ignored", &depth2, "6.6.6.6, 7.7.7.7, 1.1.1.1, 2.2.2.2", "", "10.0.0.1:1", "1.1.1.1"},
		{"depth2/fewer entries: leftmost", &depth2, "1.1.1.1", "", "10.0.0.1:1", "1.1.1.1"},
		{"depth2/no header: peer", &depth2, "", "", "10.0.0.1:1", "10.0.0.1"},
		{"depth2/no header: x-real-ip", &depth2RealIP, "", "4.4.4.4", "10.0.0.1:1", "4.4.4.4"},
		{"depth2/invalid at position: x-real-ip", &depth2RealIP, "1.1.1.1, unknown, 2.2.2.2", "4.4.4.4", "10.0.0.1:1", "4.4.4.4"},
		{"depth2/invalid at position: peer", &depth2, "1.1.1.1, unknown, 2.2.2.2", "garbage", "10.0.0.1:1", "10.0.0.1"},
		{"depth2/invalid x-real-ip: peer", &depth2RealIP, "", "not-an-ip", "10.0.0.1:1", "10.0.0.1"},
		{"depth2/invalid elsewhere is fine", &depth2, "garbage!!, 1.1.1.1, 2.2.2.2", "", "", "1.1.1.1"},
		{"depth2/empty entries skipped", &depth2, " ,1.1.1.1,, ,2.2.2.2 ,", "", "", "1.1.1.1"},
		{"depth2/spaces and tabs", &depth2, "\t1.1.1.1\t,\t2.2.2.2", "", "", "1.1.1.1"},
		{"depth2/ports", &depth2, "1.1.1.1:8080, 2.2.2.2:443", "", "", "1.1.1.1"},
		{"depth2/ipv6 bracketed", &depth2, "[2001:DB8::0:1]:443, 2.2.2.2", "", "", "2001:db8::1"},
		{"depth2/ipv6 bare", &depth2, "2001:db8::1, 2.2.2.2", "", "", "2001:db8::1"},
		{"depth2/ipv6 zone stripped", &depth2, "fe80::1%eth0, 2.2.2.2", "", "", "fe80::1"},
		{"depth2/4in6 unmapped", &depth2, "::ffff:1.1.1.1, 2.2.2.2", "", "", "1.1.1.1"},
		{"depth2/only empty entries", &depth2, " , ,", "", "5.5.5.5:1", "5.5.5.5"},
		{"depth1/unknown entry", &depth1, "unknown", "", "5.5.5.5:1", "5.5.5.5"},

		// CIDR mode.
		{"cidr/untrusted peer: peer, xff ignored", &cidr, "1.1.1.1", "", "8.8.8.8:1", "8.8.8.8"},
		{"cidr/untrusted peer: x-real-ip ignored", &cidrRealIP, "1.1.1.1", "4.4.4.4", "8.8.8.8:1", "8.8.8.8"},
		{"cidr/unknown peer: unknown", &cidrRealIP, "1.1.1.1", "4.4.4.4", "", ""},
		{"cidr/trusted peer: first untrusted from right", &cidr, "1.1.1.1, 2.2.2.2, 10.1.1.1, 10.2.2.2", "", "10.0.0.1:1", "2.2.2.2"},
		{"cidr/spoofed trusted-looking entry left of client", &cidr, "10.9.9.9, 2.2.2.2, 10.1.1.1", "", "10.0.0.1:1", "2.2.2.2"},
		{"cidr/ipv6 trusted hops", &cidr, "2001:db8::7, [2001:db8:ffff::1]:443, 10.0.0.2", "", "[2001:db8:ffff::9]:5", "2001:db8::7"},
		{"cidr/all trusted: leftmost", &cidr, "10.1.1.1, 10.2.2.2", "", "10.0.0.1:1", "10.1.1.1"},
		{"cidr/invalid stops the walk: peer", &cidr, "1.1.1.1, unknown, 10.1.1.1", "", "10.0.0.1:1", "10.0.0.1"},
		{"cidr/invalid stops the walk: x-real-ip", &cidrRealIP, "1.1.1.1, 1.2.3, 10.1.1.1", "4.4.4.4", "10.0.0.1:1", "4.4.4.4"},
		{"cidr/no header: peer", &cidr, "", "", "10.0.0.1:1", "10.0.0.1"},
		{"cidr/empty entries skipped", &cidr, "1.1.1.1, , 10.1.1.1,", "", "10.0.0.1:1", "1.1.1.1"},
		{"cidr/4in6 trusted peer", &cidr, "1.1.1.1", "", "[::ffff:10.0.0.1]:1", "1.1.1.1"},
		{"cidr/wins over depth", &cidrAndDepth, "1.1.1.1, 10.1.1.1, 10.2.2.2", "", "10.0.0.1:1", "1.1.1.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ClientIP(tt.cfg, tt.xff, tt.xri, tt.source)
			if tt.want == "" {
				if got.IsValid() {
					t.Fatalf("ClientIP = %v, want the zero Addr", got)
				}
				return
			}
			if got.String() != tt.want {
				t.Fatalf("ClientIP = %v, want %s", got, tt.want)
			}
		})
	}
}

// TestClientIP_hugeHeader feeds 64 KiB of entries: the walk must cover it
// without allocating. Linear time is tracked by BenchmarkClientIP.
func TestClientIP_hugeHeader(t *testing.T) {
	var sb strings.Builder
	for sb.Len() < 64<<10 {
		sb.WriteString("10.1.2.3, ")
	}
	xff := "198.51.100.1, " + sb.String()
	cfgs := []ClientIPConfig{
		{TrustedProxies: mustPrefixes(t, "10.0.0.0/8")},
		{TrustedProxyDepth: 1 << 20},
	}
	want := []string{"198.51.100.1", "198.51.100.1"} // all others trusted; depth beyond the header: leftmost
	for i := range cfgs {
		var got netip.Addr
		allocs := testing.AllocsPerRun(10, func() {
			got = ClientIP(&cfgs[i], xff, "", "10.0.0.1:9")
		})
		if got.String() != want[i] {
			t.Errorf("cfg %d: ClientIP = %v, want %s", i, got, want[i])
		}
		if allocs != 0 {
			t.Errorf("cfg %d: %v allocations, want 0", i, allocs)
		}
	}
}

func TestClientIP_noAllocOnGarbage(t *testing.T) {
	cfg := ClientIPConfig{TrustedProxies: mustPrefixes(t, "10.0.0.0/8")}
	inputs := []string{"1.2.3", "::1::", "zzzz", "[::1", "1.2.3.4:99999", "fe80::1%", "1:2:3:4:5:6:7:8:9", "::ffff:1.2.3.400"}
	for _, in := range inputs {
		allocs := testing.AllocsPerRun(10, func() {
			ClientIP(&cfg, in+", 10.1.1.1", in, "10.0.0.1:1")
		})
		if allocs != 0 {
			t.Errorf("%q: %v allocations, want 0", in, allocs)
		}
	}
}

func TestParseAddr_matchesNetip(t *testing.T) {
	for _, s := range []string{
		"0.0.0.0", "255.255.255.255", "1.2.3.4", "::", "::1", "1::", "1:2:3:4:5:6:7:8",
		"1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "1:2:3:4:5:6::8", "::ffff:1.2.3.4", "64:ff9b::1.2.3.4",
		"1:2:3:4:5:6:1.2.3.4", "fe80::1%eth0", "ABCD:ef01::", "0000:0000::0001",
		"", ".", ":", ":::", "1:::2", "1::2::3", "1:2:3:4:5:6:7:8:9", "1:2:3:4:5:6:7:8::", "::1:2:3:4:5:6:7:8",
		"12345::", "1.2.3.4.5", "1.2.3", "256.1.1.1", "01.1.1.1", "1..2.3", "1.2.3.4%eth0", "::1%",
		"%eth0", "::1.2.3", "::1.2.3.4.5", "1:2:3:4:5:6:7:1.2.3.4", "::ffff:01.2.3.4", "g::", "1:", ":1",
		"1.2.3.4:", "::%", "1%::", "::1%%", "::1.2.3.4%z",
	} {
		checkParseAddr(t, s)
	}
}

// checkParseAddr holds parseAddr to net/netip's reading of s, zone dropped.
func checkParseAddr(t *testing.T, s string) {
	t.Helper()
	want, err := netip.ParseAddr(s)
	got, ok := parseAddr(s)
	if ok != (err == nil) {
		t.Fatalf("parseAddr(%q) ok = %v, netip says %v", s, ok, err)
	}
	if ok && got != want.WithZone("") {
		t.Fatalf("parseAddr(%q) = %v, netip says %v", s, got, want)
	}
}

func FuzzParseAddr(f *testing.F) {
	for _, s := range []string{"1.2.3.4", "::ffff:1.2.3.4", "2001:db8::1", "fe80::1%eth0", "1:2:3:4:5:6:7:8", "::", "1.2.3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkParseAddr(t, s) })
}

// refEntries lists every address a ClientIP result may be, read with
// net/netip from the raw header values.
func refEntries(xff, xri, source string) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	var add func(s string)
	add = func(s string) {
		// A header's entry without its spaces, or, where a zone ends in
		// one ("::% "), with them.
		if t := strings.Trim(s, " \t"); t != s {
			add(t)
		}
		if ap, err := netip.ParseAddrPort(s); err == nil {
			out[ap.Addr().WithZone("").Unmap()] = true
			return
		}
		// An address alone, or in brackets ("::%]" is :: in zone "]").
		if inner, ok := strings.CutPrefix(s, "["); ok && strings.HasSuffix(inner, "]") {
			s = strings.TrimSuffix(inner, "]")
		}
		if a, err := netip.ParseAddr(s); err == nil {
			out[a.WithZone("").Unmap()] = true
		}
	}
	for _, e := range strings.Split(xff, ",") {
		add(e)
	}
	add(xri)
	add(source)
	return out
}

func FuzzClientIP(f *testing.F) {
	f.Add("1.1.1.1, 10.0.0.1", "2.2.2.2", "10.0.0.2:80", 1, true, true)
	f.Add("[2001:db8::1]:443, unknown, , 10.0.0.1", "", "[2001:db8:ffff::1]:1", 3, false, true)
	f.Add("::ffff:1.2.3.4,fe80::1%eth0", "x", "1.2.3.4", 2, true, false)
	f.Add("", "", "", 0, false, false)
	trusted := mustPrefixes(f, "10.0.0.0/8", "2001:db8:ffff::/48", "1.2.3.4")
	f.Fuzz(func(t *testing.T, xff, xri, source string, depth int, cidr, realIP bool) {
		cfg := ClientIPConfig{TrustedProxyDepth: depth, UseXRealIP: realIP}
		if cidr {
			cfg.TrustedProxies = trusted
		}
		got := ClientIP(&cfg, xff, xri, source)
		if !got.IsValid() {
			return
		}
		if got.Zone() != "" || got.Is4In6() {
			t.Fatalf("ClientIP = %v: zone or mapped form left", got)
		}
		if !refEntries(xff, xri, source)[got] {
			t.Fatalf("ClientIP(%q, %q, %q) = %v, which is none of the inputs", xff, xri, source, got)
		}
		if cidr {
			// Only a trusted peer can make a header count.
			if peer, ok := ParseSourceAddress(source); !ok || (!inPrefixes(trusted, peer) && got != peer) {
				t.Fatalf("untrusted peer %q, yet the client is %v", source, got)
			}
		}
	})
}

func BenchmarkClientIP(b *testing.B) {
	trusted := mustPrefixes(b, "10.0.0.0/8", "172.16.0.0/12", "2001:db8:ffff::/48")
	var huge strings.Builder
	for huge.Len() < 64<<10 {
		huge.WriteString("10.1.2.3, ")
	}
	for _, bc := range []struct {
		name        string
		cfg         ClientIPConfig
		xff, source string
	}{
		{"depth", ClientIPConfig{TrustedProxyDepth: 2}, "203.0.113.7, 198.51.100.1, 10.0.0.5", "10.0.0.9:3345"},
		{"depth_ipv6", ClientIPConfig{TrustedProxyDepth: 1}, "[2001:db8::7]:51000", "10.0.0.9:3345"},
		{"cidr", ClientIPConfig{TrustedProxies: trusted}, "203.0.113.7, 10.1.1.1, 172.16.0.4", "10.0.0.9:3345"},
		{"cidr_untrusted_peer", ClientIPConfig{TrustedProxies: trusted}, "203.0.113.7", "198.51.100.9:3345"},
		{"cidr_64KiB", ClientIPConfig{TrustedProxies: trusted}, "203.0.113.7, " + huge.String(), "10.0.0.9:3345"},
		{"depth_64KiB_all", ClientIPConfig{TrustedProxyDepth: 1 << 20}, huge.String(), "10.0.0.9:3345"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.xff)))
			for b.Loop() {
				ClientIP(&bc.cfg, bc.xff, "", bc.source)
			}
		})
	}
}
