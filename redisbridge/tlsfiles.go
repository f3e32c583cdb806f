package redisbridge

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
)

// servingCert is the bridge's TLS pair (--tls-cert, --tls-key): read at
// start, and again on SIGHUP and when its files change (--watch), as
// envoyproxy/ratelimit follows its certificate's directory, so a renewed
// certificate is served from the next handshake without a restart. A pair
// that does not load leaves the one served in place.
type servingCert struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
	mu                sync.Mutex
	seen              [2][]byte // the files as last read
	seenErr           string    // or why they could not be
}

// loadServingCert reads the pair, or says why it could not use it.
func loadServingCert(certFile, keyFile string) (*servingCert, error) {
	c := &servingCert{certFile: certFile, keyFile: keyFile}
	if _, err := c.reload(true); err != nil {
		return nil, err
	}
	return c, nil
}

// reload reads the pair again; unless always, only when a file changed
// since it last looked (it reports whether it read them). On an error the
// pair served stays.
func (c *servingCert) reload(always bool) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var files [2][]byte
	var err error
	if files[0], err = os.ReadFile(c.certFile); err == nil {
		files[1], err = os.ReadFile(c.keyFile)
	}
	seenErr := ""
	if err != nil {
		seenErr = err.Error()
	}
	if !always && seenErr == c.seenErr && bytes.Equal(files[0], c.seen[0]) && bytes.Equal(files[1], c.seen[1]) {
		return false, nil
	}
	c.seen, c.seenErr = files, seenErr
	var pair tls.Certificate
	if err == nil {
		pair, err = tls.X509KeyPair(files[0], files[1])
	}
	if err != nil {
		return true, fmt.Errorf("--tls-cert %s, --tls-key %s: %w", c.certFile, c.keyFile, err)
	}
	c.cur.Store(&pair)
	return true, nil
}

// tlsConfig serves the current pair to every new connection.
func (c *servingCert) tlsConfig() *tls.Config {
	return &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return c.cur.Load(), nil
	}}
}
