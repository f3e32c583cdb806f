// Package jwttest signs JSON Web Tokens for tests, with HMAC-SHA256: the
// one signer the project's tests share.
package jwttest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
)

// Sign signs header and claims, JSON texts, with HMAC-SHA256 under secret,
// whatever alg the header names, and returns the compact token.
func Sign(header, claims, secret string) string {
	enc := base64.RawURLEncoding
	signing := enc.EncodeToString([]byte(header)) + "." + enc.EncodeToString([]byte(claims))
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(signing))
	return signing + "." + enc.EncodeToString(mac.Sum(nil))
}

// HS256 is Sign with the header {"alg":"HS256","typ":"JWT"}.
func HS256(secret, claims string) string {
	return Sign(`{"alg":"HS256","typ":"JWT"}`, claims, secret)
}
