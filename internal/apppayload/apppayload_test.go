package apppayload

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func msgID(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

func mustEncode(t testing.TB, p Payload) []byte {
	t.Helper()
	b, err := Encode(p)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	return b
}

func TestTextRoundTrip(t *testing.T) {
	b := mustEncode(t, NewText("hello, wörld"))
	p, err := Decode(b)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if !p.ContentType.Matches(TextType) || p.ContentType.String() != "xmtp.org/text:1.0" {
		t.Fatalf("content type = %v", p.ContentType)
	}
	text, err := p.Text()
	if err != nil || text != "hello, wörld" {
		t.Fatalf("Text() = %q, %v", text, err)
	}
	if _, _, ok := p.References(); ok {
		t.Fatal("text payload reports a reference")
	}
	if _, ok := p.DeletionTarget(); ok {
		t.Fatal("text payload reports a deletion target")
	}
}

// A reply names the referenced message in parameters["reference"] as
// lowercase hex, and carries its own content as a nested payload (EVENT-021).
func TestReplyReferences_EVENT021(t *testing.T) {
	ref := msgID("original")
	reply, err := NewReply(ref, NewText("agreed"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := Decode(mustEncode(t, reply))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if got := p.Parameters[ParamReference]; got != "" && strings.ToLower(got) != got {
		t.Fatalf("reference not lowercase: %q", got)
	}
	id, kind, ok := p.References()
	if !ok || kind != ReferenceReply || !bytes.Equal(id, ref) {
		t.Fatalf("References() = %x, %v, %v", id, kind, ok)
	}
	gotRef, inner, err := p.Reply()
	if err != nil || !bytes.Equal(gotRef, ref) {
		t.Fatalf("Reply() = %x, %v", gotRef, err)
	}
	if text, err := inner.Text(); err != nil || text != "agreed" {
		t.Fatalf("inner text = %q, %v", text, err)
	}
}

func TestReactionReferences_EVENT021(t *testing.T) {
	ref := msgID("original")
	in := Reaction{
		Reference:        ref,
		ReferenceInboxID: strings.Repeat("ab", 32),
		Action:           ReactionAdded,
		Content:          "👍",
		Schema:           SchemaUnicode,
	}
	pl, err := NewReaction(in)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Decode(mustEncode(t, pl))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if p.ContentType.String() != "xmtp.org/reaction:2.0" {
		t.Fatalf("content type = %v", p.ContentType)
	}
	id, kind, ok := p.References()
	if !ok || kind != ReferenceReaction || !bytes.Equal(id, ref) {
		t.Fatalf("References() = %x, %v, %v", id, kind, ok)
	}
	out, err := p.Reaction()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("reaction = %+v, want %+v", out, in)
	}
}

func TestDeletionTarget(t *testing.T) {
	target := msgID("to delete")
	pl, err := NewDeletion(target)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Decode(mustEncode(t, pl))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	got, ok := p.DeletionTarget()
	if !ok || !bytes.Equal(got, target) {
		t.Fatalf("DeletionTarget() = %x, %v", got, ok)
	}
	if _, _, ok := p.References(); ok {
		t.Fatal("deletion reports a reply/reaction reference")
	}
}

func TestConstructorsRefuseBadIDs(t *testing.T) {
	if _, err := NewReply(make([]byte, 31), NewText("x")); err == nil {
		t.Error("NewReply accepted a 31-byte reference")
	}
	if _, err := NewDeletion(nil); err == nil {
		t.Error("NewDeletion accepted an empty id")
	}
	if _, err := NewReaction(Reaction{Reference: msgID("a"), Action: "liked", Content: "x", Schema: SchemaUnicode}); err == nil {
		t.Error("NewReaction accepted an unknown action")
	}
	if _, err := Encode(Payload{ContentType: ContentType{TypeID: "x"}}); err == nil {
		t.Error("Encode accepted an empty authority")
	}
}

func TestEncodeIsDeterministic(t *testing.T) {
	p := Payload{
		ContentType: ContentType{AuthorityID: "example.com", TypeID: "custom", VersionMajor: 3, VersionMinor: 70000},
		Parameters:  map[string]string{"b": "2", "a": "1", "c": strings.Repeat("x", 300)},
		Content:     bytes.Repeat([]byte{7}, 70000),
	}
	first := mustEncode(t, p)
	for range 10 {
		if !bytes.Equal(first, mustEncode(t, p)) {
			t.Fatal("two encodings of one payload differ")
		}
	}
	got, err := Decode(first)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, p) {
		t.Fatalf("round trip changed the payload")
	}
}

// The encoding is ordinary msgpack: a generic decoder reads it, and what a
// generic encoder writes for the same map decodes here.
func TestInteropWithGenericMsgpack(t *testing.T) {
	type contentType struct {
		AuthorityID  string `msgpack:"authority_id"`
		TypeID       string `msgpack:"type_id"`
		VersionMajor uint32 `msgpack:"version_major"`
		VersionMinor uint32 `msgpack:"version_minor"`
	}
	type payload struct {
		ContentType contentType       `msgpack:"content_type"`
		Parameters  map[string]string `msgpack:"parameters"`
		Content     []byte            `msgpack:"content"`
	}
	var generic payload
	if err := msgpack.Unmarshal(mustEncode(t, NewText("hi")), &generic); err != nil {
		t.Fatalf("generic decode: %v", err)
	}
	if generic.ContentType.TypeID != "text" || string(generic.Content) != "hi" || generic.ContentType.VersionMajor != 1 {
		t.Fatalf("generic decode = %+v", generic)
	}
	b, err := msgpack.Marshal(payload{
		ContentType: contentType{AuthorityID: "xmtp.org", TypeID: "text", VersionMajor: 1},
		Parameters:  map[string]string{"encoding": "UTF-8"},
		Content:     []byte("from elsewhere"),
	})
	if err != nil {
		t.Fatal(err)
	}
	p, err := Decode(b)
	if err != nil {
		t.Fatalf("Decode of generic encoding: %v", err)
	}
	if text, _ := p.Text(); text != "from elsewhere" || p.Parameters["encoding"] != "UTF-8" {
		t.Fatalf("decoded %+v", p)
	}
}

func TestDecodeRejects(t *testing.T) {
	valid := mustEncode(t, NewText("x"))
	enc := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ct := map[string]any{"authority_id": "xmtp.org", "type_id": "text", "version_major": 1, "version_minor": 0}
	replyCT := map[string]any{"authority_id": "xmtp.org", "type_id": "reply", "version_major": 1, "version_minor": 0}
	reactionCT := map[string]any{"authority_id": "xmtp.org", "type_id": "reaction", "version_major": 2, "version_minor": 0}
	deleteCT := map[string]any{"authority_id": "xmtp.org", "type_id": "deleteMessage", "version_major": 1, "version_minor": 0}
	hexRef := strings.Repeat("0a", 32)
	cases := map[string][]byte{
		"empty":             nil,
		"not a map":         enc("text"),
		"truncated":         valid[:len(valid)-1],
		"trailing bytes":    append(append([]byte{}, valid...), 0xc0),
		"unknown member":    enc(map[string]any{"content_type": ct, "parameters": map[string]string{}, "content": []byte{}, "extra": 1}),
		"missing content":   enc(map[string]any{"content_type": ct, "parameters": map[string]string{}}),
		"content as string": enc(map[string]any{"content_type": ct, "parameters": map[string]string{}, "content": "x"}),
		"negative version":  enc(map[string]any{"content_type": map[string]any{"authority_id": "a", "type_id": "b", "version_major": -1, "version_minor": 0}, "parameters": nil, "content": []byte{}}),
		"float version":     enc(map[string]any{"content_type": map[string]any{"authority_id": "a", "type_id": "b", "version_major": 1.5, "version_minor": 0}, "parameters": nil, "content": []byte{}}),
		"huge version":      enc(map[string]any{"content_type": map[string]any{"authority_id": "a", "type_id": "b", "version_major": uint64(1) << 40, "version_minor": 0}, "parameters": nil, "content": []byte{}}),
		"parameter int":     enc(map[string]any{"content_type": ct, "parameters": map[string]any{"a": 1}, "content": []byte{}}),
		"text not utf8":     enc(map[string]any{"content_type": ct, "parameters": nil, "content": []byte{0xff, 0xfe}}),
		"reply no ref":      enc(map[string]any{"content_type": replyCT, "parameters": nil, "content": valid}),
		"reply upper hex":   enc(map[string]any{"content_type": replyCT, "parameters": map[string]string{"reference": strings.ToUpper(hexRef)}, "content": valid}),
		"reply bad inner":   enc(map[string]any{"content_type": replyCT, "parameters": map[string]string{"reference": hexRef}, "content": []byte{1}}),
		"reaction garbage":  enc(map[string]any{"content_type": reactionCT, "parameters": nil, "content": []byte{0x80}}),
		"reaction action":   enc(map[string]any{"content_type": reactionCT, "parameters": nil, "content": enc(map[string]any{"reference": hexRef, "action": "liked", "content": "x", "schema": "unicode"})}),
		"deletion short id": enc(map[string]any{"content_type": deleteCT, "parameters": nil, "content": enc(map[string]any{"message_id": "0a0b"})}),
		"deletion extra":    enc(map[string]any{"content_type": deleteCT, "parameters": nil, "content": enc(map[string]any{"message_id": hexRef, "x": "y"})}),
		"forged map length": {0xdf, 0xff, 0xff, 0xff, 0xff},
		"forged bin length": append(valid[:len(valid)-3], 0xc6, 0xff, 0xff, 0xff, 0xff),
	}
	// Duplicate member: a raw map header claiming 4 entries with content twice.
	dup := appendMapLen(nil, 4)
	dup = appendStr(dup, "content")
	dup = appendBin(dup, nil)
	dup = append(dup, valid[1:]...)
	cases["duplicate member"] = dup

	nested := NewText("x")
	for range maxNesting + 1 {
		b := mustEncodeUnchecked(nested)
		nested = Payload{ContentType: ReplyType, Parameters: map[string]string{ParamReference: hexRef}, Content: b}
	}
	cases["replies nested too deep"] = mustEncodeUnchecked(nested)

	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(b)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode = %v, want ErrMalformed", err)
			}
		})
	}
}

// mustEncodeUnchecked writes p without validation, to build invalid input.
func mustEncodeUnchecked(p Payload) []byte { return p.appendTo(nil) }

func TestAccessorsRefuseOtherTypes(t *testing.T) {
	p := NewText("x")
	if _, err := p.Reaction(); !errors.Is(err, ErrWrongType) {
		t.Errorf("Reaction() on text = %v", err)
	}
	if _, _, err := p.Reply(); !errors.Is(err, ErrWrongType) {
		t.Errorf("Reply() on text = %v", err)
	}
	d, _ := NewDeletion(msgID("x"))
	if _, err := d.Text(); !errors.Is(err, ErrWrongType) {
		t.Errorf("Text() on deletion = %v", err)
	}
}

// A minor version bump of a known type is still that type (CTYPE-001).
func TestMinorVersionStillMatches(t *testing.T) {
	p := NewText("x")
	p.ContentType.VersionMinor = 3
	got, err := Decode(mustEncode(t, p))
	if err != nil {
		t.Fatal(err)
	}
	if !got.ContentType.Matches(TextType) || got.ContentType.VersionMinor != 3 {
		t.Fatalf("content type = %v", got.ContentType)
	}
}
