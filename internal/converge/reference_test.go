package converge

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/natsserver"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// ownGroup is a group of alice with a hosted client and a remote
// installation of the same inbox (its phone), both joined.
func ownGroup(t *testing.T, e *env, comps components.Set) (ga, phone *testpeer.Group, h hosted, welcome testpeer.Message) {
	t.Helper()
	alice, u := peer(t, "alice"), peer(t, "u")
	h = e.register(u.AccountID(), 1)
	up := must[*testpeer.Peer](t)(u.NewInstallation("u-phone"))
	comps.Admins = []components.AccountID{alice.AccountID()}
	ga = must[*testpeer.Group](t)(alice.CreateGroup(comps))
	_, welcome, err := ga.Invite(h.kps[0], must[[]byte](t)(up.KeyPackage()))
	if err != nil {
		t.Fatal(err)
	}
	phone = must[*testpeer.Group](t)(up.Join(welcome.Transport))
	return ga, phone, h, welcome
}

// received finds the message.received of id among evs.
func receivedOf(t *testing.T, evs []bus.Delivered, id []byte) bus.Delivered {
	t.Helper()
	for _, d := range evs {
		if r := d.Event.MessageReceived; r != nil && bytes.Equal(r.MessageID, id) {
			return d
		}
	}
	t.Fatalf("no message.received of %x", id[:4])
	return bus.Delivered{}
}

// TestEVENT021ReplyToDeletedOwnMessage: a reply names a message of the own
// inbox that its sender deleted. The client no longer holds it, so the
// reply does not reference an own message (EVENT-021: "names a message
// that the client holds at emission"); a reply to one not deleted does.
func TestEVENT021ReplyToDeletedOwnMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ga, phone, h, welcome := ownGroup(t, e, components.Set{})
	e.worker("w1", nil)
	e.publish(welcome)
	gone := must[testpeer.Message](t)(phone.SendText("deleted soon"))
	kept := must[testpeer.Message](t)(phone.SendText("kept"))
	del := must[testpeer.Message](t)(phone.SendDelete(gone.ID))
	toGone := must[testpeer.Message](t)(ga.SendReply(gone.ID, "re: deleted"))
	toKept := must[testpeer.Message](t)(ga.SendReply(kept.ID, "re: kept"))
	for _, m := range []testpeer.Message{gone, kept, del, toGone, toKept} {
		e.publish(m)
	}
	// joined, 5 received, 1 deleted
	evs := e.waitEvents(h.rec.ClientID, 7)
	if d := evs[4]; d.Event.Kind != schema.KindMessageDeleted || !bytes.Equal(d.Event.MessageDeleted.MessageID, gone.ID) {
		t.Fatalf("event 4 %v, want message.deleted of the first message", d.Event.Kind)
	}
	if receivedOf(t, evs, toGone.ID).ReferencesOwn {
		t.Error("a reply to a deleted own message references an own message")
	}
	if !receivedOf(t, evs, toKept.ID).ReferencesOwn {
		t.Error("a reply to a held own message does not reference an own message")
	}
}

