package apppayload

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzDecode checks that Decode never panics, fails only with ErrMalformed,
// and that what it accepts re-encodes to bytes that decode to the same payload.
func FuzzDecode(f *testing.F) {
	ref := msgID("seed")
	reply, _ := NewReply(ref, NewText("re"))
	reaction, _ := NewReaction(Reaction{Reference: ref, Action: ReactionRemoved, Content: ":+1:", Schema: SchemaShortcode})
	deletion, _ := NewDeletion(ref)
	for _, p := range []Payload{NewText(""), NewText("hello"), reply, reaction, deletion} {
		f.Add(mustEncode(f, p))
	}
	f.Add([]byte{})
	f.Add([]byte{0x83})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		again, err := Encode(p)
		if err != nil {
			t.Fatalf("Encode of a decoded payload: %v", err)
		}
		p2, err := Decode(again)
		if err != nil {
			t.Fatalf("Decode of re-encoded payload: %v", err)
		}
		if again2, _ := Encode(p2); !bytes.Equal(again, again2) {
			t.Fatal("encoding is not stable")
		}
		p.References()
		p.DeletionTarget()
	})
}
