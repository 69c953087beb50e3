package converge

import (
	"encoding/hex"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// TestReadableRecordsOfADeletedMessage: a delivered message's record holds
// its sealed content; once a deletion applies, the subject holds one
// record, without content, and the content is gone from the stream. With
// MessageRetention the records carry it as their TTL; the conversation
// record keeps none.
func TestReadableRecordsOfADeletedMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.register(peer(t, "bob").AccountID(), 1)
	_, g := groupWithHosted(t, e, components.Set{}, h)
	e.worker("w1", func(c *Config) { c.MessageRetention = time.Hour })
	e.waitEvents(h.rec.ClientID, 1)
	m := must[testpeer.Message](t)(g.SendText("soon deleted"))
	e.publish(m)
	e.waitEvents(h.rec.ClientID, 2)
	s, err := e.js.Stream(e.ctx, streams.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	gh := hex.EncodeToString(g.ID())
	subj, _ := readmodel.MessageSubject(tenant, gh, 1)
	last := func(subj string) (*jetstream.RawStreamMsg, readmodel.Message) {
		t.Helper()
		raw, err := s.GetLastMsgForSubject(e.ctx, subj)
		if err != nil {
			t.Fatalf("%s: %v", subj, err)
		}
		var rec readmodel.Message
		_ = schema.UnmarshalMsgpack(raw.Data, &rec)
		return raw, rec
	}
	raw, rec := last(subj)
	if rec.State != readmodel.StateDelivered || len(rec.Content) == 0 || string(rec.ID) != string(m.ID) || raw.Header.Get(jetstream.MsgTTLHeader) != "3600s" {
		t.Fatalf("delivered record %+v, TTL %q", rec, raw.Header.Get(jetstream.MsgTTLHeader))
	}
	del := must[testpeer.Message](t)(g.SendDelete(m.ID))
	e.publish(del)
	e.waitEvents(h.rec.ClientID, 4) // the deletion received, then message.deleted
	_, rec = last(subj)
	if rec.State != readmodel.StateDeleted || rec.Content != nil || rec.DeletedBy != g.Peer().InboxID() {
		t.Fatalf("deleted record %+v", rec)
	}
	info, err := s.Info(e.ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[subj]; n != 1 {
		t.Fatalf("%d messages on %s, want the one without content", n, subj)
	}
	cs, _ := readmodel.ConversationSubject(tenant, gh, h.rec.ClientID)
	if raw, _ := last(cs); raw.Header.Get(jetstream.MsgTTLHeader) != streams.CheckpointTTL {
		t.Fatalf("conversation record TTL %q", raw.Header.Get(jetstream.MsgTTLHeader))
	}
}
