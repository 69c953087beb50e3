package signals

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fabric-mls/fabric/internal/httpapi"
)

// FuzzParseSignal: any body, JSON or msgpack, is refused with a clear error
// or accepted as a valid event of a signal kind; never a panic.
func FuzzParseSignal(f *testing.F) {
	for _, ev := range signalSamples() {
		j, _ := ev.MarshalJSON()
		m, _ := ev.MarshalMsgpack()
		f.Add(j, false)
		f.Add(m, true)
	}
	f.Add([]byte(`{"kind":"message.received","message_received":{"group_id":"a1","message_id":"b2","sender_inbox_id":"x"}}`), false)
	f.Add([]byte(`{"kind":"message.deleted","message_deleted":{"group_id":"a1","message_id":"b2","cause":"deleted"}}`), false)
	f.Add([]byte{0x81, 0xa4, 'k', 'i', 'n', 'd'}, true)
	f.Fuzz(func(t *testing.T, body []byte, isMsgpack bool) {
		ev, err := parseSignal(body, isMsgpack)
		if err != nil {
			return
		}
		if _, ok := signalKinds[ev.Kind]; !ok {
			t.Fatalf("accepted kind %s", ev.Kind)
		}
		if ev.Validate() != nil || refuseKind(ev) != nil {
			t.Fatal("accepted an invalid signal")
		}
	})
}

// FuzzStreamReport: any body of POST …/connection, JSON or msgpack, is
// refused with a 400 or decodes to a report check accepts or refuses;
// never a panic.
func FuzzStreamReport(f *testing.F) {
	f.Add([]byte(`{"stream_id":"ws-1","state":"connected"}`), false)
	f.Add([]byte(`{"stream_id":"","state":"closed"}`), false)
	f.Add([]byte{0x82, 0xa9, 's', 't', 'r', 'e', 'a', 'm', '_', 'i', 'd', 0xa1, 'a', 0xa5, 's', 't', 'a', 't', 'e', 0xa6, 'f', 'a', 'i', 'l', 'e', 'd'}, true)
	f.Fuzz(func(t *testing.T, body []byte, isMsgpack bool) {
		r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		if isMsgpack {
			r.Header.Set("Content-Type", "application/msgpack")
		}
		var rep StreamReport
		if err := httpapi.Decode(r, maxBody, &rep); err != nil {
			if httpapi.Status(err)/100 != 4 {
				t.Fatalf("decode error %v is not a 4xx", err)
			}
			return
		}
		if rep.check() == nil && (!rep.State.Valid() || rep.StreamID == "" || len(rep.StreamID) > MaxStreamID) {
			t.Fatalf("accepted %+v", rep)
		}
	})
}
