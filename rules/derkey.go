package rules

// The DER key formats a JWT verification key may be configured in, parsed
// with cryptobyte instead of crypto/x509: x509 imports net, whose init links
// file functions that import wasi path_filestat_get, which the Wasm hosts of
// Envoy 1.33 to 1.38 do not provide, and Envoy refuses to load a module
// with an import its host lacks.
//
// Only RSA and EC P-256 keys are parsed: those are the keys RS256 and ES256
// verify with. Where crypto/x509 is lenient with something a key has no use
// for, the parser refuses it so that a key has one encoding; each such
// refusal wraps one of the errors below. Of a certificate only the key is
// read (certificateSPKI). FuzzParseSPKIKey and its siblings hold the parser
// to crypto/x509 everywhere else.

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/asn1"
	"errors"
	"math/big"

	"golang.org/x/crypto/cryptobyte"
	cbasn1 "golang.org/x/crypto/cryptobyte/asn1"
)

// Refusals of what crypto/x509 accepts.
var (
	// errDERExtraData: elements after the last field of a SEQUENCE, or data
	// after the RSAPublicKey inside a SubjectPublicKeyInfo. encoding/asn1
	// skips trailing SEQUENCE elements (X.509's old way of growing
	// structures), but none of these structures has later fields.
	errDERExtraData = errors.New("data after the last field")
	// errKeyUnusedBits: a subjectPublicKey BIT STRING that is not a whole
	// number of bytes. crypto/x509 shifts the bits right and parses the
	// result; an RSA or EC key is always whole bytes.
	errKeyUnusedBits = errors.New("the subjectPublicKey BIT STRING has unused bits")
	// errRSAExponentLarge: crypto/x509 reads an exponent up to 2^63-1 from
	// a SubjectPublicKeyInfo (up to 2^31-1 from PKCS #1), but crypto/rsa
	// refuses to verify with one above 2^31-1, so every token would fail.
	errRSAExponentLarge = errors.New("the public exponent is larger than 2^31-1")
)

func derErr(msg string) error { return &kindError{msg: msg} }

// derRefusal returns one of the refusals above, after context.
func derRefusal(context string, kind error) error {
	return &kindError{kind, context + kind.Error()}
}

func derExtra(where string) error {
	return &kindError{errDERExtraData, "data after the last field of " + where}
}

// derPrefix adds context to an error, keeping its kind.
func derPrefix(prefix string, err error) error {
	if e, ok := err.(*kindError); ok {
		return &kindError{e.kind, prefix + e.msg}
	}
	return errors.New(prefix + err.Error())
}

var (
	oidRSAEncryption = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 1, 1}
	oidECPublicKey   = asn1.ObjectIdentifier{1, 2, 840, 10045, 2, 1}
	oidP256          = asn1.ObjectIdentifier{1, 2, 840, 10045, 3, 1, 7}
)

// otherKeyOIDs names key algorithms and curves that key files hold but JWT
// verification here does not use, so that a refusal can say what it saw.
var otherKeyOIDs = []struct {
	oid  asn1.ObjectIdentifier
	name string
}{
	{asn1.ObjectIdentifier{1, 3, 101, 112}, "Ed25519"},
	{asn1.ObjectIdentifier{1, 3, 101, 113}, "Ed448"},
	{asn1.ObjectIdentifier{1, 3, 101, 110}, "X25519"},
	{asn1.ObjectIdentifier{1, 2, 840, 10040, 4, 1}, "DSA"},
	{asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 1, 10}, "RSASSA-PSS"},
	{asn1.ObjectIdentifier{1, 3, 132, 0, 33}, "P-224"},
	{asn1.ObjectIdentifier{1, 3, 132, 0, 34}, "P-384"},
	{asn1.ObjectIdentifier{1, 3, 132, 0, 35}, "P-521"},
	{asn1.ObjectIdentifier{1, 3, 132, 0, 10}, "secp256k1"},
}

func oidName(oid asn1.ObjectIdentifier) string {
	for _, o := range otherKeyOIDs {
		if oid.Equal(o.oid) {
			return o.name
		}
	}
	return oid.String()
}

