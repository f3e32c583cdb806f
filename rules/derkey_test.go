package rules

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/cryptobyte"
	cbasn1 "golang.org/x/crypto/cryptobyte/asn1"
)

// The parser is held to crypto/x509, which tests may link (they are not
// part of the plugin). The PEM block type names the parser.
const (
	derSPKI  = "PUBLIC KEY"
	derPKCS1 = "RSA PUBLIC KEY"
	derCert  = "CERTIFICATE"
)

func parseDERKey(kind string, der []byte) (any, error) {
	switch kind {
	case derSPKI:
		return parseSPKIKey(der)
	case derPKCS1:
		pub, err := parsePKCS1Key(der)
		if err != nil {
			return nil, err
		}
		return pub, nil
	case derCert:
		return parseCertificateKey(der)
	}
	panic("unknown kind " + kind)
}

func x509DERKey(kind string, der []byte) (any, error) {
	switch kind {
	case derSPKI:
		return x509.ParsePKIXPublicKey(der)
	case derPKCS1:
		pub, err := x509.ParsePKCS1PublicKey(der)
		if err != nil {
			return nil, err
		}
		return pub, nil
	case derCert:
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, err
		}
		return c.PublicKey, nil
	}
	panic("unknown kind " + kind)
}

// supportedKey reports whether pub is a key the parser returns.
func supportedKey(pub any) bool {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return true
	case *ecdsa.PublicKey:
		return k.Curve == elliptic.P256()
	}
	return false
}

func equalKeys(a, b any) bool {
	switch a := a.(type) {
	case *rsa.PublicKey:
		b, ok := b.(*rsa.PublicKey)
		return ok && a.Equal(b) && a.E == b.E
	case *ecdsa.PublicKey:
		b, ok := b.(*ecdsa.PublicKey)
		return ok && a.Equal(b)
	}
	return false
}

// isRefusal reports whether err is one of the parser's deliberate
// refusals of what crypto/x509 accepts (derkey.go).
func isRefusal(err error) bool {
	return errors.Is(err, errDERExtraData) || errors.Is(err, errKeyUnusedBits) || errors.Is(err, errRSAExponentLarge)
}

// x509CertChecks are crypto/x509's certificate errors for what the parser
// checks too: the structure, the serial number, the key. Any other refusal
// is about a field the parser does not read (names, validity, extension
// values).
var x509CertChecks = []string{
	"x509: malformed certificate",
	"x509: malformed tbs certificate",
	"x509: malformed version",
	"x509: invalid version",
	"x509: malformed serial number",
	"x509: negative serial number",
	"x509: malformed signature algorithm identifier",
	"x509: malformed algorithm identifier",
	"x509: inner and outer signature algorithm identifiers don't match",
	"x509: malformed OID",
	"x509: malformed parameters",
	"x509: malformed issuer",
	"x509: malformed validity",
	"x509: malformed spki",
	"x509: malformed public key algorithm identifier",
	"x509: malformed subjectPublicKey",
	"x509: malformed issuerUniqueID",
	"x509: malformed subjectUniqueID",
	"x509: malformed extensions",
	"x509: malformed extension",
	"x509: malformed extension OID field",
	"x509: malformed extension critical field",
	"x509: malformed extension value field",
	"x509: malformed signature",
	"x509: trailing data",
	"x509: RSA key missing NULL parameters",
	"x509: invalid RSA public key",
	"x509: invalid RSA modulus",
	"x509: invalid RSA public exponent",
	"x509: RSA modulus is not a positive number",
	"x509: RSA public exponent is not a positive number",
	"x509: invalid ECDSA parameters",
	"x509: unsupported elliptic curve",
}

