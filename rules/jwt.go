package rules

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/hmac"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"

	"github.com/tidwall/gjson"
)

// JWTs are verified in the plugin so that the user id a limit is kept for
// cannot be chosen by the client: decoding a token without checking its
// signature would let anyone spend someone else's quota, or make up a
// fresh identity per request. Only HS256, RS256 and ES256 are accepted,
// each key is bound to one algorithm, and the token's alg must equal it.

// jwtByte marks the bytes a compact JWS may contain.
var jwtByte = func() (t [256]bool) {
	for _, c := range "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_." {
		t[c] = true
	}
	return t
}()

// MaxJWTLen bounds a token and a forwarded payload.
const MaxJWTLen = 8 << 10

// maxClaimLen bounds a claim value used as an identity.
const maxClaimLen = 255

// Sentinel errors of VerifyJWT and DecodeJWTPayload; the returned errors
// wrap one of them with detail.
var (
	ErrJWTMalformed = errors.New("jwt: malformed token")
	ErrJWTSignature = errors.New("jwt: invalid signature")
	ErrJWTExpired   = errors.New("jwt: token outside its validity period")
	ErrJWTClaims    = errors.New("jwt: claims rejected")
	ErrJWTNoKey     = errors.New("jwt: no key for token")
)

// kindError is an error of a kind (a sentinel it wraps, or nil) with its
// own message. The JWT errors below are built once, so a rejected token
// costs no formatting and no allocation for the error.
type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// jwtErr builds a JWT error: its kind's text, then detail.
func jwtErr(kind error, detail string) *kindError {
	return &kindError{kind, kind.Error() + ": " + detail}
}

var (
	errJWTEmpty       = jwtErr(ErrJWTMalformed, "no token")
	errJWTTooLong     = jwtErr(ErrJWTMalformed, "token longer than 8 KiB")
	errJWTParts       = jwtErr(ErrJWTMalformed, "token must have three dot-separated parts")
	errJWTBase64      = jwtErr(ErrJWTMalformed, "part is not unpadded base64url")
	errJWTHeader      = jwtErr(ErrJWTMalformed, "header is not a JSON object")
	errJWTAlg         = jwtErr(ErrJWTMalformed, "alg must be HS256, RS256 or ES256")
	errJWTKid         = jwtErr(ErrJWTMalformed, "kid must be a string")
	errJWTCrit        = jwtErr(ErrJWTMalformed, "crit header extensions are not supported")
	errJWTPayload     = jwtErr(ErrJWTMalformed, "payload is not a JSON object")
	errJWTPayloadLen  = jwtErr(ErrJWTMalformed, "payload longer than 8 KiB")
	errJWTDuplicate   = jwtErr(ErrJWTMalformed, "header or payload has a name twice in one object")
	errJWTNoKey       = jwtErr(ErrJWTNoKey, "no configured key has the token's alg and kid")
	errJWTBadSig      = jwtErr(ErrJWTSignature, "signature does not verify with any matching key")
	errJWTExp         = jwtErr(ErrJWTExpired, "token has expired (exp)")
	errJWTNbf         = jwtErr(ErrJWTExpired, "token is not valid yet (nbf)")
	errJWTExpType     = jwtErr(ErrJWTClaims, "exp must be a number")
	errJWTNoExp       = jwtErr(ErrJWTClaims, "token has no exp and require_exp is set")
	errJWTNbfType     = jwtErr(ErrJWTClaims, "nbf must be a number")
	errJWTIss         = jwtErr(ErrJWTClaims, "iss is not the configured issuer")
	errJWTAud         = jwtErr(ErrJWTClaims, "aud names none of the configured audiences")
	errJWTSrcNoSource = jwtErr(ErrJWTNoKey, "no identity source")
)

var b64url = base64.RawURLEncoding.Strict()

