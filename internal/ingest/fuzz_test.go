package ingest

import (
	"encoding/hex"
	"errors"
	"log/slog"
	"testing"

	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/vmihailenco/msgpack/v5"
)

// FuzzDecodeIntake feeds arbitrary bodies to the intake decoder in both
// formats: it never panics, every refusal is an *httpapi.Error with a 4xx
// status, and whatever it accepts obeys the envelope rules and the limits.
func FuzzDecodeIntake(f *testing.F) {
	lim := Limits{MaxBatch: 4, MaxMessageBytes: 64, MaxBodyBytes: 4096}.withDefaults()
	f.Add([]byte(`{"v":1,"group":"0a","kind":"mls","payload":"0001"}`), false)
	f.Add([]byte(`{"messages":[{"v":1,"group":"0a","kind":"sealed","payload":"00"},{"v":1,"group":"0b","kind":"mls","payload":"ff"}]}`), false)
	f.Add([]byte(`{"messages":[]}`), false)
	f.Add([]byte(`{"messages":null}`), false)
	f.Add([]byte(`[1,2]`), false)
	one, _ := msgpack.Marshal(map[string]any{"v": 1, "group": []byte{1}, "kind": "mls", "payload": []byte{2}})
	f.Add(one, true)
	batch, _ := msgpack.Marshal(map[string]any{"messages": []map[string]any{{"v": 1, "group": []byte{1}, "kind": "mls", "payload": []byte{2}}}})
	f.Add(batch, true)
	f.Add([]byte{0xdf, 0xff, 0xff, 0xff, 0xff}, true)
	f.Add([]byte{0x81, 0xa8, 'm', 'e', 's', 's', 'a', 'g', 'e', 's', 0xdd, 0xff, 0xff, 0xff, 0xff}, true)
	// A single message whose payload claims 4 GiB.
	f.Add([]byte{0x84, 0xa1, 'v', 0x01, 0xa5, 'g', 'r', 'o', 'u', 'p', 0xc4, 0x01, 0x01, 0xa4, 'k', 'i', 'n', 'd', 0xa3, 'm', 'l', 's',
		0xa7, 'p', 'a', 'y', 'l', 'o', 'a', 'd', 0xc6, 0xff, 0xff, 0xff, 0xff}, true)
	f.Fuzz(func(t *testing.T, body []byte, isMsgpack bool) {
		msgs, err := decodeIntake(body, isMsgpack, lim)
		if err != nil {
			var he *httpapi.Error
			if !errors.As(err, &he) || he.Status < 400 || he.Status >= 500 {
				t.Fatalf("refusal is not a 4xx *httpapi.Error: %v", err)
			}
			return
		}
		if len(msgs) == 0 || len(msgs) > lim.MaxBatch {
			t.Fatalf("accepted %d messages", len(msgs))
		}
		for _, m := range msgs {
			if m.V != schema.TransportVersion || !m.Kind.Valid() || len(m.Group) == 0 || len(m.Group) > maxGroupBytes ||
				len(m.Payload) == 0 || len(m.Payload) > lim.MaxMessageBytes {
				t.Fatalf("accepted a message breaking the envelope rules: %+v", m)
			}
		}
	})
}

// FuzzDecodeGroupKeys checks the fabric-group-keys value decoder never
// panics and returns only whole keys.
func FuzzDecodeGroupKeys(f *testing.F) {
	k, _ := EncodeGroupKeys(make([][32]byte, 2))
	f.Add(k)
	f.Add([]byte{0x91, 0xc4, 0x01, 0x00})
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, err := DecodeGroupKeys(b)
		if err == nil && len(keys) > maxGroupKeys {
			t.Fatalf("%d keys", len(keys))
		}
	})
}

// FuzzPeelAndClassify runs arbitrary payloads, plain and sealed, through
// peeling and classification: every input gets a step and a result from
// the outcome vocabulary, and nothing panics.
func FuzzPeelAndClassify(f *testing.F) {
	g := newGroup(f)
	s := &Service{dir: newDirectory(), log: slog.New(slog.DiscardHandler)}
	key := testTenant + "." + hex.EncodeToString(g.ID())
	s.dir.setKnown(key, true, 1)
	s.dir.setKeys(key, g.EventKeys())
	m := text(f, g, "seed")
	f.Add(m.MLS, false)
	g.SetSealed(true)
	sealed := text(f, g, "sealed seed")
	f.Add([]byte(sealed.Transport.Payload), true)
	f.Add([]byte{0, 1, 0, 3}, false)
	f.Add(make([]byte, 40), true)
	f.Fuzz(func(t *testing.T, payload []byte, isSealed bool) {
		if len(payload) == 0 {
			return
		}
		kind := schema.TransportMLS
		if isSealed {
			kind = schema.TransportSealed
		}
		in := &input{msg: schema.TransportMessage{V: 1, Group: g.ID(), Kind: kind, Payload: payload}}
		s.peelAndClassify(testTenant, in)
		switch in.step {
		case stepReject, stepRetain, stepEnter:
		default:
			t.Fatalf("step %d", in.step)
		}
		if !in.res.Status.Valid() || (in.res.Category != "" && !in.res.Category.Valid()) || !in.class.Valid() {
			t.Fatalf("result %s/%s class %q", in.res.Status, in.res.Category, in.class)
		}
		if len(in.res.MessageID) != 32 {
			t.Fatalf("message id of %d bytes", len(in.res.MessageID))
		}
	})
}
