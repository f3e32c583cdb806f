package rules

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

const testNow = 1_750_000_000

// Test keys are generated once per test binary: RSA generation is slow.
var testKeys = sync.OnceValue(func() (k struct {
	hsSecret, hsSecret2 []byte
	rsa, rsa2           *rsa.PrivateKey
	ec, ec2             *ecdsa.PrivateKey
	rsaPKIX, rsaPKCS1   string
	rsaCert, ecPKIX     string
	ecCert              string
}) {
	k.hsSecret = []byte("0123456789abcdef0123456789abcdef")
	k.hsSecret2 = []byte("fedcba9876543210fedcba9876543210")
	var err error
	if k.rsa, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		panic(err)
	}
	if k.rsa2, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		panic(err)
	}
	if k.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		panic(err)
	}
	if k.ec2, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		panic(err)
	}
	k.rsaPKIX = pkixPEM(&k.rsa.PublicKey)
	k.rsaPKCS1 = string(pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&k.rsa.PublicKey)}))
	k.rsaCert = certPEM(k.rsa, &k.rsa.PublicKey)
	k.ecPKIX = pkixPEM(&k.ec.PublicKey)
	k.ecCert = certPEM(k.ec, &k.ec.PublicKey)
	return k
})

func pkixPEM(pub any) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		panic(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

func certPEM(priv crypto.Signer, pub any) string {
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "sluice test"},
		NotBefore:    time.Unix(testNow-3600, 0),
		NotAfter:     time.Unix(testNow+3600, 0),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		panic(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// signJWT builds a compact JWS over header and payload JSON with key:
// []byte for HS256, *rsa.PrivateKey for RS256, *ecdsa.PrivateKey for ES256.
func signJWT(t testing.TB, header, payload string, key any) string {
	t.Helper()
	signed := b64(header) + "." + b64(payload)
	digest := sha256.Sum256([]byte(signed))
	var sig []byte
	switch k := key.(type) {
	case []byte:
		m := hmac.New(sha256.New, k)
		m.Write([]byte(signed))
		sig = m.Sum(nil)
	case *rsa.PrivateKey:
		var err error
		if sig, err = rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, digest[:]); err != nil {
			t.Fatal(err)
		}
	case *ecdsa.PrivateKey:
		r, s, err := ecdsa.Sign(rand.Reader, k, digest[:])
		if err != nil {
			t.Fatal(err)
		}
		sig = make([]byte, 64)
		r.FillBytes(sig[:32])
		s.FillBytes(sig[32:])
	default:
		t.Fatalf("signJWT: key type %T", key)
	}
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func mustJWTKey(t testing.TB, alg, kid string, secret []byte, pemText string) JWTKey {
	t.Helper()
	k, err := ParseJWTKey(alg, kid, secret, pemText)
	if err != nil {
		t.Fatalf("ParseJWTKey(%s, %q): %v", alg, kid, err)
	}
	return k
}

func TestParseJWTKey(t *testing.T) {
	k := testKeys()
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecPriv, err := x509.MarshalECPrivateKey(k.ec)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		alg     string
		secret  []byte
		pem     string
		wantErr string
	}{
		{name: "HS256", alg: "HS256", secret: k.hsSecret},
		{name: "RS256 PKIX", alg: "RS256", pem: k.rsaPKIX},
		{name: "RS256 PKCS1", alg: "RS256", pem: k.rsaPKCS1},
		{name: "RS256 certificate", alg: "RS256", pem: k.rsaCert},
		{name: "ES256 PKIX", alg: "ES256", pem: k.ecPKIX},
		{name: "ES256 certificate", alg: "ES256", pem: "\n" + k.ecCert + "\n"},
		{name: "HS256 short secret", alg: "HS256", secret: k.hsSecret[:31], wantErr: "at least 32 bytes"},
		{name: "HS256 with PEM", alg: "HS256", secret: k.hsSecret, pem: k.rsaPKIX, wantErr: "not a PEM"},
		{name: "RS256 with secret", alg: "RS256", secret: k.hsSecret, pem: k.rsaPKIX, wantErr: "not a secret"},
		{name: "RS256 1024 bits", alg: "RS256", pem: pkixPEM(&small.PublicKey), wantErr: "at least 2048 bits"},
		{name: "RS256 even modulus", alg: "RS256", pem: pkixPEM(&rsa.PublicKey{N: new(big.Int).Add(k.rsa.N, big.NewInt(1)), E: 65537}), wantErr: "modulus is even"},
		{name: "RS256 exponent 1", alg: "RS256", pem: pkixPEM(&rsa.PublicKey{N: k.rsa.N, E: 1}), wantErr: "odd and at least 3"},
		{name: "RS256 even exponent", alg: "RS256", pem: pkixPEM(&rsa.PublicKey{N: k.rsa.N, E: 65536}), wantErr: "odd and at least 3"},
		{name: "RS256 PKCS1 labelled PUBLIC KEY", alg: "RS256", pem: strings.ReplaceAll(k.rsaPKCS1, "RSA PUBLIC KEY", "PUBLIC KEY"), wantErr: "PUBLIC KEY: this is a PKCS #1 RSA key"},
		{name: "RS256 EC key", alg: "RS256", pem: k.ecPKIX, wantErr: "needs an RSA key"},
		{name: "ES256 RSA key", alg: "ES256", pem: k.rsaPKIX, wantErr: "needs an EC P-256 key"},
		{name: "ES256 P-384", alg: "ES256", pem: pkixPEM(&p384.PublicKey), wantErr: "P-256"},
		{name: "RS256 no PEM", alg: "RS256", pem: "not a key", wantErr: "no PEM block"},
		{name: "RS256 empty", alg: "RS256", wantErr: "no PEM block"},
		{name: "ES256 private key", alg: "ES256", pem: string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: ecPriv})), wantErr: "not a public key"},
		{name: "RS256 two blocks", alg: "RS256", pem: k.rsaPKIX + k.rsaPKIX, wantErr: "more than one PEM block"},
		{name: "RS256 corrupt DER", alg: "RS256", pem: string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte{1, 2, 3}})), wantErr: "PUBLIC KEY:"},
		{name: "none", alg: "none", wantErr: `"none" is not supported`},
		{name: "HS512", alg: "HS512", secret: k.hsSecret, wantErr: "not supported"},
		{name: "lower-case alg", alg: "hs256", secret: k.hsSecret, wantErr: "not supported"},
		{name: "no alg", alg: "", wantErr: "alg is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseJWTKey(tt.alg, "kid1", tt.secret, tt.pem)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Alg != tt.alg || got.ID != "kid1" {
				t.Fatalf("got alg %q id %q", got.Alg, got.ID)
			}
			switch tt.alg {
			case "HS256":
				if string(got.Secret) != string(tt.secret) || got.PublicKey != nil {
					t.Fatal("HS256 key does not hold exactly the secret")
				}
			case "RS256":
				if pub, ok := got.PublicKey.(*rsa.PublicKey); !ok || !pub.Equal(&k.rsa.PublicKey) {
					t.Fatalf("public key = %T, not the test RSA key", got.PublicKey)
				}
			case "ES256":
				if pub, ok := got.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&k.ec.PublicKey) {
					t.Fatalf("public key = %T, not the test EC key", got.PublicKey)
				}
			}
		})
	}
}