// ParseJWTKey builds a verification key. HS256 takes secret (at least 32
// bytes, RFC 7518 §3.2); RS256 and ES256 take pemText holding a "PUBLIC
// KEY" (PKIX), a "CERTIFICATE" (only its key is used), or for RS256 an
// "RSA PUBLIC KEY" (PKCS #1).
func ParseJWTKey(alg, kid string, secret []byte, pemText string) (JWTKey, error) {
	k := JWTKey{ID: kid, Alg: alg}
	switch alg {
	case "HS256":
		if pemText != "" {
			return k, errors.New("HS256 takes a secret, not a PEM key")
		}
		if len(secret) < 32 {
			return k, errors.New("HS256 secret must be at least 32 bytes")
		}
		k.Secret = append([]byte(nil), secret...)
		return k, nil
	case "RS256", "ES256":
		if len(secret) != 0 {
			return k, errors.New(alg + " takes a PEM public key, not a secret")
		}
		pub, err := parsePEMPublicKey(pemText)
		if err != nil {
			return k, err
		}
		switch pk := pub.(type) {
		case *rsa.PublicKey:
			if alg != "RS256" {
				return k, errors.New("ES256 needs an EC P-256 key, the PEM holds an RSA key")
			}
			if pk.N.BitLen() < 2048 {
				return k, errors.New("RS256 key must have at least 2048 bits")
			}
			// crypto/rsa refuses to verify with these, so every token
			// would fail: refuse the key now instead.
			if pk.N.Bit(0) == 0 {
				return k, errors.New("RS256 key's modulus is even")
			}
			if pk.E < 3 || pk.E%2 == 0 {
				return k, errors.New("RS256 key's public exponent must be odd and at least 3")
			}
		case *ecdsa.PublicKey:
			// The parser returns EC keys on P-256 only.
			if alg != "ES256" {
				return k, errors.New("RS256 needs an RSA key, the PEM holds an EC key")
			}
		default:
			return k, errors.New(alg + ": the PEM holds an unsupported key type")
		}
		k.PublicKey = pub
		return k, nil
	case "":
		return k, errors.New("alg is required (HS256, RS256 or ES256)")
	}
	return k, errors.New("alg " + quote(alg) + " is not supported (HS256, RS256 or ES256)")
}

func parsePEMPublicKey(text string) (any, error) {
	block, rest := pem.Decode([]byte(text))
	if block == nil {
		return nil, errors.New("no PEM block found in the key")
	}
	if len(strings.TrimSpace(string(rest))) != 0 {
		return nil, errors.New("the key holds more than one PEM block")
	}
	switch block.Type {
	case "PUBLIC KEY":
		pub, err := parseSPKIKey(block.Bytes)
		if err != nil {
			return nil, errors.New("PUBLIC KEY: " + err.Error())
		}
		return pub, nil
	case "RSA PUBLIC KEY":
		pub, err := parsePKCS1Key(block.Bytes)
		if err != nil {
			return nil, errors.New("RSA PUBLIC KEY: " + err.Error())
		}
		return pub, nil
	case "CERTIFICATE":
		pub, err := parseCertificateKey(block.Bytes)
		if err != nil {
			return nil, errors.New("CERTIFICATE: " + err.Error())
		}
		return pub, nil
	}
	return nil, errors.New("PEM block " + quote(block.Type) + " is not a public key (want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE)")
}

func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return `"` + s + `"`
}

