package ingest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/thomas-vilte/mls-go/framing"
	"github.com/thomas-vilte/mls-go/group"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/binding"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// FuzzDecodeIntake feeds arbitrary bodies to the intake decoder in both
// formats: it never panics, every refusal has a 4xx
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
			if st := httpapi.Status(err); st < 400 || st >= 500 {
				t.Fatalf("refusal is not a 4xx: %v", err)
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

// FuzzPeelAndClassify runs arbitrary payloads, plain and sealed, through
// peeling and classification: every input gets a step and a result from
// the outcome vocabulary, and nothing panics.
func FuzzPeelAndClassify(f *testing.F) {
	g := newGroup(f)
	s := &Service{dir: newDirectory(), log: slog.New(slog.DiscardHandler)}
	key := testTenant + "." + hex.EncodeToString(g.ID())
	s.dir.setKnown(key, true, 1, false)
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

// FuzzIntakeQueuesOnlyWholeMessages drives intake's peel and classify with
// mutated real MLS messages of every wire format (commit, proposal,
// application, Welcome, GroupInfo, KeyPackage), plain and sealed, to a
// hosted group: whatever it would queue for convergence decodes fully with
// mls-go and re-encodes to the same bytes, so nothing cut, padded or
// garbled reaches convergence (inbound processing runs the encoding checks
// first). The corpus in testdata/fuzz holds the seeds.
func FuzzIntakeQueuesOnlyWholeMessages(f *testing.F) {
	samples, err := testpeer.Samples()
	if err != nil {
		f.Fatal(err)
	}
	groupID := samples[0].Transport.Group
	s := &Service{dir: newDirectory(), log: slog.New(slog.DiscardHandler)}
	key := testTenant + "." + hex.EncodeToString(groupID)
	s.dir.setKnown(key, true, 1, false)
	var eventKey [binding.KeySize]byte
	s.dir.setKeys(key, [][binding.KeySize]byte{eventKey})
	for _, smp := range samples {
		f.Add(smp.MLS, false)
	}
	f.Add(samples[0].MLS, true)
	f.Fuzz(func(t *testing.T, mls []byte, sealed bool) {
		if len(mls) == 0 {
			return
		}
		msg := schema.TransportMessage{V: 1, Group: groupID, Kind: schema.TransportMLS, Payload: mls}
		if sealed {
			b, err := binding.Seal(eventKey, mls, rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			msg.Kind, msg.Payload = schema.TransportSealed, b
		}
		in := &input{msg: msg}
		s.prepare(testTenant, in)
		if in.step != stepEnter {
			return
		}
		if in.res.Status != schema.StatusQueued || !bytes.Equal(in.mls, mls) {
			t.Fatalf("entering input: status %s, %d peeled bytes of %d", in.res.Status, len(in.mls), len(mls))
		}
		if err := decodesFully(mls, in.class); err != nil {
			t.Fatalf("queued %s of %d bytes does not decode fully: %v", in.class, len(mls), err)
		}
	})
}

// decodesFully decodes an MLSMessage with mls-go, independently of the
// engine's classification, down to the commit, proposal or Welcome it
// carries, and requires every layer to re-encode to the bytes it came from.
func decodesFully(b []byte, class schema.InputClass) error {
	m, err := framing.UnmarshalMLSMessage(b)
	if err != nil {
		return err
	}
	if !bytes.Equal(m.Marshal(), b) {
		return errors.New("the MLSMessage does not re-encode to its bytes")
	}
	switch {
	case m.PublicMessage != nil:
		switch body := m.PublicMessage.Content.Body.(type) {
		case framing.CommitBody:
			c, err := group.UnmarshalCommit(body.Data)
			if err != nil {
				return err
			}
			if !bytes.Equal(c.Marshal(), body.Data) {
				return errors.New("the commit does not re-encode to its bytes")
			}
		case framing.ProposalBody:
			p, err := group.UnmarshalProposal(body.Data)
			if err != nil {
				return err
			}
			if !bytes.Equal(group.ProposalMarshal(p), body.Data) {
				return errors.New("the proposal does not re-encode to its bytes")
			}
		}
	case m.Welcome != nil:
		w, err := group.UnmarshalWelcome(m.Welcome)
		if err != nil {
			return err
		}
		if !bytes.Equal(w.Marshal(), m.Welcome) {
			return errors.New("the Welcome does not re-encode to its bytes")
		}
	case m.PrivateMessage == nil:
		return fmt.Errorf("class %s: not group input", class)
	}
	return nil
}
