package binding

import (
	"bytes"
	"crypto/rand"
	"errors"
	"testing"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// FuzzPeel checks that Peel never panics, fails only with its typed errors,
// and returns exactly what was sealed when a candidate key opens the input.
func FuzzPeel(f *testing.F) {
	s, err := Seal(key(7), mlsBytes, rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(1, "sealed", s, byte(7), uint8(2))
	f.Add(1, "sealed", s, byte(1), uint8(8))
	f.Add(1, "mls", mlsBytes, byte(0), uint8(0))
	f.Add(1, "sealed", s[:27], byte(7), uint8(1))
	f.Add(2, "mls", mlsBytes, byte(0), uint8(0))
	f.Add(1, "other", []byte{}, byte(0), uint8(0))
	f.Fuzz(func(t *testing.T, v int, kind string, payload []byte, keySeed byte, nKeys uint8) {
		keys := make([][KeySize]byte, nKeys%9)
		for i := range keys {
			keys[i] = key(keySeed + byte(i))
		}
		msg := schema.TransportMessage{V: v, Group: []byte{0xab}, Kind: schema.TransportKind(kind), Payload: payload}
		got, err := Peel(msg, keys)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || !pe.Category.Valid() {
				t.Fatalf("untyped error: %v", err)
			}
			return
		}
		if len(got) == 0 {
			t.Fatal("Peel returned empty MLS bytes")
		}
		if msg.Kind == schema.TransportSealed {
			opened := false
			for _, k := range keys {
				if pt, err := Open(k, payload); err == nil && bytes.Equal(pt, got) {
					opened = true
				}
			}
			if !opened {
				t.Fatal("Peel output does not match any candidate key")
			}
		}
	})
}

// FuzzPeelMsgpack feeds arbitrary bytes through the schema's strict msgpack
// decoding of a transport message and then Peel, as ingest does.
func FuzzPeelMsgpack(f *testing.F) {
	for _, k := range []byte{7, 8} {
		b, err := sealed(f, key(k), mlsBytes).MarshalMsgpack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	b, err := schema.TransportMessage{V: 1, Group: []byte{1}, Kind: schema.TransportMLS, Payload: mlsBytes}.MarshalMsgpack()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	keys := [][KeySize]byte{key(7)}
	f.Fuzz(func(t *testing.T, b []byte) {
		var msg schema.TransportMessage
		if err := msg.UnmarshalMsgpack(b); err != nil {
			return
		}
		got, err := Peel(msg, keys)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("untyped error: %v", err)
			}
			return
		}
		if len(got) == 0 {
			t.Fatal("Peel returned empty MLS bytes")
		}
	})
}
