package redisbridge

import (
	"crypto/tls"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/internal/filewatch"
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
	seen              filewatch.Seen
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
	files, err := filewatch.Read(c.certFile, c.keyFile)
	if !c.seen.Note(files, err) && !always {
		return false, nil
	}
	var pair tls.Certificate
	if err == nil {
		pair, err = tls.X509KeyPair(files[c.certFile], files[c.keyFile])
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
