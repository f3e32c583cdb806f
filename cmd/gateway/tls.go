package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
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

// trustedCAs are the CA certificates of --upstream-tls-ca, which verify
// https upstreams and call-out clusters: read at start and again on
// SIGHUP, so a private CA can be rotated without a restart. Certificates
// that do not load leave the ones in use in place.
type trustedCAs struct {
	file string
	cur  atomic.Pointer[x509.CertPool]
}

// loadTrustedCAs reads file, or says why it could not use it.
func loadTrustedCAs(file string) (*trustedCAs, error) {
	c := &trustedCAs{file: file}
	if err := c.reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// reload reads the file again; on an error the CAs in use stay.
func (c *trustedCAs) reload() error {
	pemBytes, err := os.ReadFile(c.file)
	if err != nil {
		return fmt.Errorf("--upstream-tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return fmt.Errorf("--upstream-tls-ca: no PEM certificate in %s", c.file)
	}
	c.cur.Store(pool)
	return nil
}

// clientConfig verifies each new connection's certificate chain and name
// against the CAs read last. crypto/tls keeps a config's RootCAs for the
// life of the transports that cloned it, so the check is done here, as
// crypto/tls's own example of custom verification does it
// (Config.VerifyConnection): InsecureSkipVerify only turns off the
// built-in check this one replaces, which makes the same checks
// (x509.Certificate.Verify: chain, validity, server use, and the name
// the connection was made for). Connections already open are kept. Nil
// without --upstream-tls-ca (c is nil): the system's roots.
func (c *trustedCAs) clientConfig() *tls.Config {
	if c == nil {
		return nil
	}
	return &tls.Config{
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: the server sent no certificate")
			}
			opts := x509.VerifyOptions{Roots: c.cur.Load(), DNSName: cs.ServerName, Intermediates: x509.NewCertPool()}
			for _, cert := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(cert)
			}
			_, err := cs.PeerCertificates[0].Verify(opts)
			return err
		},
	}
}
