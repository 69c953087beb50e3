package wire

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/pkg/schema"
)

func TestRoundTrip(t *testing.T) {
	filter := &schema.EventFilter{
		Kinds:        []schema.EventKind{schema.KindMessageReceived},
		GroupIDs:     []schema.Bytes{{1, 2}},
		ContentTypes: []schema.ContentTypeID{{AuthorityID: "xmtp.org", TypeID: "text", VersionMajor: 1}},
	}
	for _, enc := range []Encoding{JSON, Msgpack} {
		lagged := AppendLagged(enc, nil, 7)
		frames := []Frame{
			{Op: OpSubscribe, ID: 3, ClientID: "ab01", Filter: filter, AfterSeq: 77, Held: 12},
			{Op: OpSubscribed, ID: 3, Sub: 4, Seq: 76},
			{Op: OpCredit, Sub: 1 << 40, N: 5},
			{Op: OpUnsubscribe, Sub: 9},
			{Op: OpSubscribed, ID: 3, Sub: 9},
			{Op: OpEvent, Sub: 9, Seq: 300, Event: lagged},
			{Op: OpEvent, Sub: 9, Seq: 301, EventID: strings.Repeat("e1", 32), Event: lagged},
			{Op: OpEvent, Sub: 9, Event: lagged, AtMost: true},
			{Op: OpEnded, Sub: 9, Reason: ReasonShutdown},
			{Op: OpError, ID: 4, Code: CodeForbidden, Message: "token does not name \"this\" client <&>"},
		}
		for _, f := range frames {
			b := Append(enc, nil, &f)
			got, err := Decode(enc, b)
			if err != nil {
				t.Fatalf("%v %s: decode %q: %v", enc, f.Op, b, err)
			}
			if !reflect.DeepEqual(got, f) {
				t.Fatalf("%v: got %+v, want %+v", enc, got, f)
			}
		}
		var ev schema.ClientEvent
		var err error
		if enc == JSON {
			err = json.Unmarshal(lagged, &ev)
		} else {
			err = msgpack.Unmarshal(lagged, &ev)
		}
		if err != nil || ev.Kind != schema.KindLagged || ev.Lagged == nil || ev.Lagged.Discarded != 7 {
			t.Fatalf("%v lagged event: %+v %v", enc, ev, err)
		}
	}
}

