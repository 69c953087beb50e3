package engine

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// vectorPath returns a file of the RFC 9420 test vectors in testdata/mls
// (source and licence in its README).
func vectorPath(t testing.TB, name string) string {
	t.Helper()
	return filepath.Join("testdata", "mls", name)
}

func loadJSON(t testing.TB, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(vectorPath(t, name))
	if err != nil {
		t.Fatalf("read test vectors: %v", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("parse %s: %v", name, err)
	}
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("hex: %v", err)
	}
	return b
}
