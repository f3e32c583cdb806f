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
		pair, err := p.Config().GetCertificate(&tls.ClientHelloInfo{})
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