// checkDERKey parses der as kind with the parser and with crypto/x509 and
// fails unless they agree: the same key when both accept; a refusal by
// one alone only where derkey.go documents it.
func checkDERKey(t *testing.T, kind string, der []byte) {
	t.Helper()
	got, err := parseDERKey(kind, der)
	want, wantErr := x509DERKey(kind, der)
	if err == nil && !supportedKey(got) {
		t.Fatalf("%s: parser returned a %T", kind, got)
	}
	switch {
	case err == nil && wantErr == nil:
		if !equalKeys(got, want) {
			t.Fatalf("%s: parser key %#v, crypto/x509 key %#v", kind, got, want)
		}
	case err == nil:
		// Only a certificate that crypto/x509 refuses for a field the
		// parser does not read, and whose key crypto/x509 reads the same.
		if kind != derCert {
			t.Fatalf("%s: parser accepted what crypto/x509 refuses: %v", kind, wantErr)
		}
		for _, msg := range x509CertChecks {
			if wantErr.Error() == msg {
				t.Fatalf("%s: parser accepted what crypto/x509 refuses: %v", kind, wantErr)
			}
		}
		spki, serr := certificateSPKI(der)
		if serr != nil {
			t.Fatalf("certificateSPKI fails on an accepted certificate: %v", serr)
		}
		k, kerr := x509.ParsePKIXPublicKey(spki)
		if kerr != nil || !equalKeys(got, k) {
			t.Fatalf("%s: parser key %#v, crypto/x509's of the same SubjectPublicKeyInfo %#v (%v)", kind, got, k, kerr)
		}
	case wantErr == nil:
		if supportedKey(want) && !isRefusal(err) {
			t.Fatalf("%s: parser refused a key crypto/x509 accepts: %v", kind, err)
		}
		if errors.Is(err, errRSAExponentLarge) {
			if pk, ok := want.(*rsa.PublicKey); !ok || pk.E <= 1<<31-1 {
				t.Fatalf("%s: parser says the exponent is too large, crypto/x509 reads %#v", kind, want)
			}
		}
	}
}

// DER building blocks for hand-made inputs.

func tlv(tag byte, parts ...[]byte) []byte {
	var b cryptobyte.Builder
	b.AddASN1(cbasn1.Tag(tag), func(c *cryptobyte.Builder) {
		for _, p := range parts {
			c.AddBytes(p)
		}
	})
	return b.BytesOrPanic()
}

func seq(parts ...[]byte) []byte { return tlv(0x30, parts...) }

func derInt(n *big.Int) []byte {
	var b cryptobyte.Builder
	b.AddASN1BigInt(n)
	return b.BytesOrPanic()
}

func derOID(oid asn1.ObjectIdentifier) []byte {
	var b cryptobyte.Builder
	b.AddASN1ObjectIdentifier(oid)
	return b.BytesOrPanic()
}

func bitString(unused byte, content []byte) []byte {
	return tlv(0x03, append([]byte{unused}, content...))
}

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

var (
	rsaAlg      = seq(derOID(oidRSAEncryption), derNull)
	ecAlgP256   = seq(derOID(oidECPublicKey), derOID(oidP256))
	sha256RSA   = seq(derOID(asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 1, 11}), derNull)
	testName    = seq(tlv(0x31, seq(derOID(asn1.ObjectIdentifier{2, 5, 4, 3}), tlv(0x0c, []byte("sluice test")))))
	testValidty = seq(tlv(0x17, []byte("250101000000Z")), tlv(0x17, []byte("350101000000Z")))
)

func rsaKeyDER(n *big.Int, e int64) []byte { return seq(derInt(n), derInt(big.NewInt(e))) }

// shiftLeft1 returns b shifted left by one bit: as a BIT STRING with one
// unused bit, it is what crypto/x509 right-aligns back to b.
func shiftLeft1(b []byte) []byte {
	out := make([]byte, len(b))
	for i := range b {
		out[i] = b[i] << 1
		if i+1 < len(b) {
			out[i] |= b[i+1] >> 7
		}
	}
	return out
}

// certParts builds a certificate field by field; nil fields are left out.
type certParts struct {
	version, serial, sigAlg, issuer, validity, subject, spki []byte
	afterSPKI                                                []byte // unique IDs, extensions
	outerSigAlg, sig, afterSig                               []byte
}

func newCertParts(spki []byte) certParts {
	return certParts{
		version:     tlv(0xa0, derInt(big.NewInt(2))),
		serial:      derInt(big.NewInt(7)),
		sigAlg:      sha256RSA,
		issuer:      testName,
		validity:    testValidty,
		subject:     testName,
		spki:        spki,
		outerSigAlg: sha256RSA,
		sig:         bitString(0, []byte{1, 2, 3, 4}),
	}
}

