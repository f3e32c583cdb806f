package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// CAs are CA certificates from a PEM file, read again while the process
// runs, as a Pair is, so a private CA can be rotated without a restart.
// Certificates that do not load leave the ones in use in place.
type CAs struct {
	Flag, File string // the flag that named the file, for errors
	cur        watched[x509.CertPool]
}

// LoadCAs reads file, named by flag, or says why it could not use it.
func LoadCAs(flag, file string) (*CAs, error) {
	c := &CAs{Flag: flag, File: file}
	if _, err := c.Reload(true); err != nil {
		return nil, err
	}
	return c, nil
}

// Reload reads the file again; unless always, only when it changed since
// it was last read (read says whether it did). On an error the CAs in use
// stay; its text names the flag.
func (c *CAs) Reload(always bool) (read bool, err error) {
	read, err = c.cur.reload(always, []string{c.File}, func(files map[string][]byte) (*x509.CertPool, error) {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(files[c.File]) {
			return nil, fmt.Errorf("no PEM certificate in %s", c.File)
		}
		return pool, nil
	})
	if err != nil {
		return read, fmt.Errorf("%s: %w", c.Flag, err)
	}
	return read, nil
}

// ClientConfig is a client's TLS configuration that verifies each new
// connection's certificate chain and name against the CAs read last.
// crypto/tls keeps a config's RootCAs for the life of the transports that
// cloned it, so the check is done here, as crypto/tls's own example of
// custom verification does it (Config.VerifyConnection):
// InsecureSkipVerify only turns off the built-in check this one replaces,
// which makes the same checks (x509.Certificate.Verify: chain, validity,
// server use, and the name the connection was made for). Connections
// already open are kept. Nil for a nil c: the system's roots.
func (c *CAs) ClientConfig() *tls.Config {
	if c == nil {
		return nil
	}
	return &tls.Config{
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: the server sent no certificate")
			}
			return c.verify(cs.PeerCertificates, x509.ExtKeyUsageServerAuth, cs.ServerName)
		},
	}
}

// RequireClients makes a server's cfg ask every client for a certificate,
// and refuse the handshake of one that sends none, or one whose chain does
// not lead to the CAs read last (for client use), or, when names are
// given, that names none of them among its DNS and URI subject
// alternative names (a SPIFFE id, say). crypto/tls verifies the chain, so
// a connection's VerifiedChains hold the client's certificate, which
// Middleware gives the plugin. The CAs read last apply from the next
// handshake on, as a Pair's certificate does: each handshake gets a copy
// of cfg with them. The copy offers cfg's NextProtos, by default h2 and
// http/1.1, what net/http's server offers (it adds them to its own copy
// of cfg, which handshakes then no longer use).
func (c *CAs) RequireClients(cfg *tls.Config, names []string) { c.verifyClients(cfg, names, true) }

// VerifyClients is RequireClients for a listener that also takes clients
// without a certificate, as an Envoy listener with a validation context
// but no require_client_certificate: a certificate presented must pass
// the same checks, and one not presented names no one.
func (c *CAs) VerifyClients(cfg *tls.Config, names []string) { c.verifyClients(cfg, names, false) }

func (c *CAs) verifyClients(cfg *tls.Config, names []string, require bool) {
	base := cfg.Clone()
	if len(base.NextProtos) == 0 {
		base.NextProtos = []string{"h2", "http/1.1"}
	}
	base.ClientAuth = tls.VerifyClientCertIfGiven
	if require {
		base.ClientAuth = tls.RequireAndVerifyClientCert
	}
	if len(names) > 0 {
		base.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.VerifiedChains) == 0 {
				return nil // none presented, and none required
			}
			if !namesOne(cs.VerifiedChains[0][0], names) {
				return fmt.Errorf("tls: the client's certificate names none of %s", strings.Join(names, ", "))
			}
			return nil
		}
	}
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		hs := base.Clone()
		hs.ClientCAs = c.cur.Load()
		return hs, nil
	}
}

// verify checks chain, the peer's certificate first, against the CAs read
// last, for use; dnsName, unless empty, must be one the first is for.
func (c *CAs) verify(chain []*x509.Certificate, use x509.ExtKeyUsage, dnsName string) error {
	opts := x509.VerifyOptions{Roots: c.cur.Load(), DNSName: dnsName, Intermediates: x509.NewCertPool(),
		KeyUsages: []x509.ExtKeyUsage{use}}
	for _, cert := range chain[1:] {
		opts.Intermediates.AddCert(cert)
	}
	_, err := chain[0].Verify(opts)
	return err
}

// namesOne tells whether cert has one of names as a DNS name (in any case)
// or a URI among its subject alternative names.
func namesOne(cert *x509.Certificate, names []string) bool {
	for _, n := range names {
		if slices.ContainsFunc(cert.DNSNames, func(d string) bool { return strings.EqualFold(d, n) }) ||
			slices.ContainsFunc(cert.URIs, func(u *url.URL) bool { return u.String() == n }) {
			return true
		}
	}
	return false
}