// VerifyJWT verifies the bearer token in authValue (an Authorization header
// value, "Bearer " optional) with src's keys and claim checks at time
// nowUnix, and returns the decoded payload JSON for reading claims.
func VerifyJWT(authValue string, src *IdentitySource, nowUnix int64) ([]byte, error) {
	if src == nil {
		return nil, errJWTSrcNoSource
	}
	token := bearerToken(authValue)
	if token == "" {
		return nil, errJWTEmpty
	}
	if len(token) > MaxJWTLen {
		return nil, errJWTTooLong
	}
	// Only the base64url alphabet and the two dots: encoding/base64 skips
	// CR and LF, so without this a token with line breaks in its signature
	// would verify as another spelling of the same token.
	for i := 0; i < len(token); i++ {
		if !jwtByte[token[i]] {
			return nil, errJWTBase64
		}
	}
	dot1 := strings.IndexByte(token, '.')
	if dot1 < 0 {
		return nil, errJWTParts
	}
	dot2 := dot1 + 1 + strings.IndexByte(token[dot1+1:], '.')
	if dot2 <= dot1 || strings.IndexByte(token[dot2+1:], '.') >= 0 {
		return nil, errJWTParts
	}
	headerB64, payloadB64, sigB64 := token[:dot1], token[dot1+1:dot2], token[dot2+1:]
	if headerB64 == "" || payloadB64 == "" || sigB64 == "" {
		return nil, errJWTParts
	}

	// Each part is decoded once into a string, which gjson reads without
	// copying (ParseBytes would copy).
	header, ok := decodeB64(headerB64)
	if !ok {
		return nil, errJWTBase64
	}
	if !gjson.Valid(header) {
		return nil, errJWTHeader
	}
	h := gjson.Parse(header)
	if !h.IsObject() {
		return nil, errJWTHeader
	}
	algRes := h.Get("alg")
	if algRes.Type != gjson.String {
		return nil, errJWTAlg
	}
	alg := algRes.Str
	if alg != "HS256" && alg != "RS256" && alg != "ES256" {
		return nil, errJWTAlg
	}
	kidRes := h.Get("kid")
	if kidRes.Exists() && kidRes.Type != gjson.String {
		return nil, errJWTKid
	}
	// RFC 7515 §4.1.11: extensions listed in crit must be understood; we
	// understand none (this also refuses unencoded payloads, RFC 7797).
	if h.Get("crit").Exists() {
		return nil, errJWTCrit
	}
	sigText, ok := decodeB64(sigB64)
	if !ok {
		return nil, errJWTBase64
	}
	sig := []byte(sigText)

	signed := token[:dot2]
	matched, verified := false, false
	for i := range src.Keys {
		k := &src.Keys[i]
		if k.Alg != alg || (k.ID != "" && k.ID != kidRes.Str) {
			continue
		}
		matched = true
		if verifyJWTSignature(k, signed, sig) {
			verified = true
			break
		}
	}
	if !matched {
		return nil, errJWTNoKey
	}
	if !verified {
		return nil, errJWTBadSig
	}

	payload, ok := decodeB64(payloadB64)
	if !ok {
		return nil, errJWTBase64
	}
	if !gjson.Valid(payload) {
		return nil, errJWTPayload
	}
	p := gjson.Parse(payload)
	if !p.IsObject() {
		return nil, errJWTPayload
	}
	// Checked once the signature verifies: the issuer wrote both, and a
	// check of a header no key signed would only cost time.
	// A JOSE header or a claims set with a name twice must be refused or
	// read by its last value (RFC 7515 §4, RFC 7519 §4); claims here are
	// read by their first, so refused, at every depth, since a claim path
	// may lead into a claim's own object.
	if _, dup := RepeatedName(h); dup {
		return nil, errJWTDuplicate
	}
	if _, dup := RepeatedName(p); dup {
		return nil, errJWTDuplicate
	}
	if err := checkClaims(p, src, nowUnix); err != nil {
		return nil, err
	}
	return []byte(payload), nil
}

// decodeB64 decodes strict unpadded base64url into a string.
func decodeB64(s string) (string, bool) {
	var buf [MaxJWTLen * 3 / 4]byte // len(s) <= MaxJWTLen
	n, err := b64url.Decode(buf[:], []byte(s))
	if err != nil {
		return "", false
	}
	return string(buf[:n]), true
}

// bearerToken strips a "Bearer" scheme (any case, one or more spaces) and
// surrounding whitespace.
func bearerToken(v string) string {
	v = strings.TrimSpace(v)
	const scheme = "bearer"
	if len(v) > len(scheme) && (v[len(scheme)] == ' ' || v[len(scheme)] == '\t') && equalFoldLower(v[:len(scheme)], scheme) {
		v = strings.TrimLeft(v[len(scheme):], " \t")
	}
	return v
}

