// Package tlsfilestest writes certificates for tests of TLS served from
// files.
package tlsfilestest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// WriteSelfSigned writes a self-signed certificate for 127.0.0.1 and
// dnsNames, named name, and its key to certFile and keyFile as PEM, and
// returns it. It may serve, and be trusted as its own CA.
func WriteSelfSigned(t testing.TB, certFile, keyFile, name string, dnsNames ...string) *x509.Certificate {
	t.Helper()
	tmpl := template(name)
	tmpl.IPAddresses, tmpl.DNSNames = []net.IP{net.ParseIP("127.0.0.1")}, dnsNames
	tmpl.ExtKeyUsage, tmpl.BasicConstraintsValid, tmpl.IsCA = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, true, true
	return write(t, certFile, keyFile, tmpl, nil, nil)
}

// template is a certificate named name, valid from an hour ago for a day.
func template(name string) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
}

// write makes tmpl's certificate with a new key, signed by parent's key
// (nil: self-signed), writes both to certFile and keyFile as PEM, and
// returns the certificate.
func write(t testing.TB, certFile, keyFile string, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// CA is a throwaway certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	PEM  []byte // Cert
	Pool *x509.CertPool
}

// NewCA makes a CA.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := template("sluice test CA")
	tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign|x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), Pool: x509.NewCertPool()}
	ca.Pool.AddCert(cert)
	return ca
}

// WriteCert writes the CA's certificate to file as PEM.
func (ca *CA) WriteCert(t testing.TB, file string) {
	t.Helper()
	if err := os.WriteFile(file, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Issue writes a certificate for 127.0.0.1 and localhost, for servers and
// clients, signed by the CA, and its key, as PEM files in dir.
func (ca *CA) Issue(t testing.TB, dir, name string) (certFile, keyFile string) {
	t.Helper()
	return ca.IssueFor(t, dir, name, []net.IP{net.IPv4(127, 0, 0, 1)}, "localhost")
}

// IssueFor is Issue of a certificate for ips and dnsNames only.
func (ca *CA) IssueFor(t testing.TB, dir, name string, ips []net.IP, dnsNames ...string) (certFile, keyFile string) {
	t.Helper()
	return ca.IssueWith(t, dir, name, func(c *x509.Certificate) { c.IPAddresses, c.DNSNames = ips, dnsNames })
}

// IssueWith is Issue of a certificate edit changes first (its names, URIs
// and uses, say).
func (ca *CA) IssueWith(t testing.TB, dir, name string, edit func(*x509.Certificate)) (certFile, keyFile string) {
	t.Helper()
	tmpl := template(name)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	tmpl.IPAddresses, tmpl.DNSNames = []net.IP{net.IPv4(127, 0, 0, 1)}, []string{"localhost"}
	edit(tmpl)
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	write(t, certFile, keyFile, tmpl, ca.Cert, ca.Key)
	return certFile, keyFile
}
