package binding

import (
	"fmt"
	"testing"
)

// BenchmarkPeel measures peeling a sealed 1 KiB MLSMessage when the key that
// opens it is the last of n candidates, the worst case for trial decryption.
func BenchmarkPeel(b *testing.B) {
	m := make([]byte, 1024)
	for _, n := range []int{1, 8} {
		keys := make([][KeySize]byte, n)
		for i := range keys {
			keys[i] = key(byte(i * 40))
		}
		msg := sealed(b, keys[n-1], m)
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(m)))
			for b.Loop() {
				if _, err := Peel(msg, keys); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPeelDeferred measures the full miss: no candidate opens it.
func BenchmarkPeelDeferred(b *testing.B) {
	m := make([]byte, 1024)
	keys := make([][KeySize]byte, 8)
	for i := range keys {
		keys[i] = key(byte(i * 40))
	}
	msg := sealed(b, key(255), m)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Peel(msg, keys); err == nil {
			b.Fatal("opened")
		}
	}
}

func BenchmarkSeal(b *testing.B) {
	m := make([]byte, 1024)
	k := key(1)
	b.ReportAllocs()
	b.SetBytes(int64(len(m)))
	for b.Loop() {
		sealed(b, k, m)
	}
}