func verifyJWTSignature(k *JWTKey, signed string, sig []byte) bool {
	if k.Alg != "HS256" {
		digest := sha256.Sum256([]byte(signed))
		return verifyJWTDigest(k, digest[:], sig)
	}
	if len(k.Secret) == 0 || len(sig) != sha256.Size {
		return false
	}
	mac := hmac.New(sha256.New, k.Secret)
	mac.Write([]byte(signed))
	var sum [sha256.Size]byte
	return hmac.Equal(mac.Sum(sum[:0]), sig)
}

func verifyJWTDigest(k *JWTKey, digest, sig []byte) bool {
	switch k.Alg {
	case "RS256":
		pub, ok := k.PublicKey.(*rsa.PublicKey)
		return ok && rsa.VerifyPKCS1v15(pub, crypto.SHA256, digest, sig) == nil
	case "ES256":
		pub, ok := k.PublicKey.(*ecdsa.PublicKey)
		// JOSE writes ECDSA signatures as fixed-size r||s (RFC 7518 §3.4),
		// not ASN.1.
		if !ok || len(sig) != 64 {
			return false
		}
		r := new(big.Int).SetBytes(sig[:32])
		s := new(big.Int).SetBytes(sig[32:])
		return ecdsa.Verify(pub, digest, r, s)
	}
	return false
}

func checkClaims(p gjson.Result, src *IdentitySource, now int64) error {
	if exp := p.Get("exp"); !exp.Exists() && src.RequireExp {
		return errJWTNoExp
	} else if exp.Exists() {
		if exp.Type != gjson.Number {
			return errJWTExpType
		}
		if !(exp.Num > float64(now-src.LeewaySec)) {
			return errJWTExp
		}
	}
	if nbf := p.Get("nbf"); nbf.Exists() {
		if nbf.Type != gjson.Number {
			return errJWTNbfType
		}
		if !(nbf.Num <= float64(now+src.LeewaySec)) {
			return errJWTNbf
		}
	}
	if src.Issuer != "" {
		if iss := p.Get("iss"); iss.Type != gjson.String || iss.Str != src.Issuer {
			return errJWTIss
		}
	}
	if len(src.Audiences) > 0 {
		aud := p.Get("aud")
		ok := false
		switch {
		case aud.Type == gjson.String:
			ok = containsString(src.Audiences, aud.Str)
		case aud.IsArray():
			aud.ForEach(func(_, v gjson.Result) bool {
				ok = v.Type == gjson.String && containsString(src.Audiences, v.Str)
				return !ok
			})
		}
		if !ok {
			return errJWTAud
		}
	}
	return nil
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// DecodeJWTPayload decodes a payload that a verifying filter forwarded in a
// header (Envoy jwt_authn forward_payload_header): base64url, padded or
// not, of a JSON object of at most 8 KiB. The header must only be trusted
// when the proxy strips it from client requests.
func DecodeJWTPayload(headerValue string) ([]byte, error) {
	v := strings.TrimSpace(headerValue)
	if v == "" {
		return nil, errJWTEmpty
	}
	if len(v) > base64.URLEncoding.EncodedLen(MaxJWTLen) {
		return nil, errJWTPayloadLen
	}
	if len(v)%4 == 0 {
		// Padded: at most two '=' at the very end.
		for i := 0; i < 2 && strings.HasSuffix(v, "="); i++ {
			v = v[:len(v)-1]
		}
	}
	payload, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil {
		return nil, errJWTBase64
	}
	if len(payload) > MaxJWTLen {
		return nil, errJWTPayloadLen
	}
	if !gjson.ValidBytes(payload) || !gjson.ParseBytes(payload).IsObject() {
		return nil, errJWTPayload
	}
	if _, dup := RepeatedName(gjson.ParseBytes(payload)); dup {
		return nil, errJWTDuplicate // as for a verified token's
	}
	return payload, nil
}

// Claim reads the claim at a gjson path in a payload as an identity: a
// non-empty string of at most 255 bytes, or a number as its JSON text.
func Claim(payload []byte, path string) (string, bool) {
	r := gjson.GetBytes(payload, path)
	var s string
	switch r.Type {
	case gjson.String:
		s = r.Str
	case gjson.Number:
		s = r.Raw
	default:
		return "", false
	}
	if s == "" || len(s) > maxClaimLen {
		return "", false
	}
	return s, true
}
