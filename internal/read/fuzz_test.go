package read

import (
	"net/http/httptest"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/pkg/schema"
)

type fixedKey struct{}

func (fixedKey) Derive(string, []byte, int) ([]byte, error) { return make([]byte, 32), nil }

// FuzzStoredRecords: whatever bytes a message or conversation record
// holds, decoding it and answering from it never panics.
func FuzzStoredRecords(f *testing.F) {
	s, err := readmodel.NewSealer(fixedKey{}, "t", nil)
	if err != nil {
		f.Fatal(err)
	}
	text, _ := apppayload.Encode(apppayload.NewText("hi"))
	sealed, _ := s.Seal([]byte{1}, 1, text)
	m, _ := msgpack.Marshal(readmodel.Message{N: 1, ID: make([]byte, 32), GroupID: []byte{1}, State: readmodel.StateDelivered, Content: sealed})
	c, _ := msgpack.Marshal(readmodel.Conversation{GroupID: []byte{1}, InboxID: "00", Components: []byte{0, 1}})
	f.Add(m)
	f.Add(c)
	f.Add(text)
	f.Fuzz(func(t *testing.T, b []byte) {
		var rec readmodel.Message
		if schema.UnmarshalMsgpack(b, &rec) == nil {
			_ = messageOf(&rec, s)
		}
		var conv readmodel.Conversation
		if schema.UnmarshalMsgpack(b, &conv) == nil {
			_ = conversationOf(&conv, schema.ConsentUnknown)
			_ = conv.Holds(&rec)
		}
		if p, err := apppayload.Decode(b); err == nil {
			_ = contentOf(p)
		}
	})
}

// FuzzQuery: any query string is a page and filters, or a 400, never a
// panic.
func FuzzQuery(f *testing.F) {
	f.Add("limit=50&cursor=3&content_types=xmtp.org/text:1,a/b:2.1&sent_after=1&direction=descending")
	f.Add("type=dm&consent_state=allowed&paused=true&updated_since=5")
	f.Add("content_types=/:&cursor=-1")
	f.Fuzz(func(t *testing.T, q string) {
		r := httptest.NewRequest("GET", "/x", nil)
		r.URL.RawQuery = q
		_, _ = pageOf(r)
		_, _ = messageFilterOf(r)
		_, _ = conversationFilterOf(r)
	})
}
