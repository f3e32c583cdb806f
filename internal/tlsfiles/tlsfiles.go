// Package tlsfiles serves a TLS certificate and key from PEM files that
// are read again while the process runs (on SIGHUP, and when they change),
// so a renewed certificate (cert-manager's, say) is served from the next
// handshake without a restart. A pair that does not load leaves the one
// served in place.
package tlsfiles

import (
	"crypto/tls"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/filewatch"
)

// Pair is a certificate chain and its key, from files.
type Pair struct {
	CertFile, KeyFile string
	cur               atomic.Pointer[tls.Certificate]
	mu                sync.Mutex
	seen              filewatch.Seen
}

// Load reads the pair, or says which files it could not use.
func Load(certFile, keyFile string) (*Pair, error) {
	p := &Pair{CertFile: certFile, KeyFile: keyFile}
	if _, err := p.Reload(true); err != nil {
		return nil, err
	}
	return p, nil
}

// Reload reads the files again; unless always, only when they changed
// since they were last read (read says whether it did). On an error the
// pair served stays; its text names the flags --tls-cert and --tls-key.
func (p *Pair) Reload(always bool) (read bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	files, err := filewatch.Read(p.CertFile, p.KeyFile)
	if !p.seen.Note(files, err) && !always {
		return false, nil
	}
	var pair tls.Certificate
	if err == nil {
		pair, err = tls.X509KeyPair(files[p.CertFile], files[p.KeyFile])
	}
	if err != nil {
		return true, fmt.Errorf("--tls-cert %s, --tls-key %s: %w", p.CertFile, p.KeyFile, err)
	}
	p.cur.Store(&pair)
	return true, nil
}

// Config serves the current pairs to every new connection: the first
// pair whose certificate the client supports, its name (SNI) included,
// as an Envoy listener picks a filter chain's certificate by server name;
// the first pair when none is.
func Config(pairs ...*Pair) *tls.Config {
	return &tls.Config{GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		if len(pairs) > 1 {
			for _, p := range pairs {
				if c := p.cur.Load(); hello.SupportsCertificate(c) == nil {
					return c, nil
				}
			}
		}
		return pairs[0].cur.Load(), nil
	}}
}

// NotAfter is when the served certificate expires, for logs.
func (p *Pair) NotAfter() time.Time {
	if leaf := p.cur.Load().Leaf; leaf != nil {
		return leaf.NotAfter
	}
	return time.Time{}
}
