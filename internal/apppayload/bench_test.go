package apppayload

import "testing"

func benchPayloads(b *testing.B) map[string]Payload {
	ref := msgID("bench")
	reply, err := NewReply(ref, NewText("sounds good to me"))
	if err != nil {
		b.Fatal(err)
	}
	reaction, err := NewReaction(Reaction{Reference: ref, Action: ReactionAdded, Content: "👍", Schema: SchemaUnicode})
	if err != nil {
		b.Fatal(err)
	}
	return map[string]Payload{
		"text":     NewText("the quick brown fox jumps over the lazy dog, twice over"),
		"reply":    reply,
		"reaction": reaction,
	}
}

func BenchmarkEncode(b *testing.B) {
	for name, p := range benchPayloads(b) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Encode(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	for name, p := range benchPayloads(b) {
		enc := mustEncode(b, p)
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(enc)))
			for b.Loop() {
				if _, err := Decode(enc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