// TestEVENT021AndMETA063PastTenThousandMessages: no bound of memory
// changes what an event says. After 10,000 messages of the own inbox, a
// reply to the first still references an own message (EVENT-021), a
// deletion of the second still finds it (PROC-037), and every one of them
// still expires with message.expired (META-063). The messages are indexed
// by transactions of the worker's own code over the real group, thousands
// per transaction (the MLS bytes of 10,000 messages would cost the test most
// of its time and prove nothing more); the reply, the deletion and the
// expiry come through the running worker.
func TestEVENT021AndMETA063PastTenThousandMessages(t *testing.T) {
	t.Parallel()
	const n, perTxn = 10_000, 4000
	const secs = 3600
	// About 27 s of CPU with -race; the waits allow for a loaded machine.
	e := newEnvWithin(t, 8*time.Minute)
	ga, phone, h, welcome := ownGroup(t, e, components.Set{Retention: &components.RetentionState{DisappearingSecs: secs}})
	var skew atomic.Int64 // the workers' clock runs this far ahead
	// The workers' batches are as large as deploy/ and the test servers
	// allow: the 10,000 messages take three transactions to index, and
	// three to expire.
	clock := func(c *Config) {
		c.MaxBatch = natsserver.DefaultMaxAtomicBatch
		c.Now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	}
	_, stop := e.worker("w1", clock)
	e.publish(welcome)
	e.waitEvents(h.rec.ClientID, 1)
	stop()

	// Index n messages of the phone (the own inbox) as the worker does.
	w := must[*Worker](t)(New(e.ctx, Config{JS: e.js, MLS: EngineMLS{Vault: e.vault}, WorkerID: "builder", MaxBatch: natsserver.DefaultMaxAtomicBatch, Logger: quiet()}))
	groupHex := fmt.Sprintf("%x", ga.ID())
	part := &partition{groups: map[string]*loadedGroup{}, expiry: map[string]int64{}}
	sender := Leaf{InboxID: phone.Peer().InboxID(), InstallationKey: []byte("u-phone installation")}
	ids := make([][]byte, n)
	for i := range ids {
		id := sha256.Sum256(fmt.Appendf(nil, "own message %d", i))
		ids[i] = id[:]
	}
	for from := 0; from < n; from += perTxn {
		err := w.transact(e.ctx, part, tenant, groupHex, func(_ context.Context, tx *txn, g *loadedGroup) (bool, error) {
			tx.name = fmt.Sprintf("build:%d", from)
			for i := from; i < min(from+perTxn, n); i++ {
				tx.deliver(ids[i], ids[i], g.ck.InputSeq+1, time.Now().UnixMilli(), AppMessage{Sender: sender, Plaintext: textPayload(t, i)}, func(*hostedMember) bool { return true })
			}
			return true, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	_, stop = e.worker("w2", clock)
	defer stop()
	reply := must[testpeer.Message](t)(ga.SendReply(ids[0], "re: the first"))
	del := must[testpeer.Message](t)(phone.SendDelete(ids[1]))
	e.publish(reply)
	e.publish(del)
	// joined, n received, the reply; the deletion is the phone's own
	// inbox's: received, and the second message deleted.
	read := e.eventReader(h.rec.ClientID)
	evs := read.wait(1+n+3, 3*time.Minute)
	if !receivedOf(t, evs, reply.ID).ReferencesOwn {
		t.Error("a reply to the first of 10,000 own messages does not reference an own message")
	}
	if last := evs[len(evs)-1].Event; last.Kind != schema.KindMessageDeleted || !bytes.Equal(last.MessageDeleted.MessageID, ids[1]) {
		t.Fatalf("last event %v, want message.deleted of the second message", last.Kind)
	}

	// Past every expiry, each message still held expires: all n but the
	// deleted one, and the reply and the deletion themselves.
	skew.Store(int64(2 * secs * time.Second))
	evs = read.wait(1+n+3+(n-1)+2, 3*time.Minute)
	expired := map[string]bool{}
	for _, d := range evs[1+n+3:] {
		if x := d.Event.MessageExpired; x != nil {
			expired[string(x.MessageID)] = true
		}
	}
	if len(expired) != n-1+2 || expired[string(ids[1])] || !expired[string(ids[0])] || !expired[string(ids[n-1])] || !expired[string(reply.ID)] {
		t.Fatalf("%d messages expired, want %d: all but the deleted one", len(expired), n-1+2)
	}
}

func textPayload(t *testing.T, i int) []byte {
	t.Helper()
	return must[[]byte](t)(apppayload.Encode(apppayload.NewText(fmt.Sprintf("own message %d", i))))
}

// eventReader reads a client's converge events as they are stored, once
// each: for tests with thousands of them.
type eventReader struct {
	e    *env
	cons jetstream.Consumer
	evs  []bus.Delivered
}

func (e *env) eventReader(clientID string) *eventReader {
	e.t.Helper()
	subj := must[string](e.t)(subject.Events(tenant, clientID))
	cons, err := e.js.OrderedConsumer(e.ctx, streams.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		e.t.Fatal(err)
	}
	return &eventReader{e: e, cons: cons}
}

// wait reads until the client has n events, and fails past the timeout or
// when there are more.
func (r *eventReader) wait(n int, timeout time.Duration) []bus.Delivered {
	r.e.t.Helper()
	deadline := time.Now().Add(timeout)
	for len(r.evs) < n && time.Now().Before(deadline) {
		batch, err := r.cons.Fetch(1000, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			r.e.t.Fatal(err)
		}
		for m := range batch.Messages() {
			meta, err := m.Metadata()
			if err != nil {
				r.e.t.Fatal(err)
			}
			d, err := bus.DecodeStored(&jetstream.RawStreamMsg{Subject: m.Subject(), Sequence: meta.Sequence.Stream, Header: m.Headers(), Data: m.Data(), Time: meta.Timestamp})
			if err != nil {
				r.e.t.Fatal(err)
			}
			if d.Event.Kind != schema.KindIdentityRegistered {
				r.evs = append(r.evs, d)
			}
		}
	}
	if len(r.evs) != n {
		r.e.t.Fatalf("client has %d events, want %d", len(r.evs), n)
	}
	return r.evs
}