var derNull = []byte{0x05, 0x00}

// parseSPKIKey parses a DER SubjectPublicKeyInfo (RFC 5280 §4.1.2.7), the
// body of a "PUBLIC KEY" PEM block, holding an RSA or EC P-256 key. It
// returns a *rsa.PublicKey or a *ecdsa.PublicKey on P-256.
func parseSPKIKey(der []byte) (any, error) {
	s := cryptobyte.String(der)
	var spki cryptobyte.String
	if !s.ReadASN1Element(&spki, cbasn1.SEQUENCE) {
		return nil, derErr("not a DER SubjectPublicKeyInfo SEQUENCE")
	}
	if !s.Empty() {
		return nil, derErr("data after the SubjectPublicKeyInfo")
	}
	pub, err := spkiKey(spki)
	if err != nil {
		if _, err1 := rsaPublicKey(der); err1 == nil {
			return nil, derErr("this is a PKCS #1 RSA key, whose PEM block type is RSA PUBLIC KEY")
		}
		return nil, err
	}
	return pub, nil
}

// spkiKey parses one SubjectPublicKeyInfo element.
func spkiKey(spki cryptobyte.String) (any, error) {
	var body, algo, params cryptobyte.String
	var oid asn1.ObjectIdentifier
	if !spki.ReadASN1(&body, cbasn1.SEQUENCE) {
		return nil, derErr("not a DER SubjectPublicKeyInfo SEQUENCE")
	}
	if !body.ReadASN1(&algo, cbasn1.SEQUENCE) {
		return nil, derErr("malformed key algorithm identifier")
	}
	if err := readAlgorithmIdentifier(algo, "key algorithm", &oid, &params); err != nil {
		return nil, err
	}
	var bits asn1.BitString
	if !body.ReadASN1BitString(&bits) {
		return nil, derErr("subjectPublicKey is not a DER BIT STRING")
	}
	if !body.Empty() {
		return nil, derExtra("SubjectPublicKeyInfo")
	}
	switch {
	case oid.Equal(oidRSAEncryption):
		// RFC 3279 §2.3.1: the parameters are NULL.
		if !bytes.Equal(params, derNull) {
			return nil, derErr("RSA key: the algorithm parameters must be NULL")
		}
		if bits.BitLength%8 != 0 {
			return nil, derRefusal("RSA key: ", errKeyUnusedBits)
		}
		pub, err := rsaPublicKey(bits.Bytes)
		if err != nil {
			return nil, derPrefix("RSA key: ", err)
		}
		return pub, nil
	case oid.Equal(oidECPublicKey):
		// RFC 5480 §2.1.1: the parameters name the curve.
		var curve asn1.ObjectIdentifier
		if !params.ReadASN1ObjectIdentifier(&curve) {
			return nil, derErr("EC key: the algorithm parameters must be a named curve OID")
		}
		if !curve.Equal(oidP256) {
			return nil, derErr("EC key on curve " + oidName(curve) + ": only P-256 is supported (ES256)")
		}
		if bits.BitLength%8 != 0 {
			return nil, derRefusal("EC key: ", errKeyUnusedBits)
		}
		// Checks the length, the uncompressed form and that the point is
		// on the curve.
		pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), bits.Bytes)
		if err != nil {
			return nil, derErr("EC key: not an uncompressed point on P-256")
		}
		return pub, nil
	}
	return nil, derErr("unsupported key algorithm " + oidName(oid) + " (want RSA or EC P-256)")
}

// readAlgorithmIdentifier reads the contents of an AlgorithmIdentifier
// SEQUENCE (what names it in errors): an OID and optional parameters, of
// which params gets the whole element (empty when absent).
func readAlgorithmIdentifier(ai cryptobyte.String, what string, oid *asn1.ObjectIdentifier, params *cryptobyte.String) error {
	if !ai.ReadASN1ObjectIdentifier(oid) {
		return derErr("malformed " + what + " OID")
	}
	*params = nil
	if ai.Empty() {
		return nil
	}
	var tag cbasn1.Tag
	if !ai.ReadAnyASN1Element(params, &tag) {
		return derErr("malformed " + what + " parameters")
	}
	if !ai.Empty() {
		return derExtra(what + " identifier")
	}
	return nil
}

