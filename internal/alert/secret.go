package alert

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
)

// The SMTP password is stored sealed with AES-256-GCM under the key of
// Options.SecretKey (kept in the data directory's secrets.json, mode 0600):
// a copy of the database alone does not reveal it.

const sealPrefix = "v1:"

var sealAD = []byte("drover smtp password")

func newAEAD(key []byte) (cipher.AEAD, error) {
	if len(key) != 32 {
		return nil, errors.New("secret key must be 32 bytes")
	}
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// seal encrypts plain under key.
func seal(key []byte, plain string) (string, error) {
	aead, err := newAEAD(key)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	out := aead.Seal(nonce, nonce, []byte(plain), sealAD)
	return sealPrefix + base64.StdEncoding.EncodeToString(out), nil
}

// unseal decrypts what seal returned.
func unseal(key []byte, sealed string) (string, error) {
	aead, err := newAEAD(key)
	if err != nil {
		return "", err
	}
	raw, ok := strings.CutPrefix(sealed, sealPrefix)
	if !ok {
		return "", errors.New("unknown sealed format")
	}
	b, err := base64.StdEncoding.DecodeString(raw)
	if err != nil || len(b) < aead.NonceSize() {
		return "", errors.New("sealed value damaged")
	}
	plain, err := aead.Open(nil, b[:aead.NonceSize()], b[aead.NonceSize():], sealAD)
	if err != nil {
		return "", errors.New("sealed with another key (secrets.json replaced?) or damaged")
	}
	return string(plain), nil
}