func TestDecodeRefusesUnknownMembers(t *testing.T) {
	if _, err := Decode(JSON, []byte(`{"op":"credit","sub":1,"n":1,"bogus":1}`)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("unknown member: %v", err)
	}
	if _, err := Decode(JSON, []byte(`{"op":"credit"} {}`)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("trailing data: %v", err)
	}
	b, _ := msgpack.Marshal(map[string]any{"op": "credit", "bogus": 1})
	if _, err := Decode(Msgpack, b); !errors.Is(err, ErrMalformed) {
		t.Fatalf("msgpack unknown member: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(byte(0), []byte(`{"op":"subscribe","id":1,"client_id":"ab","filter":{"kinds":["message.received"],"group_ids":["0102"]}}`))
	f.Add(byte(0), []byte(`{"op":"credit","sub":1,"n":1}`))
	f.Add(byte(0), []byte(`{"op":"subscribe","id":1,"client_id":"ab","filter":{"kinds":[]},"start_time":1764763200000}`))
	f.Add(byte(1), Append(Msgpack, nil, &Frame{Op: OpSubscribe, ID: 1, ClientID: "ab", Filter: &schema.EventFilter{Kinds: []schema.EventKind{}}, FromStart: true, StartTime: -1}))
	f.Add(byte(1), Append(Msgpack, nil, &Frame{Op: OpSubscribe, ID: 1, ClientID: "ab", Filter: &schema.EventFilter{Kinds: []schema.EventKind{}}}))
	f.Add(byte(1), Append(Msgpack, nil, &Frame{Op: OpEvent, Sub: 1, Seq: 2, Event: AppendLagged(Msgpack, nil, 3)}))
	f.Add(byte(0), []byte(`{"op":"connect","token":"eyJhbGciOiJFZERTQSJ9.e30.sig"}`))
	f.Add(byte(1), Append(Msgpack, nil, &Frame{Op: OpConnect, Token: "eyJ"}))
	f.Fuzz(func(t *testing.T, e byte, b []byte) {
		enc := Encoding(e % 2)
		fr, err := Decode(enc, b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		// What decodes re-encodes and decodes to the same frame.
		again, err := Decode(enc, Append(enc, nil, &fr))
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if again.Op != fr.Op || again.ID != fr.ID || again.Sub != fr.Sub || again.N != fr.N ||
			again.AfterSeq != fr.AfterSeq || again.StartTime != fr.StartTime || again.FromStart != fr.FromStart || again.Token != fr.Token {
			t.Fatalf("round trip changed the frame: %+v vs %+v", again, fr)
		}
	})
}

// A frame with more than 15 members is a msgpack map16, not a fixmap: one
// with every member set round-trips in both encodings.
func TestFrameWithEveryMemberRoundTrips(t *testing.T) {
	f := Frame{Op: OpSubscribe, ID: 1, Sub: 2, ClientID: "ab", Filter: &schema.EventFilter{Kinds: []schema.EventKind{}}, N: 3, Seq: 4,
		AfterSeq: 5, StartTime: 6, FromStart: true, Held: 7, AtMost: true, Reason: "r", Code: "c", Message: "m", Token: "t"}
	for _, enc := range []Encoding{JSON, Msgpack} {
		f.Event = AppendLagged(enc, nil, 8)
		got, err := Decode(enc, Append(enc, nil, &f))
		if err != nil {
			t.Fatalf("%v: %v", enc, err)
		}
		if got.Token != "t" || got.Message != "m" || got.Held != 7 || !got.AtMost || got.Filter == nil {
			t.Fatalf("%v: %+v", enc, got)
		}
	}
}

// Error text goes to apps: it names members in the protocol's words and
// never a Go type, struct or field of the implementation.
func TestDecodeErrorsNameNoGoTypes(t *testing.T) {
	for _, c := range []struct {
		enc  Encoding
		b    []byte
		want string
	}{
		{JSON, []byte(`{"op":"subscribe","id":"x"}`), `"id"`},
		{JSON, []byte(`{"op":"credit","n":1.5}`), `"n"`},
		{JSON, []byte(`{"op":"credit","bogus":1}`), `"bogus"`},
		{JSON, []byte(`{"op":`), "JSON object"},
		{JSON, []byte(`[1,2]`), ""},
		{Msgpack, []byte{0x81, 0xa2, 'i', 'd', 0xa1, 'x'}, ""},
		{Msgpack, []byte{0x81, 0xa5, 'b', 'o', 'g', 'u', 's', 0x01}, "bogus"},
		{Msgpack, []byte{0xc1}, ""},
	} {
		_, err := Decode(c.enc, c.b)
		if err == nil {
			t.Fatalf("%q decoded", c.b)
		}
		msg := err.Error()
		for _, leak := range []string{"Go ", "struct", "jsonFrame", "msgpackFrame", "uint64", "int64", "wire.", "schema."} {
			if strings.Contains(msg, leak) {
				t.Errorf("%q: error %q names %q", c.b, msg, leak)
			}
		}
		if !strings.Contains(msg, c.want) {
			t.Errorf("%q: error %q does not say %s", c.b, msg, c.want)
		}
	}
}

// docs/wire-formats.md documents every op and every error code a frame can
// carry, so the protocol's documentation cannot fall behind the code.
func TestWireFormatsDocumentsEveryOpAndCode(t *testing.T) {
	b, err := os.ReadFile("../../docs/wire-formats.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, name := range append([]string{OpSubscribe, OpCredit, OpUnsubscribe, OpSubscribed, OpEvent, OpEnded, OpError,
		ReasonUnsubscribed, ReasonShutdown, ReasonTokenExpired}, Codes...) {
		if !strings.Contains(doc, "`"+name+"`") {
			t.Errorf("docs/wire-formats.md does not document %q", name)
		}
	}
	for _, member := range []string{"after_seq", "start_time", "from_start", "held", "at_most", "event_id"} {
		if !strings.Contains(doc, "`"+member+"`") {
			t.Errorf("docs/wire-formats.md does not document the member %q", member)
		}
	}
}
