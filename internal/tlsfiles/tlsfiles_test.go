package tlsfiles

import (
	"crypto/tls"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/tlsfiles/tlsfilestest"
)

// A pair that loads replaces the served one; one that does not (a key of
// another certificate, a missing file) is refused, names the flags, and
// leaves the served pair in place. Reload(false) reads only files that
// changed.
func TestPair_Reload(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if _, err := Load(certFile, keyFile); err == nil || !strings.Contains(err.Error(), "--tls-cert "+certFile+", --tls-key "+keyFile) {
		t.Fatalf("missing files: %v", err)
	}
	a := tlsfilestest.WriteSelfSigned(t, certFile, keyFile, "a")
	p, err := Load(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	get := func() string {
		pair, err := Config(p).GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		return pair.Leaf.Subject.CommonName
	}
	if got := get(); got != "a" || !p.NotAfter().Equal(a.NotAfter) {
		t.Fatalf("served %q until %v, want a until %v", got, p.NotAfter(), a.NotAfter)
	}
	if read, err := p.Reload(false); read || err != nil {
		t.Fatalf("unchanged files: read %t, %v", read, err)
	}
	tlsfilestest.WriteSelfSigned(t, certFile, keyFile, "b")
	if read, err := p.Reload(false); !read || err != nil || get() != "b" {
		t.Fatalf("changed files: read %t, %v, served %q, want b", read, err, get())
	}
	otherKey := filepath.Join(dir, "other-key.pem")
	tlsfilestest.WriteSelfSigned(t, filepath.Join(dir, "other.pem"), otherKey, "other")
	p.KeyFile = otherKey
	if _, err := p.Reload(true); err == nil || !strings.Contains(err.Error(), "--tls-key "+otherKey) || get() != "b" {
		t.Fatalf("a key of another certificate: %v, served %q, want b kept", err, get())
	}
	if read, err := p.Reload(false); read || err != nil {
		t.Fatalf("the same refused files again: read %t, %v (logged once)", read, err)
	}
}

// Of several pairs, a connection gets the first whose certificate is for
// the server name it asks for, and the first pair when none is or it asks
// for none.
func TestConfig_ServerName(t *testing.T) {
	dir := t.TempDir()
	var pairs []*Pair
	for _, name := range []string{"a.example.com", "b.example.com", "*.example.org"} {
		base := filepath.Join(dir, strings.TrimPrefix(name, "*."))
		tlsfilestest.WriteSelfSigned(t, base+".pem", base+".key", name, name)
		p, err := Load(base+".pem", base+".key")
		if err != nil {
			t.Fatal(err)
		}
		pairs = append(pairs, p)
	}
	cfg := Config(pairs...)
	for _, tt := range []struct{ serverName, want string }{
		{"b.example.com", "b.example.com"},
		{"a.example.com", "a.example.com"},
		{"www.example.org", "*.example.org"},
		{"other.example.net", "a.example.com"},
		{"", "a.example.com"},
	} {
		// What a client that speaks TLS 1.3 offers.
		hello := &tls.ClientHelloInfo{ServerName: tt.serverName, SupportedVersions: []uint16{tls.VersionTLS13},
			SignatureSchemes: []tls.SignatureScheme{tls.ECDSAWithP256AndSHA256}, SupportedCurves: []tls.CurveID{tls.CurveP256}}
		c, err := cfg.GetCertificate(hello)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Leaf.Subject.CommonName; got != tt.want {
			t.Errorf("server name %q: got %s, want %s", tt.serverName, got, tt.want)
		}
	}
}
