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
	cur               watched[tls.Certificate]
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
	read, err = p.cur.reload(always, []string{p.CertFile, p.KeyFile}, func(files map[string][]byte) (*tls.Certificate, error) {
		pair, err := tls.X509KeyPair(files[p.CertFile], files[p.KeyFile])
		return &pair, err
	})
	if err != nil {
		return read, fmt.Errorf("--tls-cert %s, --tls-key %s: %w", p.CertFile, p.KeyFile, err)
	}
	return read, nil
}

// watched is a value made from files, made again when they change; what
// does not load leaves the value in use in place.
type watched[T any] struct {
	atomic.Pointer[T]
	mu   sync.Mutex
	seen filewatch.Seen
}

// reload reads files and makes the value of them with parse; unless
// always, only when they changed since they were last read (read says
// whether it did).
func (w *watched[T]) reload(always bool, files []string, parse func(map[string][]byte) (*T, error)) (read bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	contents, err := filewatch.Read(files...)
	if !w.seen.Note(contents, err) && !always {
		return false, nil
	}
	var v *T
	if err == nil {
		v, err = parse(contents)
	}
	if err != nil {
		return true, err
	}
	w.Store(v)
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