func TestParseJWTKey_copiesSecret(t *testing.T) {
	secret := []byte(strings.Repeat("s", 32))
	k := mustJWTKey(t, "HS256", "", secret, "")
	secret[0] = 'x'
	if k.Secret[0] != 's' {
		t.Fatal("the key aliases the caller's secret")
	}
}

func TestVerifyJWT(t *testing.T) {
	k := testKeys()
	hs := mustJWTKey(t, "HS256", "", k.hsSecret, "")
	rs := mustJWTKey(t, "RS256", "", nil, k.rsaPKIX)
	rsKid := mustJWTKey(t, "RS256", "r1", nil, k.rsaPKIX)
	es := mustJWTKey(t, "ES256", "", nil, k.ecPKIX)
	hsA := mustJWTKey(t, "HS256", "a", k.hsSecret, "")
	hsB := mustJWTKey(t, "HS256", "b", k.hsSecret2, "")

	hsSrc := &IdentitySource{Keys: []JWTKey{hs}, LeewaySec: 30}
	rsSrc := &IdentitySource{Keys: []JWTKey{rs}, LeewaySec: 30}
	esSrc := &IdentitySource{Keys: []JWTKey{es}, LeewaySec: 30}
	allSrc := &IdentitySource{Keys: []JWTKey{rsKid, es, hsB}, LeewaySec: 30}
	kidSrc := &IdentitySource{Keys: []JWTKey{hsA, hsB}}
	claimSrc := &IdentitySource{Keys: []JWTKey{hs}, Issuer: "https://issuer.example", Audiences: []string{"api", "admin"}}

	const hsHdr = `{"alg":"HS256","typ":"JWT"}`
	const body = `{"sub":"alice","exp":1750000100}`
	valid := signJWT(t, hsHdr, body, k.hsSecret)
	tampered := valid[:strings.IndexByte(valid, '.')+1] + b64(`{"sub":"mallory","exp":1750000100}`) + valid[strings.LastIndexByte(valid, '.'):]
	parts := strings.Split(valid, ".")
	rsaPubPEM := []byte(k.rsaPKIX)

	// An ES256 signature in ASN.1 DER, as crypto/ecdsa writes it, is not JOSE.
	esSigned := b64(`{"alg":"ES256"}`) + "." + b64(body)
	esDigest := sha256.Sum256([]byte(esSigned))
	der, err := ecdsa.SignASN1(rand.Reader, k.ec, esDigest[:])
	if err != nil {
		t.Fatal(err)
	}
	esDER := esSigned + "." + base64.RawURLEncoding.EncodeToString(der)

	tests := []struct {
		name    string
		auth    string
		src     *IdentitySource
		wantSub string
		wantErr error
	}{
		{"HS256", "Bearer " + valid, hsSrc, "alice", nil},
		{"HS256 no scheme", valid, hsSrc, "alice", nil},
		{"HS256 scheme any case, spaces", "bEaReR   " + valid + " ", hsSrc, "alice", nil},
		{"RS256", "Bearer " + signJWT(t, `{"alg":"RS256"}`, body, k.rsa), rsSrc, "alice", nil},
		{"ES256", "Bearer " + signJWT(t, `{"alg":"ES256"}`, body, k.ec), esSrc, "alice", nil},
		{"mixed keys, RS256 by kid", signJWT(t, `{"alg":"RS256","kid":"r1"}`, body, k.rsa), allSrc, "alice", nil},
		{"mixed keys, ES256 any kid", signJWT(t, `{"alg":"ES256","kid":"whatever"}`, body, k.ec), allSrc, "alice", nil},
		{"mixed keys, HS256 by kid", signJWT(t, `{"alg":"HS256","kid":"b"}`, body, k.hsSecret2), allSrc, "alice", nil},

		// Wrong keys and forgeries.
		{"HS256 wrong secret", signJWT(t, hsHdr, body, k.hsSecret2), hsSrc, "", ErrJWTSignature},
		{"RS256 wrong key", signJWT(t, `{"alg":"RS256"}`, body, k.rsa2), rsSrc, "", ErrJWTSignature},
		{"ES256 wrong key", signJWT(t, `{"alg":"ES256"}`, body, k.ec2), esSrc, "", ErrJWTSignature},
		{"ES256 DER signature", esDER, esSrc, "", ErrJWTSignature},
		{"tampered payload", tampered, hsSrc, "", ErrJWTSignature},
		{"alg confusion: HS256 with the RSA public key as secret", signJWT(t, hsHdr, body, rsaPubPEM), rsSrc, "", ErrJWTNoKey},
		{"alg confusion with the key's kid", signJWT(t, `{"alg":"HS256","kid":"r1"}`, body, rsaPubPEM), allSrc, "", ErrJWTNoKey},
		{"RS256 token, only an HS256 key", signJWT(t, `{"alg":"RS256"}`, body, k.rsa), hsSrc, "", ErrJWTNoKey},
		{"alg none, empty signature", b64(`{"alg":"none"}`) + "." + b64(body) + ".", hsSrc, "", ErrJWTMalformed},
		{"alg none, some signature", b64(`{"alg":"none"}`) + "." + b64(body) + ".AAAA", hsSrc, "", ErrJWTMalformed},
		{"alg None", signJWT(t, `{"alg":"None"}`, body, k.hsSecret), hsSrc, "", ErrJWTMalformed},
		{"alg HS512", signJWT(t, `{"alg":"HS512"}`, body, k.hsSecret), hsSrc, "", ErrJWTMalformed},

		// A name twice in one object: refused, not read by its first.
		{"a claim twice", signJWT(t, hsHdr, `{"sub":"alice","sub":"admin"}`, k.hsSecret), hsSrc, "", errJWTDuplicate},
		{"a claim twice, once escaped", signJWT(t, hsHdr, `{"sub":"alice","s\u0075b":"admin"}`, k.hsSecret), hsSrc, "", errJWTDuplicate},
		{"a header name twice", signJWT(t, `{"alg":"HS256","typ":"JWT","typ":"x"}`, body, k.hsSecret), hsSrc, "", errJWTDuplicate},
		{"a name twice in a claim's object", signJWT(t, hsHdr, `{"sub":"alice","org":{"id":1,"id":2}}`, k.hsSecret), hsSrc, "", errJWTDuplicate},
		{"a name twice in a list's object", signJWT(t, hsHdr, `{"sub":"alice","l":[1,{"x":1,"x":1}]}`, k.hsSecret), hsSrc, "", errJWTDuplicate},
		{"one name in two objects", signJWT(t, hsHdr, `{"sub":"alice","a":{"id":1},"b":{"id":1,"sub":2},"l":[{"id":1},{"id":1}]}`, k.hsSecret), hsSrc, "alice", nil},

		// Key selection by kid.
		{"kid a", signJWT(t, `{"alg":"HS256","kid":"a"}`, body, k.hsSecret), kidSrc, "alice", nil},
		{"kid b", signJWT(t, `{"alg":"HS256","kid":"b"}`, body, k.hsSecret2), kidSrc, "alice", nil},
		{"kid a signed with b's secret", signJWT(t, `{"alg":"HS256","kid":"a"}`, body, k.hsSecret2), kidSrc, "", ErrJWTSignature},
		{"unknown kid", signJWT(t, `{"alg":"HS256","kid":"c"}`, body, k.hsSecret), kidSrc, "", ErrJWTNoKey},
		{"no kid, keys all named", signJWT(t, hsHdr, body, k.hsSecret), kidSrc, "", ErrJWTNoKey},
		{"kid not a string", signJWT(t, `{"alg":"HS256","kid":1}`, body, k.hsSecret), hsSrc, "", ErrJWTMalformed},
		{"no keys", valid, &IdentitySource{}, "", ErrJWTNoKey},

		// Time claims (now = testNow, leeway 30 s).
		{"exp within leeway", signJWT(t, hsHdr, `{"sub":"alice","exp":1749999980}`, k.hsSecret), hsSrc, "alice", nil},
		{"exp at the leeway edge", signJWT(t, hsHdr, `{"sub":"alice","exp":1749999970}`, k.hsSecret), hsSrc, "", ErrJWTExpired},
		{"exp long past", signJWT(t, hsHdr, `{"sub":"alice","exp":1}`, k.hsSecret), hsSrc, "", ErrJWTExpired},
		{"exp fractional", signJWT(t, hsHdr, `{"sub":"alice","exp":1750000000.5}`, k.hsSecret), hsSrc, "alice", nil},
		{"exp a string", signJWT(t, hsHdr, `{"sub":"alice","exp":"1750000100"}`, k.hsSecret), hsSrc, "", ErrJWTClaims},
		{"exp null", signJWT(t, hsHdr, `{"sub":"alice","exp":null}`, k.hsSecret), hsSrc, "", ErrJWTClaims},
		{"no exp", signJWT(t, hsHdr, `{"sub":"alice"}`, k.hsSecret), hsSrc, "alice", nil},
		{"no leeway", signJWT(t, hsHdr, `{"sub":"alice","exp":1749999990}`, k.hsSecret), &IdentitySource{Keys: []JWTKey{hs}}, "", ErrJWTExpired},
		{"nbf within leeway", signJWT(t, hsHdr, `{"sub":"alice","nbf":1750000030}`, k.hsSecret), hsSrc, "alice", nil},
		{"nbf in the future", signJWT(t, hsHdr, `{"sub":"alice","nbf":1750000031}`, k.hsSecret), hsSrc, "", ErrJWTExpired},
		{"nbf a string", signJWT(t, hsHdr, `{"sub":"alice","nbf":"0"}`, k.hsSecret), hsSrc, "", ErrJWTClaims},

		// Issuer and audience.
		{"iss and aud string", signJWT(t, hsHdr, `{"sub":"alice","iss":"https://issuer.example","aud":"admin"}`, k.hsSecret), claimSrc, "alice", nil},
		{"aud array", signJWT(t, hsHdr, `{"sub":"alice","iss":"https://issuer.example","aud":["web",3,"api"]}`, k.hsSecret), claimSrc, "alice", nil},
		{"wrong iss", signJWT(t, hsHdr, `{"sub":"alice","iss":"https://evil.example","aud":"api"}`, k.hsSecret), claimSrc, "", ErrJWTClaims},
		{"no iss", signJWT(t, hsHdr, `{"sub":"alice","aud":"api"}`, k.hsSecret), claimSrc, "", ErrJWTClaims},
		{"iss not a string", signJWT(t, hsHdr, `{"sub":"alice","iss":["https://issuer.example"],"aud":"api"}`, k.hsSecret), claimSrc, "", ErrJWTClaims},
		{"wrong aud", signJWT(t, hsHdr, `{"sub":"alice","iss":"https://issuer.example","aud":"web"}`, k.hsSecret), claimSrc, "", ErrJWTClaims},
		{"aud array without ours", signJWT(t, hsHdr, `{"sub":"alice","iss":"https://issuer.example","aud":["web",["api"]]}`, k.hsSecret), claimSrc, "", ErrJWTClaims},
		{"no aud", signJWT(t, hsHdr, `{"sub":"alice","iss":"https://issuer.example"}`, k.hsSecret), claimSrc, "", ErrJWTClaims},
		{"aud ignored when not configured", signJWT(t, hsHdr, `{"sub":"alice","aud":"web"}`, k.hsSecret), hsSrc, "alice", nil},

		// Malformed tokens.
		{"empty", "", hsSrc, "", ErrJWTMalformed},
		{"scheme only", "Bearer ", hsSrc, "", ErrJWTMalformed},
		{"other scheme", "Basic " + valid, hsSrc, "", ErrJWTMalformed},
		{"two parts", parts[0] + "." + parts[1], hsSrc, "", ErrJWTMalformed},
		{"four parts", valid + ".x", hsSrc, "", ErrJWTMalformed},
		{"empty header", "." + parts[1] + "." + parts[2], hsSrc, "", ErrJWTMalformed},
		{"empty payload", parts[0] + ".." + parts[2], hsSrc, "", ErrJWTMalformed},
		{"padded signature", valid + "=", hsSrc, "", ErrJWTMalformed},
		{"std base64 alphabet", parts[0] + "." + parts[1] + "." + strings.NewReplacer("-", "+", "_", "/").Replace(parts[2]) + "+", hsSrc, "", ErrJWTMalformed},
		{"non-canonical signature bits", parts[0] + "." + parts[1] + "." + flipLastBits(parts[2]), hsSrc, "", ErrJWTMalformed},
		{"header not JSON", b64(`{alg:HS256}`) + "." + parts[1] + "." + parts[2], hsSrc, "", ErrJWTMalformed},
		{"header an array", signJWT(t, `["HS256"]`, body, k.hsSecret), hsSrc, "", ErrJWTMalformed},
		{"header without alg", signJWT(t, `{"typ":"JWT"}`, body, k.hsSecret), hsSrc, "", ErrJWTMalformed},
		{"alg a number", signJWT(t, `{"alg":256}`, body, k.hsSecret), hsSrc, "", ErrJWTMalformed},
		{"crit header", signJWT(t, `{"alg":"HS256","crit":["b64"],"b64":false}`, body, k.hsSecret), hsSrc, "", ErrJWTMalformed},
		{"payload an array", signJWT(t, hsHdr, `["alice"]`, k.hsSecret), hsSrc, "", ErrJWTMalformed},
		{"payload not JSON", signJWT(t, hsHdr, `sub=alice`, k.hsSecret), hsSrc, "", ErrJWTMalformed},
		{"too long", signJWT(t, hsHdr, `{"sub":"alice","pad":"`+strings.Repeat("x", MaxJWTLen)+`"}`, k.hsSecret), hsSrc, "", ErrJWTMalformed},
		{"space inside", parts[0][:4] + " " + parts[0][4:] + "." + parts[1] + "." + parts[2], hsSrc, "", ErrJWTMalformed},
		{"space in the payload", parts[0] + ". " + parts[1] + "." + parts[2], hsSrc, "", ErrJWTMalformed},
		{"line break in the signature", parts[0] + "." + parts[1] + "." + parts[2][:5] + "\n" + parts[2][5:], hsSrc, "", ErrJWTMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload, err := VerifyJWT(tt.auth, tt.src, testNow)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("error = %v, want %v", err, tt.wantErr)
				}
				if payload != nil {
					t.Fatal("payload returned with an error")
				}
				return
			}
			if err != nil {
				t.Fatalf("VerifyJWT: %v", err)
			}
			if sub := gjson.GetBytes(payload, "sub").Str; sub != tt.wantSub {
				t.Fatalf("sub = %q, want %q", sub, tt.wantSub)
			}
		})
	}
}

