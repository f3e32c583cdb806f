package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/internal/filewatch"
)

// trustedCAs are the CA certificates of --upstream-tls-ca, which verify
// https upstreams and call-out clusters: read at start, and again on
// SIGHUP and when the file changes (--watch), so a private CA can be
// rotated without a restart. Certificates that do not load leave the
// ones in use in place.
type trustedCAs struct {
	file string
	cur  atomic.Pointer[x509.CertPool]
	mu   sync.Mutex
	seen filewatch.Seen
}

// loadTrustedCAs reads file, or says why it could not use it.
func loadTrustedCAs(file string) (*trustedCAs, error) {
	c := &trustedCAs{file: file}
	if _, err := c.reload(true); err != nil {
		return nil, err
	}
	return c, nil
}

// reload reads the file again; unless always, only when it changed since
// it was last read (read says whether it did). On an error the CAs in use
// stay.
func (c *trustedCAs) reload(always bool) (read bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	files, err := filewatch.Read(c.file)
	if !c.seen.Note(files, err) && !always {
		return false, nil
	}
	if err != nil {
		return true, fmt.Errorf("--upstream-tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(files[c.file]) {
		return true, fmt.Errorf("--upstream-tls-ca: no PEM certificate in %s", c.file)
	}
	c.cur.Store(pool)
	return true, nil
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
