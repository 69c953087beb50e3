package signals

import (
	"testing"
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