// parsePKCS1Key parses a DER RSAPublicKey (RFC 8017 §A.1.1), the body of
// an "RSA PUBLIC KEY" PEM block.
func parsePKCS1Key(der []byte) (*rsa.PublicKey, error) {
	pub, err := rsaPublicKey(der)
	if err != nil {
		if _, err1 := parseSPKIKey(der); err1 == nil {
			return nil, derErr("this is a SubjectPublicKeyInfo, whose PEM block type is PUBLIC KEY")
		}
		return nil, err
	}
	return pub, nil
}

// rsaPublicKey parses an RSAPublicKey: a PKCS #1 key, or the key inside an
// RSA SubjectPublicKeyInfo.
func rsaPublicKey(der []byte) (*rsa.PublicKey, error) {
	s := cryptobyte.String(der)
	var seq cryptobyte.String
	if !s.ReadASN1(&seq, cbasn1.SEQUENCE) {
		return nil, derErr("not a DER RSAPublicKey SEQUENCE")
	}
	if !s.Empty() {
		return nil, &kindError{errDERExtraData, "data after the RSAPublicKey SEQUENCE"}
	}
	n, e := new(big.Int), new(big.Int)
	if !seq.ReadASN1Integer(n) {
		return nil, derErr("the modulus is not a DER INTEGER")
	}
	if !seq.ReadASN1Integer(e) {
		return nil, derErr("the public exponent is not a DER INTEGER")
	}
	if !seq.Empty() {
		return nil, derExtra("RSAPublicKey")
	}
	if n.Sign() <= 0 {
		return nil, derErr("the modulus is not positive")
	}
	if e.Sign() <= 0 {
		return nil, derErr("the public exponent is not positive")
	}
	if !e.IsInt64() || e.Int64() > 1<<31-1 {
		return nil, derRefusal("", errRSAExponentLarge)
	}
	return &rsa.PublicKey{N: n, E: int(e.Int64())}, nil
}

// parseCertificateKey returns the public key of a DER X.509 certificate
// (RFC 5280 §4.1), v1, v2 or v3, if it is an RSA or EC P-256 key.
func parseCertificateKey(der []byte) (any, error) {
	spki, err := certificateSPKI(der)
	if err != nil {
		return nil, err
	}
	return spkiKey(spki)
}

var (
	tagCertVersion     = cbasn1.Tag(0).Constructed().ContextSpecific()
	tagIssuerUniqueID  = cbasn1.Tag(1).ContextSpecific()
	tagSubjectUniqueID = cbasn1.Tag(2).ContextSpecific()
	tagCertExtensions  = cbasn1.Tag(3).Constructed().ContextSpecific()
)