func (c certParts) der() []byte {
	tbs := seq(c.version, c.serial, c.sigAlg, c.issuer, c.validity, c.subject, c.spki, c.afterSPKI)
	return seq(tbs, c.outerSigAlg, c.sig, c.afterSig)
}

func (c certParts) with(f func(*certParts)) []byte {
	f(&c)
	return c.der()
}

func x509Cert(t testing.TB, tmpl *x509.Certificate, pub any, priv any) []byte {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

type derKeyCase struct {
	name    string
	kind    string
	der     []byte
	want    any    // the key, or nil for an error
	wantErr string // part of the error
	refusal error  // for a deliberate refusal: its kind
	differs bool   // crypto/x509 accepts a supported key the parser refuses, or the reverse
}

// derKeyCases are the table of TestParseDERKeys and the seeds of the
// fuzzers.
func derKeyCases(t testing.TB) []derKeyCase {
	k := testKeys()
	rsaPub, ecPub := &k.rsa.PublicKey, &k.ec.PublicKey
	rsaSPKI, err := x509.MarshalPKIXPublicKey(rsaPub)
	if err != nil {
		t.Fatal(err)
	}
	ecSPKI, err := x509.MarshalPKIXPublicKey(ecPub)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p384SPKI, _ := x509.MarshalPKIXPublicKey(&p384.PublicKey)
	edPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	edSPKI, _ := x509.MarshalPKIXPublicKey(edPub)
	rsaPKCS1 := x509.MarshalPKCS1PublicKey(rsaPub)
	ecPoint, err := ecPub.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	offCurve := append([]byte(nil), ecPoint...)
	offCurve[64] ^= 1
	compressed := append([]byte{2 + ecPoint[64]&1}, ecPoint[1:33]...)

	n := rsaPub.N
	withE := func(e int64) *rsa.PublicKey { return &rsa.PublicKey{N: n, E: int(e)} }
	rsaSPKIOf := func(key []byte) []byte { return seq(rsaAlg, bitString(0, key)) }

	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(42),
		Subject:               pkix.Name{CommonName: "sluice test", Organization: []string{"Sluice"}},
		NotBefore:             time.Unix(testNow-3600, 0),
		NotAfter:              time.Unix(testNow+3600, 0),
		DNSNames:              []string{"issuer.example"},
		IPAddresses:           []net.IP{net.IPv4(192, 0, 2, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	rsaCert := x509Cert(t, tmpl, rsaPub, k.rsa)
	ecCert := x509Cert(t, tmpl, ecPub, k.ec)
	p384Cert := x509Cert(t, tmpl, &p384.PublicKey, k.ec)
	edCert := x509Cert(t, tmpl, edPub, k.ec)

	rsaParts := newCertParts(rsaSPKI)
	ext := seq(derOID(asn1.ObjectIdentifier{2, 5, 29, 19}), tlv(0x01, []byte{0xff}), tlv(0x04, seq(tlv(0x01, []byte{0xff}))))
	uniqueIDs := cat(tlv(0x81, []byte{0, 0xaa}), tlv(0x82, []byte{0, 0xbb}))

	big31 := new(big.Int).Lsh(big.NewInt(1), 31)
	return []derKeyCase{
		// SubjectPublicKeyInfo.
		{name: "SPKI RSA 2048", kind: derSPKI, der: rsaSPKI, want: rsaPub},
		{name: "SPKI EC P-256", kind: derSPKI, der: ecSPKI, want: ecPub},
		{name: "SPKI RSA e=3", kind: derSPKI, der: rsaSPKIOf(rsaKeyDER(n, 3)), want: withE(3)},
		{name: "SPKI RSA e=2^31-1", kind: derSPKI, der: rsaSPKIOf(rsaKeyDER(n, 1<<31-1)), want: withE(1<<31 - 1)},
		{name: "SPKI RSA e=2^31", kind: derSPKI, der: rsaSPKIOf(rsaKeyDER(n, 1<<31)), wantErr: "larger than 2^31-1", refusal: errRSAExponentLarge, differs: true},
		{name: "SPKI RSA e=2^64", kind: derSPKI, der: rsaSPKIOf(seq(derInt(n), derInt(new(big.Int).Lsh(big31, 33)))), wantErr: "larger than 2^31-1", refusal: errRSAExponentLarge},
		{name: "SPKI RSA e=0", kind: derSPKI, der: rsaSPKIOf(rsaKeyDER(n, 0)), wantErr: "exponent is not positive"},
		{name: "SPKI RSA e=-3", kind: derSPKI, der: rsaSPKIOf(rsaKeyDER(n, -3)), wantErr: "exponent is not positive"},
		{name: "SPKI RSA n=0", kind: derSPKI, der: rsaSPKIOf(seq(derInt(big.NewInt(0)), derInt(big.NewInt(65537)))), wantErr: "modulus is not positive"},
		{name: "SPKI RSA n<0", kind: derSPKI, der: rsaSPKIOf(seq(derInt(new(big.Int).Neg(n)), derInt(big.NewInt(65537)))), wantErr: "modulus is not positive"},
		{name: "SPKI RSA n not minimal", kind: derSPKI, der: rsaSPKIOf(seq(tlv(0x02, cat([]byte{0, 0}, n.Bytes())), derInt(big.NewInt(65537)))), wantErr: "modulus is not a DER INTEGER"},
		{name: "SPKI RSA e missing", kind: derSPKI, der: rsaSPKIOf(seq(derInt(n))), wantErr: "exponent is not a DER INTEGER"},
		{name: "SPKI RSA no parameters", kind: derSPKI, der: seq(seq(derOID(oidRSAEncryption)), bitString(0, rsaPKCS1)), wantErr: "must be NULL"},
		{name: "SPKI RSA OID parameters", kind: derSPKI, der: seq(seq(derOID(oidRSAEncryption), derOID(oidP256)), bitString(0, rsaPKCS1)), wantErr: "must be NULL"},
		{name: "SPKI RSA NULL with content", kind: derSPKI, der: seq(seq(derOID(oidRSAEncryption), tlv(0x05, []byte{0})), bitString(0, rsaPKCS1)), wantErr: "must be NULL"},
		{name: "SPKI RSA key with a third field", kind: derSPKI, der: rsaSPKIOf(seq(derInt(n), derInt(big.NewInt(65537)), derInt(big.NewInt(1)))), wantErr: "last field of RSAPublicKey", refusal: errDERExtraData, differs: true},
		{name: "SPKI RSA data after the key", kind: derSPKI, der: rsaSPKIOf(cat(rsaPKCS1, derNull)), wantErr: "after the RSAPublicKey", refusal: errDERExtraData, differs: true},
		{name: "SPKI RSA algorithm with a third field", kind: derSPKI, der: seq(seq(derOID(oidRSAEncryption), derNull, derNull), bitString(0, rsaPKCS1)), wantErr: "key algorithm identifier", refusal: errDERExtraData, differs: true},
		{name: "SPKI with a third field", kind: derSPKI, der: seq(rsaAlg, bitString(0, rsaPKCS1), derNull), wantErr: "last field of SubjectPublicKeyInfo", refusal: errDERExtraData, differs: true},
		{name: "SPKI RSA key with unused bits", kind: derSPKI, der: seq(rsaAlg, bitString(1, shiftLeft1(rsaPKCS1))), wantErr: "unused bits", refusal: errKeyUnusedBits, differs: true},
		{name: "SPKI EC with a third field", kind: derSPKI, der: seq(seq(derOID(oidECPublicKey), derOID(oidP256), derNull), bitString(0, ecPoint)), wantErr: "key algorithm identifier", refusal: errDERExtraData, differs: true},
		{name: "SPKI EC no parameters", kind: derSPKI, der: seq(seq(derOID(oidECPublicKey)), bitString(0, ecPoint)), wantErr: "named curve OID"},
		{name: "SPKI EC NULL parameters", kind: derSPKI, der: seq(seq(derOID(oidECPublicKey), derNull), bitString(0, ecPoint)), wantErr: "named curve OID"},
		{name: "SPKI EC P-384", kind: derSPKI, der: p384SPKI, wantErr: "curve P-384: only P-256"},
		{name: "SPKI EC compressed point", kind: derSPKI, der: seq(ecAlgP256, bitString(0, compressed)), wantErr: "not an uncompressed point"},
		{name: "SPKI EC point off the curve", kind: derSPKI, der: seq(ecAlgP256, bitString(0, offCurve)), wantErr: "not an uncompressed point"},
		{name: "SPKI EC point short", kind: derSPKI, der: seq(ecAlgP256, bitString(0, ecPoint[:64])), wantErr: "not an uncompressed point"},
		{name: "SPKI EC point at infinity", kind: derSPKI, der: seq(ecAlgP256, bitString(0, []byte{0})), wantErr: "not an uncompressed point"},
		{name: "SPKI Ed25519", kind: derSPKI, der: edSPKI, wantErr: "unsupported key algorithm Ed25519"},
		{name: "SPKI unknown algorithm", kind: derSPKI, der: seq(seq(derOID(asn1.ObjectIdentifier{1, 2, 3, 4})), bitString(0, []byte{1})), wantErr: "unsupported key algorithm 1.2.3.4"},
		{name: "SPKI key not a BIT STRING", kind: derSPKI, der: seq(rsaAlg, tlv(0x04, rsaPKCS1)), wantErr: "not a DER BIT STRING"},
		{name: "SPKI holding PKCS #1", kind: derSPKI, der: rsaPKCS1, wantErr: "PEM block type is RSA PUBLIC KEY"},
		{name: "SPKI then data", kind: derSPKI, der: cat(rsaSPKI, []byte{0}), wantErr: "data after the SubjectPublicKeyInfo"},
		{name: "SPKI truncated", kind: derSPKI, der: rsaSPKI[:len(rsaSPKI)-1], wantErr: "not a DER SubjectPublicKeyInfo"},
		{name: "SPKI indefinite length", kind: derSPKI, der: cat([]byte{0x30, 0x80}, ecSPKI[2:], []byte{0, 0}), wantErr: "not a DER SubjectPublicKeyInfo"},
		{name: "SPKI long-form short length", kind: derSPKI, der: cat([]byte{0x30, 0x81, ecSPKI[1]}, ecSPKI[2:]), wantErr: "not a DER SubjectPublicKeyInfo"},
		{name: "SPKI empty", kind: derSPKI, der: nil, wantErr: "not a DER SubjectPublicKeyInfo"},

		// PKCS #1 RSAPublicKey.
		{name: "PKCS1 RSA 2048", kind: derPKCS1, der: rsaPKCS1, want: rsaPub},
		{name: "PKCS1 e=2^31", kind: derPKCS1, der: rsaKeyDER(n, 1<<31), wantErr: "larger than 2^31-1", refusal: errRSAExponentLarge},
		{name: "PKCS1 with a third field", kind: derPKCS1, der: seq(derInt(n), derInt(big.NewInt(65537)), derInt(big.NewInt(1))), wantErr: "last field of RSAPublicKey", refusal: errDERExtraData, differs: true},
		{name: "PKCS1 then data", kind: derPKCS1, der: cat(rsaPKCS1, derNull), wantErr: "after the RSAPublicKey", refusal: errDERExtraData},
		{name: "PKCS1 holding SPKI", kind: derPKCS1, der: rsaSPKI, wantErr: "PEM block type is PUBLIC KEY"},
		{name: "PKCS1 e=0", kind: derPKCS1, der: rsaKeyDER(n, 0), wantErr: "exponent is not positive"},
		{name: "PKCS1 empty", kind: derPKCS1, der: nil, wantErr: "not a DER RSAPublicKey"},

		// Certificates.
		{name: "cert RSA v3 from crypto/x509", kind: derCert, der: rsaCert, want: rsaPub},
		{name: "cert EC v3 from crypto/x509", kind: derCert, der: ecCert, want: ecPub},
		{name: "cert v1", kind: derCert, der: rsaParts.with(func(c *certParts) { c.version = nil }), want: rsaPub},
		{name: "cert v1 explicit", kind: derCert, der: rsaParts.with(func(c *certParts) { c.version = tlv(0xa0, derInt(big.NewInt(0))) }), want: rsaPub},
		{name: "cert v2 unique IDs", kind: derCert, der: rsaParts.with(func(c *certParts) {
			c.version, c.afterSPKI = tlv(0xa0, derInt(big.NewInt(1))), uniqueIDs
		}), want: rsaPub},
		{name: "cert v3 unique IDs and extensions", kind: derCert, der: rsaParts.with(func(c *certParts) {
			c.afterSPKI = cat(uniqueIDs, tlv(0xa3, seq(ext)))
		}), want: rsaPub},
		{name: "cert v3 no extensions", kind: derCert, der: rsaParts.der(), want: rsaPub},
		{name: "cert signature with unused bits", kind: derCert, der: rsaParts.with(func(c *certParts) { c.sig = bitString(2, []byte{0xfc}) }), want: rsaPub},
		{name: "cert v4", kind: derCert, der: rsaParts.with(func(c *certParts) { c.version = tlv(0xa0, derInt(big.NewInt(3))) }), wantErr: "unsupported certificate version"},
		{name: "cert negative version", kind: derCert, der: rsaParts.with(func(c *certParts) { c.version = tlv(0xa0, derInt(big.NewInt(-1))) }), wantErr: "malformed version"},
		{name: "cert version with a second field", kind: derCert, der: rsaParts.with(func(c *certParts) { c.version = tlv(0xa0, derInt(big.NewInt(2)), derNull) }), wantErr: "malformed version"},
		{name: "cert negative serial", kind: derCert, der: rsaParts.with(func(c *certParts) { c.serial = derInt(big.NewInt(-7)) }), wantErr: "malformed serialNumber"},
		{name: "cert serial not minimal", kind: derCert, der: rsaParts.with(func(c *certParts) { c.serial = tlv(0x02, []byte{0, 7}) }), wantErr: "malformed serialNumber"},
		{name: "cert signature algorithms differ", kind: derCert, der: rsaParts.with(func(c *certParts) { c.outerSigAlg = seq(derOID(asn1.ObjectIdentifier{1, 2, 840, 10045, 4, 3, 2})) }), wantErr: "differs"},
		{name: "cert signature algorithm with a third field", kind: derCert, der: rsaParts.with(func(c *certParts) {
			c.sigAlg = seq(derOID(oidRSAEncryption), derNull, derNull)
			c.outerSigAlg = c.sigAlg
		}), wantErr: "signature algorithm identifier", refusal: errDERExtraData, differs: true},
		{name: "cert no validity", kind: derCert, der: rsaParts.with(func(c *certParts) { c.validity = nil }), wantErr: "malformed"},
		{name: "cert signature not a BIT STRING", kind: derCert, der: rsaParts.with(func(c *certParts) { c.sig = tlv(0x04, []byte{1}) }), wantErr: "malformed signatureValue"},
		{name: "cert then data", kind: derCert, der: cat(rsaCert, []byte{0}), wantErr: "data after the certificate"},
		{name: "cert truncated", kind: derCert, der: rsaCert[:len(rsaCert)-1], wantErr: "not a DER Certificate"},
		{name: "cert data after the signature", kind: derCert, der: rsaParts.with(func(c *certParts) { c.afterSig = derNull }), wantErr: "last field of Certificate", refusal: errDERExtraData, differs: true},
		{name: "cert v1 with extensions", kind: derCert, der: rsaParts.with(func(c *certParts) {
			c.version, c.afterSPKI = nil, tlv(0xa3, seq(ext))
		}), wantErr: "last field of tbsCertificate", refusal: errDERExtraData, differs: true},
		{name: "cert v3 data after the extensions", kind: derCert, der: rsaParts.with(func(c *certParts) { c.afterSPKI = cat(tlv(0xa3, seq(ext)), derNull) }), wantErr: "last field of tbsCertificate", refusal: errDERExtraData, differs: true},
		{name: "cert extensions then data", kind: derCert, der: rsaParts.with(func(c *certParts) { c.afterSPKI = tlv(0xa3, seq(ext), derNull) }), wantErr: "last field of extensions", refusal: errDERExtraData, differs: true},
		{name: "cert extension with a fourth field", kind: derCert, der: rsaParts.with(func(c *certParts) {
			c.afterSPKI = tlv(0xa3, seq(seq(derOID(asn1.ObjectIdentifier{1, 2, 3, 4}), tlv(0x01, []byte{0xff}), tlv(0x04, []byte{}), derNull)))
		}), wantErr: "last field of Extension", refusal: errDERExtraData, differs: true},
		{name: "cert extension critical not DER", kind: derCert, der: rsaParts.with(func(c *certParts) {
			c.afterSPKI = tlv(0xa3, seq(seq(derOID(asn1.ObjectIdentifier{2, 5, 29, 19}), tlv(0x01, []byte{1}), tlv(0x04, []byte{}))))
		}), wantErr: "critical flag"},
		{name: "cert extension value not an OCTET STRING", kind: derCert, der: rsaParts.with(func(c *certParts) {
			c.afterSPKI = tlv(0xa3, seq(seq(derOID(asn1.ObjectIdentifier{2, 5, 29, 19}), derNull)))
		}), wantErr: "malformed extension value"},
		// The certificate only carries the key: fields it does not use
		// are not read, where crypto/x509 refuses bad contents.
		{name: "cert validity not a time", kind: derCert, der: rsaParts.with(func(c *certParts) { c.validity = seq(derNull, derNull) }), want: rsaPub, differs: true},
		{name: "cert issuer not a Name", kind: derCert, der: rsaParts.with(func(c *certParts) { c.issuer = seq(derNull) }), want: rsaPub, differs: true},
		{name: "cert duplicate extension", kind: derCert, der: rsaParts.with(func(c *certParts) { c.afterSPKI = tlv(0xa3, seq(ext, ext)) }), want: rsaPub, differs: true},
		{name: "cert key usage not a BIT STRING", kind: derCert, der: rsaParts.with(func(c *certParts) {
			c.afterSPKI = tlv(0xa3, seq(seq(derOID(asn1.ObjectIdentifier{2, 5, 29, 15}), tlv(0x04, derNull))))
		}), want: rsaPub, differs: true},
		{name: "cert EC P-384", kind: derCert, der: p384Cert, wantErr: "curve P-384"},
		{name: "cert Ed25519", kind: derCert, der: edCert, wantErr: "unsupported key algorithm Ed25519"},
		{name: "cert RSA e=0", kind: derCert, der: newCertParts(rsaSPKIOf(rsaKeyDER(n, 0))).der(), wantErr: "exponent is not positive"},
		{name: "cert RSA key with unused bits", kind: derCert, der: newCertParts(seq(rsaAlg, bitString(1, shiftLeft1(rsaPKCS1)))).der(), wantErr: "unused bits", refusal: errKeyUnusedBits, differs: true},
		{name: "cert holding a bare SPKI", kind: derCert, der: rsaSPKI, wantErr: "malformed"},
		{name: "cert empty", kind: derCert, der: nil, wantErr: "not a DER Certificate"},
	}
}

func TestParseDERKeys(t *testing.T) {
	for _, tt := range derKeyCases(t) {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseDERKey(tt.kind, tt.der)
			if tt.want != nil {
				if err != nil {
					t.Fatalf("error %v, want the key", err)
				}
				if !equalKeys(got, tt.want) {
					t.Fatalf("key %#v, want %#v", got, tt.want)
				}
			} else {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				if tt.refusal != nil && !errors.Is(err, tt.refusal) {
					t.Fatalf("error %v is not a %q refusal", err, tt.refusal)
				}
				if tt.refusal == nil && isRefusal(err) {
					t.Fatalf("error %v is a refusal, want a plain error", err)
				}
			}
			// A key type the parser does not support is not a difference.
			x509Key, x509Err := x509DERKey(tt.kind, tt.der)
			x509Accepts := x509Err == nil && supportedKey(x509Key)
			if differs := (err == nil) != x509Accepts; differs != tt.differs {
				t.Fatalf("parser error %v, crypto/x509 %T, %v: differs = %v, want %v", err, x509Key, x509Err, differs, tt.differs)
			}
			checkDERKey(t, tt.kind, tt.der)
		})
	}
}

func addDERSeeds(f *testing.F) {
	for _, c := range derKeyCases(f) {
		f.Add(c.der)
	}
}

func FuzzParseSPKIKey(f *testing.F) {
	addDERSeeds(f)
	f.Fuzz(func(t *testing.T, der []byte) { checkDERKey(t, derSPKI, der) })
}

func FuzzParsePKCS1Key(f *testing.F) {
	addDERSeeds(f)
	f.Fuzz(func(t *testing.T, der []byte) { checkDERKey(t, derPKCS1, der) })
}

func FuzzParseCertificateKey(f *testing.F) {
	addDERSeeds(f)
	f.Fuzz(func(t *testing.T, der []byte) { checkDERKey(t, derCert, der) })
}
