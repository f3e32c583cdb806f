package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/tlsfiles/tlsfilestest"
)

// A server that requires clients takes a client whose certificate the CAs
// of the file issued for client use, and that has one of the names asked
// for, DNS (in any case) or URI; it refuses one with no certificate, one
// another CA issued, one for servers only, and one with other names. A CA
// written over the file is the one that counts from the next handshake on.
// One that only verifies clients (VerifyClients) takes a client with no
// certificate, and refuses the others the same.
func TestCAs_RequireClients(t *testing.T) {
	dir := t.TempDir()
	ca, other := tlsfilestest.NewCA(t), tlsfilestest.NewCA(t)
	caFile := filepath.Join(dir, "clients.pem")
	if _, err := LoadCAs("--tls-client-ca", caFile); err == nil || !strings.HasPrefix(err.Error(), "--tls-client-ca: ") {
		t.Fatalf("missing file: %v", err)
	}
	ca.WriteCert(t, caFile)
	cas, err := LoadCAs("--tls-client-ca", caFile)
	if err != nil {
		t.Fatal(err)
	}
	serverPair, err := Load(ca.Issue(t, dir, "server"))
	if err != nil {
		t.Fatal(err)
	}
	serve := func(verify func(*tls.Config, []string)) string {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
		cfg := Config(serverPair)
		verify(cfg, []string{"spiffe://cluster.local/ns/edge/sa/envoy", "envoy.internal"})
		// Not StartTLS, which would serve httptest's own certificate.
		srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
		srv.Listener = tls.NewListener(srv.Listener, cfg)
		srv.Start()
		t.Cleanup(srv.Close)
		return "https://" + srv.Listener.Addr().String()
	}
	serverURL, optionalURL := serve(cas.RequireClients), serve(cas.VerifyClients)

	spiffe, _ := url.Parse("spiffe://cluster.local/ns/edge/sa/envoy")
	otherID, _ := url.Parse("spiffe://cluster.local/ns/edge/sa/other")
	names := func(dns []string, uris ...*url.URL) func(*x509.Certificate) {
		return func(c *x509.Certificate) { c.DNSNames, c.URIs = dns, uris }
	}
	clients := map[string][]tls.Certificate{"none": nil}
	issue := func(name string, by *tlsfilestest.CA, edit func(*x509.Certificate)) {
		pair, err := tls.LoadX509KeyPair(by.IssueWith(t, dir, name, edit))
		if err != nil {
			t.Fatal(err)
		}
		clients[name] = []tls.Certificate{pair}
	}
	issue("dns", ca, names([]string{"ENVOY.internal"}))
	issue("uri", ca, names(nil, spiffe))
	issue("other-names", ca, names([]string{"envoy.example"}, otherID))
	issue("other-ca", other, names([]string{"envoy.internal"}))
	issue("server-only", ca, func(c *x509.Certificate) {
		c.DNSNames, c.ExtKeyUsage = []string{"envoy.internal"}, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	})
	getFrom := func(server, client string) error {
		t.Helper()
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool, Certificates: clients[client]}}
		defer tr.CloseIdleConnections()
		res, err := (&http.Client{Transport: tr}).Get(server)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		if b, _ := io.ReadAll(res.Body); string(b) != "ok" {
			t.Fatalf("%s: answer %q", client, b)
		}
		return nil
	}
	get := func(client string) error { t.Helper(); return getFrom(serverURL, client) }
	for _, tc := range []struct {
		client       string
		ok, optional bool // accepted when required, when verified only
	}{
		{"dns", true, true},
		{"uri", true, true},
		{"none", false, true},
		{"other-names", false, false},
		{"other-ca", false, false},
		{"server-only", false, false},
	} {
		if err := get(tc.client); (err == nil) != tc.ok {
			t.Errorf("client %s: %v, want accepted %t", tc.client, err, tc.ok)
		}
		if err := getFrom(optionalURL, tc.client); (err == nil) != tc.optional {
			t.Errorf("client %s, certificates verified but not required: %v, want accepted %t", tc.client, err, tc.optional)
		}
	}

	// A client that keeps its sessions, as Envoy does: one resumed after
	// the rotation below must be refused too.
	sessions := &tls.Config{RootCAs: ca.Pool, Certificates: clients["dns"], ClientSessionCache: tls.NewLRUClientSessionCache(4)}
	resumed := func() (bool, error) {
		tr := &http.Transport{TLSClientConfig: sessions}
		defer tr.CloseIdleConnections()
		res, err := (&http.Client{Transport: tr}).Get(serverURL)
		if err != nil {
			return false, err
		}
		defer res.Body.Close()
		io.ReadAll(res.Body)
		return res.TLS.DidResume, nil
	}
	for i := range 2 {
		if did, err := resumed(); err != nil || did != (i == 1) {
			t.Fatalf("connection %d of a client keeping sessions: resumed %t, %v", i, did, err)
		}
	}

	other.WriteCert(t, caFile)
	if read, err := cas.Reload(false); !read || err != nil {
		t.Fatalf("a changed file: read %t, %v", read, err)
	}
	if err := get("dns"); err == nil {
		t.Error("the first CA's client after its CA was replaced: accepted")
	}
	if did, err := resumed(); err == nil {
		t.Errorf("the first CA's client resuming a session after its CA was replaced: accepted (resumed %t)", did)
	}
	if err := get("other-ca"); err != nil {
		t.Errorf("the new CA's client: %v", err)
	}
	if err := os.WriteFile(caFile, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := cas.Reload(false); err == nil || !strings.Contains(err.Error(), "--tls-client-ca: no PEM certificate in "+caFile) {
		t.Fatalf("a file with no certificate: %v", err)
	}
	if err := get("other-ca"); err != nil {
		t.Errorf("after a refused file, the CAs in use: %v", err)
	}
}
