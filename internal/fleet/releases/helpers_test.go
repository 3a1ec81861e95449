package releases_test

import (
	"crypto/sha256"
	"encoding/hex"
)

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}