// certificateSPKI walks a certificate to its SubjectPublicKeyInfo element.
// The certificate only carries the key: nothing else in it is used (no
// chain, no validity period, no names), so the other fields are checked for
// their place and DER shape, not read; crypto/x509 refuses some
// certificates for their contents (a malformed time, name or
// subjectAltName, a duplicate extension) that this accepts. The version
// decides which optional fields may follow the key; the serial number must
// be a non-negative INTEGER and the two signature algorithms equal, as
// crypto/x509 requires.
func certificateSPKI(der []byte) (cryptobyte.String, error) {
	input := cryptobyte.String(der)
	var cert, tbs, outerSigAlg, sigAlg, spki cryptobyte.String
	if !input.ReadASN1(&cert, cbasn1.SEQUENCE) {
		return nil, derErr("not a DER Certificate SEQUENCE")
	}
	if !input.Empty() {
		return nil, derErr("data after the certificate")
	}
	if !cert.ReadASN1(&tbs, cbasn1.SEQUENCE) {
		return nil, derErr("malformed tbsCertificate")
	}
	if !cert.ReadASN1(&outerSigAlg, cbasn1.SEQUENCE) {
		return nil, derErr("malformed signatureAlgorithm")
	}
	var sig asn1.BitString
	if !cert.ReadASN1BitString(&sig) {
		return nil, derErr("malformed signatureValue")
	}
	if !cert.Empty() {
		return nil, derExtra("Certificate")
	}

	// version [0] EXPLICIT INTEGER DEFAULT v1(0)
	var versionField cryptobyte.String
	var hasVersion bool
	version := byte(0)
	if !tbs.ReadOptionalASN1(&versionField, &hasVersion, tagCertVersion) {
		return nil, derErr("malformed version")
	}
	if hasVersion {
		var v []byte
		if !versionField.ReadASN1Integer(&v) || !versionField.Empty() {
			return nil, derErr("malformed version")
		}
		if len(v) != 1 || v[0] > 2 {
			return nil, derErr("unsupported certificate version (want v1, v2 or v3)")
		}
		version = v[0]
	}
	var serial []byte
	if !tbs.ReadASN1Integer(&serial) {
		return nil, derErr("malformed serialNumber (want a non-negative DER INTEGER)")
	}
	if !tbs.ReadASN1(&sigAlg, cbasn1.SEQUENCE) {
		return nil, derErr("malformed signature algorithm")
	}
	// RFC 5280 §4.1.1.2: both name the same algorithm.
	if !bytes.Equal(sigAlg, outerSigAlg) {
		return nil, derErr("signature algorithm of the tbsCertificate differs from the certificate's")
	}
	var sigOID asn1.ObjectIdentifier
	var sigParams cryptobyte.String
	if err := readAlgorithmIdentifier(sigAlg, "signature algorithm", &sigOID, &sigParams); err != nil {
		return nil, err
	}
	var issuer, validity, subject cryptobyte.String
	if !tbs.ReadASN1(&issuer, cbasn1.SEQUENCE) {
		return nil, derErr("malformed issuer")
	}
	if !tbs.ReadASN1(&validity, cbasn1.SEQUENCE) {
		return nil, derErr("malformed validity")
	}
	if !tbs.ReadASN1(&subject, cbasn1.SEQUENCE) {
		return nil, derErr("malformed subject")
	}
	if !tbs.ReadASN1Element(&spki, cbasn1.SEQUENCE) {
		return nil, derErr("malformed subjectPublicKeyInfo")
	}
	if version >= 1 {
		if !tbs.SkipOptionalASN1(tagIssuerUniqueID) {
			return nil, derErr("malformed issuerUniqueID")
		}
		if !tbs.SkipOptionalASN1(tagSubjectUniqueID) {
			return nil, derErr("malformed subjectUniqueID")
		}
	}
	if version == 2 {
		if err := checkExtensions(&tbs); err != nil {
			return nil, err
		}
	}
	if !tbs.Empty() {
		return nil, derExtra("tbsCertificate")
	}
	return spki, nil
}

// checkExtensions skips the optional extensions field of a v3
// tbsCertificate, checking that each extension is an OID, an optional
// critical BOOLEAN and an OCTET STRING.
func checkExtensions(tbs *cryptobyte.String) error {
	var field, list cryptobyte.String
	var present bool
	if !tbs.ReadOptionalASN1(&field, &present, tagCertExtensions) {
		return derErr("malformed extensions")
	}
	if !present {
		return nil
	}
	if !field.ReadASN1(&list, cbasn1.SEQUENCE) {
		return derErr("malformed extensions")
	}
	if !field.Empty() {
		return derExtra("extensions")
	}
	for !list.Empty() {
		var ext, value cryptobyte.String
		var oid asn1.ObjectIdentifier
		if !list.ReadASN1(&ext, cbasn1.SEQUENCE) || !ext.ReadASN1ObjectIdentifier(&oid) {
			return derErr("malformed extension")
		}
		if ext.PeekASN1Tag(cbasn1.BOOLEAN) {
			var critical bool
			if !ext.ReadASN1Boolean(&critical) {
				return derErr("malformed extension critical flag")
			}
		}
		if !ext.ReadASN1(&value, cbasn1.OCTET_STRING) {
			return derErr("malformed extension value")
		}
		if !ext.Empty() {
			return derExtra("Extension")
		}
	}
	return nil
}