// flipLastBits changes the unused low bits of the last base64url
// character: lenient decoders read the same bytes, strict ones refuse.
func flipLastBits(s string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, s[len(s)-1])
	return s[:len(s)-1] + string(alphabet[last^1])
}

func TestVerifyJWT_nilSource(t *testing.T) {
	if _, err := VerifyJWT("a.b.c", nil, testNow); !errors.Is(err, ErrJWTNoKey) {
		t.Fatalf("error = %v, want ErrJWTNoKey", err)
	}
}

func TestDecodeJWTPayload(t *testing.T) {
	obj := `{"sub":"alice","n":1}`
	tests := []struct {
		name    string
		in      string
		want    string
		wantErr error
	}{
		{"unpadded", base64.RawURLEncoding.EncodeToString([]byte(obj)), obj, nil},
		{"padded", base64.URLEncoding.EncodeToString([]byte(obj)), obj, nil},
		{"one pad", base64.URLEncoding.EncodeToString([]byte(`{"a":"bc"}`)), `{"a":"bc"}`, nil},
		{"spaces around", "  " + base64.RawURLEncoding.EncodeToString([]byte(obj)) + " ", obj, nil},
		{"url alphabet", base64.RawURLEncoding.EncodeToString([]byte(`{"k":"??>>"}`)), `{"k":"??>>"}`, nil},
		{"std alphabet", base64.RawStdEncoding.EncodeToString([]byte(`{"k":"??>>"}`)), "", ErrJWTMalformed},
		{"empty", "", "", ErrJWTMalformed},
		{"bad padding", base64.RawURLEncoding.EncodeToString([]byte(obj)) + "=", "", ErrJWTMalformed},
		{"three pads", "e30===", "", ErrJWTMalformed},
		{"not JSON", b64("sub=alice"), "", ErrJWTMalformed},
		{"array", b64(`["alice"]`), "", ErrJWTMalformed},
		{"string", b64(`"alice"`), "", ErrJWTMalformed},
		{"a whole JWT", "e30.e30.e30", "", ErrJWTMalformed},
		{"a claim twice", b64(`{"sub":"alice","n":1,"sub":"admin"}`), "", errJWTDuplicate},
		{"a name twice in a claim's object", b64(`{"sub":"alice","o":{"a":1,"b":{},"a":2}}`), "", errJWTDuplicate},
		{"8 KiB", b64(`{"p":"` + strings.Repeat("x", MaxJWTLen-8) + `"}`), `{"p":"` + strings.Repeat("x", MaxJWTLen-8) + `"}`, nil},
		{"over 8 KiB", b64(`{"p":"` + strings.Repeat("x", MaxJWTLen-7) + `"}`), "", ErrJWTMalformed},
		{"far over 8 KiB", b64(`{"p":"` + strings.Repeat("x", 4*MaxJWTLen) + `"}`), "", ErrJWTMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeJWTPayload(tt.in)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("error = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil || string(got) != tt.want {
				t.Fatalf("DecodeJWTPayload = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestClaim(t *testing.T) {
	payload := []byte(`{"sub":"alice","uid":12345,"big":1e3,"neg":-7,"empty":"","admin":true,"nil":null,
		"realm":{"user":"bob"},"groups":["a","b"],"long":"` + strings.Repeat("x", 256) + `","max":"` + strings.Repeat("y", 255) + `"}`)
	tests := []struct {
		path string
		want string
		ok   bool
	}{
		{"sub", "alice", true},
		{"uid", "12345", true},
		{"big", "1e3", true},
		{"neg", "-7", true},
		{"realm.user", "bob", true},
		{"groups.1", "b", true},
		{"max", strings.Repeat("y", 255), true},
		{"long", "", false},
		{"empty", "", false},
		{"admin", "", false},
		{"nil", "", false},
		{"realm", "", false},
		{"groups", "", false},
		{"missing", "", false},
	}
	for _, tt := range tests {
		got, ok := Claim(payload, tt.path)
		if got != tt.want || ok != tt.ok {
			t.Errorf("Claim(%q) = %q, %v; want %q, %v", tt.path, got, ok, tt.want, tt.ok)
		}
	}
	if _, ok := Claim(nil, "sub"); ok {
		t.Error("Claim on an empty payload found something")
	}
}

func FuzzVerifyJWT(f *testing.F) {
	k := testKeys()
	src := &IdentitySource{
		Keys: []JWTKey{
			mustJWTKey(f, "HS256", "", k.hsSecret, ""),
			mustJWTKey(f, "RS256", "r", nil, k.rsaPKIX),
			mustJWTKey(f, "ES256", "", nil, k.ecPKIX),
		},
		LeewaySec: 30,
	}
	// The only tokens that may verify are the ones signed here.
	issued := map[string]bool{}
	for _, tok := range []string{
		signJWT(f, `{"alg":"HS256"}`, `{"sub":"a"}`, k.hsSecret),
		signJWT(f, `{"alg":"RS256","kid":"r"}`, `{"sub":"b","exp":1750000100}`, k.rsa),
		signJWT(f, `{"alg":"ES256"}`, `{"sub":"c","aud":["x"]}`, k.ec),
	} {
		issued[tok] = true
		f.Add("Bearer " + tok)
		f.Add(tok[:len(tok)-2])
		f.Add(strings.Replace(tok, ".", "..", 1))
	}
	f.Add(signJWT(f, `{"alg":"HS256"}`, `{"sub":"a"}`, []byte(k.rsaPKIX)))
	f.Add(b64(`{"alg":"none"}`) + "." + b64(`{"sub":"a"}`) + ".")
	f.Add("Bearer")
	f.Add("")
	f.Fuzz(func(t *testing.T, auth string) {
		payload, err := VerifyJWT(auth, src, testNow)
		if err == nil {
			if !issued[bearerToken(auth)] {
				t.Fatalf("a token that was never signed verified: %q", auth)
			}
			if !gjson.ValidBytes(payload) {
				t.Fatal("verified payload is not valid JSON")
			}
			return
		}
		if payload != nil {
			t.Fatal("payload returned with an error")
		}
		for _, sentinel := range []error{ErrJWTMalformed, ErrJWTSignature, ErrJWTExpired, ErrJWTClaims, ErrJWTNoKey} {
			if errors.Is(err, sentinel) {
				return
			}
		}
		t.Fatalf("error %v wraps no sentinel", err)
	})
}

func FuzzDecodeJWTPayload(f *testing.F) {
	f.Add(base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"alice"}`)))
	f.Add(base64.URLEncoding.EncodeToString([]byte(`{"sub":"al"}`)))
	f.Add("e30")
	f.Add("e30=")
	f.Add("W10")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		payload, err := DecodeJWTPayload(s)
		if err != nil {
			if !errors.Is(err, ErrJWTMalformed) {
				t.Fatalf("error %v is not ErrJWTMalformed", err)
			}
			return
		}
		if len(payload) > MaxJWTLen || !gjson.ValidBytes(payload) || !gjson.ParseBytes(payload).IsObject() {
			t.Fatalf("accepted payload %q", payload)
		}
	})
}

func BenchmarkVerifyJWT(b *testing.B) {
	k := testKeys()
	body := `{"sub":"user-12345","iss":"https://issuer.example","aud":"api","exp":1750003600,"iat":1749996400}`
	for _, bc := range []struct {
		alg string
		key JWTKey
		tok string
	}{
		{"HS256", mustJWTKey(b, "HS256", "", k.hsSecret, ""), signJWT(b, `{"alg":"HS256","typ":"JWT"}`, body, k.hsSecret)},
		{"RS256", mustJWTKey(b, "RS256", "", nil, k.rsaPKIX), signJWT(b, `{"alg":"RS256","typ":"JWT"}`, body, k.rsa)},
		{"ES256", mustJWTKey(b, "ES256", "", nil, k.ecPKIX), signJWT(b, `{"alg":"ES256","typ":"JWT"}`, body, k.ec)},
	} {
		src := &IdentitySource{Keys: []JWTKey{bc.key}, Issuer: "https://issuer.example", Audiences: []string{"api"}, LeewaySec: 30}
		auth := "Bearer " + bc.tok
		b.Run(bc.alg, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := VerifyJWT(auth, src, testNow); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("rejected_garbage", func(b *testing.B) {
		src := &IdentitySource{Keys: []JWTKey{mustJWTKey(b, "HS256", "", k.hsSecret, "")}}
		b.ReportAllocs()
		for b.Loop() {
			VerifyJWT("Bearer eyJhbGciOiJub25lIn0.e30.", src, testNow)
		}
	})
}

func BenchmarkClaim(b *testing.B) {
	payload := []byte(`{"sub":"user-12345","iss":"https://issuer.example","aud":"api","exp":1750003600}`)
	b.ReportAllocs()
	for b.Loop() {
		Claim(payload, "sub")
	}
}
