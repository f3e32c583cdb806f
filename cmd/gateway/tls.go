package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync/atomic"
	"time"
)

// certificate is the gateway's serving certificate: the PEM chain and
// private key of --tls-cert and --tls-key, read at start and again on
// SIGHUP, so a renewed certificate is served without a restart. A pair
// that does not load leaves the one being served in place.
type certificate struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

// loadCertificate reads the pair, or says which files it could not use.
func loadCertificate(certFile, keyFile string) (*certificate, error) {
	c := &certificate{certFile: certFile, keyFile: keyFile}
	if err := c.reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// reload reads the pair again; on an error the running one stays.
func (c *certificate) reload() error {
	pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("--tls-cert %s, --tls-key %s: %w", c.certFile, c.keyFile, err)
	}
	c.cur.Store(&pair)
	return nil
}

// notAfter is when the served certificate expires, for the log.
func (c *certificate) notAfter() time.Time {
	if leaf := c.cur.Load().Leaf; leaf != nil {
		return leaf.NotAfter
	}
	return time.Time{}
}

// tlsConfig serves the current pair to every new connection. HTTP/2 and
// HTTP/1.1 are offered by ALPN (net/http adds them), as Envoy's listener
// with codec_type AUTO does; the minimum version is crypto/tls's, TLS 1.2,
// which is also Envoy's.
func (c *certificate) tlsConfig() *tls.Config {
	return &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return c.cur.Load(), nil
	}}
}

// loadCAs reads --upstream-tls-ca: PEM certificates to trust.
func loadCAs(file string) (*x509.CertPool, error) {
	pemBytes, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--upstream-tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("--upstream-tls-ca: no PEM certificate in %s", file)
	}
	return pool, nil
}
