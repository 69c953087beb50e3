package ingest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// An application message of a hosted group is queued on the group's input
// subject with its class and id in headers, and its outcome is recorded.
func TestQueuedOntoGroupSubject(t *testing.T) {
	t.Parallel()
	e, w, g := hostedGroup(t)
	m := text(t, g, "hello")

	wantResult(t, w.submitOne(t, m.Transport), m.ID, schema.StatusQueued, "")
	o := w.wantOutcome(t, m.ID, schema.StatusQueued, "", schema.ClassApplication)
	if o.Revision != 1 {
		t.Errorf("revision = %d, want 1", o.Revision)
	}
	in := e.inputs()
	if len(in) != 1 {
		t.Fatalf("FABRIC_IN holds %d messages, want 1", len(in))
	}
	want, err := subject.StoredInput(testTenant, hex.EncodeToString(g.ID()), hex.EncodeToString(m.ID))
	if err != nil {
		t.Fatal(err)
	}
	got := in[0]
	if got.Subject != want {
		t.Errorf("subject = %s, want %s", got.Subject, want)
	}
	if string(got.Data) != string(m.MLS) {
		t.Error("body is not the peeled MLS bytes")
	}
	if c := got.Header.Get(bus.HeaderClass); c != string(schema.ClassApplication) {
		t.Errorf("%s = %q", bus.HeaderClass, c)
	}
	// The subject carries the message id; a header would repeat it.
	if id := got.Header.Get(bus.HeaderMessageID); id != "" {
		t.Errorf("%s = %q, want none", bus.HeaderMessageID, id)
	}
	if got, want := len(got.Header), 2; got != want {
		t.Errorf("%d headers, want %d (%s and %s)", got, want, jetstream.ExpectedLastSubjSeqHeader, bus.HeaderClass)
	}
	// The subject is the dedup key; a Nats-Msg-Id would be a second one.
	if id := got.Header.Get(jetstream.MsgIDHeader); id != "" {
		t.Errorf("Nats-Msg-Id = %q, want none", id)
	}
}

// The message id is SHA-256 of the peeled MLS bytes, so the same MLS message
// sealed and in the clear is one input (inbound-processing.md, "Message
// identity").
func TestMessageIDIsStableAcrossWrapping(t *testing.T) {
	t.Parallel()
	e, w, g := hostedGroup(t)
	e.setGroupKeys(g.ID(), g)
	eventually.True(t, "key set loaded", func() bool {
		k, _ := w.svc.dir.candidateKeys(testTenant + "." + hex.EncodeToString(g.ID()))
		return len(k) > 0
	})
	g.SetSealed(true)
	m := text(t, g, "sealed")
	if m.Transport.Kind != schema.TransportSealed {
		t.Fatal("testpeer did not seal")
	}
	wantResult(t, w.submitOne(t, m.Transport), m.ID, schema.StatusQueued, "")
	plain := schema.TransportMessage{V: 1, Group: g.ID(), Kind: schema.TransportMLS, Payload: m.MLS}
	wantResult(t, w.submitOne(t, plain), m.ID, schema.StatusRejected, schema.CategoryDuplicate)
	e.wantInputs(1)
}

// A second delivery inside the JetStream window is a duplicate and is not
// published again.
func TestDuplicateInsideWindow(t *testing.T) {
	t.Parallel()
	e, w, g := hostedGroup(t)
	m := text(t, g, "twice")
	res := w.submit(t, m.Transport, m.Transport)
	wantResult(t, res[0], m.ID, schema.StatusQueued, "")
	wantResult(t, res[1], m.ID, schema.StatusRejected, schema.CategoryDuplicate)
	wantResult(t, w.submitOne(t, m.Transport), m.ID, schema.StatusRejected, schema.CategoryDuplicate)
	e.wantInputs(1)
	// The duplicate did not overwrite the input's own outcome.
	w.wantOutcome(t, m.ID, schema.StatusQueued, "", schema.ClassApplication)
}

// Past the JetStream window the outcome record still catches a duplicate:
// a queued record is written only once the input is stored, so it proves
// the input entered, whether or not convergence has decided yet.
func TestDuplicateBeyondWindow(t *testing.T) {
	t.Parallel()
	const window = 200 * time.Millisecond
	e := newEnv(t, envOpts{window: window})
	w := e.workers[0]
	g := newGroup(t)
	e.hostGroup(g.ID())
	waiting := text(t, g, "not decided yet")
	decided := text(t, g, "later")
	res := w.submit(t, waiting.Transport, decided.Transport)
	wantResult(t, res[0], waiting.ID, schema.StatusQueued, "")
	wantResult(t, res[1], decided.ID, schema.StatusQueued, "")
	e.converged(decided.ID, schema.ClassApplication)
	time.Sleep(3 * window) // let the Nats-Msg-Id window pass
	res = w.submit(t, waiting.Transport, decided.Transport)
	wantResult(t, res[0], waiting.ID, schema.StatusRejected, schema.CategoryDuplicate)
	wantResult(t, res[1], decided.ID, schema.StatusRejected, schema.CategoryDuplicate)
	e.wantInputs(2)
	w.wantOutcome(t, waiting.ID, schema.StatusQueued, "", schema.ClassApplication)
	if o, _ := w.outcome(t, decided.ID); o.Disposition != schema.DispositionAccepted {
		t.Fatalf("converge's record replaced: %s/%s", o.Status, o.Category)
	}
}

// converged appends an accepted record the way converge does: one revision
// above the newest record, named oc.<tenant>.<id>.<revision>, without a
// compare-and-set.
func (e *env) converged(id []byte, class schema.InputClass) {
	e.t.Helper()
	idHex := hex.EncodeToString(id)
	subj, err := subject.Outcome(testTenant, idHex)
	if err != nil {
		e.t.Fatal(err)
	}
	prev, err := e.workers[0].svc.readOutcome(context.Background(), subj)
	if err != nil {
		e.t.Fatal(err)
	}
	// The stored input is revision 1 when there is no record.
	rec := schema.Outcome{MessageID: id, Class: class, Status: schema.StatusQueued, Disposition: schema.DispositionAccepted, Revision: 2, Time: time.Now().UTC()}
	if prev != nil {
		rec.Revision = prev.rec.Revision + 1
	}
	body, err := rec.MarshalMsgpack()
	if err != nil {
		e.t.Fatal(err)
	}
	m := nats.NewMsg(subj)
	m.Data = body
	m.Header.Set(jetstream.MsgIDHeader, "oc."+testTenant+"."+idHex+"."+strconv.FormatUint(rec.Revision, 10))
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		e.t.Fatal(err)
	}
}

// An input stored by an attempt that died before answering is its own
// record: the outcome lookup answers queued from the stored input, and the
// next delivery is a duplicate that is not published again.
func TestStoredInputIsItsOwnRecord(t *testing.T) {
	t.Parallel()
	e, w, g := hostedGroup(t)
	m := text(t, g, "died before the answer")
	in := &input{msg: m.Transport}
	w.svc.prepare(testTenant, in)
	pub, err := inputMsg(testTenant, in)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.PublishMsg(t.Context(), pub); err != nil {
		t.Fatal(err)
	}
	if o := w.wantOutcome(t, m.ID, schema.StatusQueued, "", schema.ClassApplication); o.Revision != 1 || !bytes.Equal(o.MessageID, m.ID) {
		t.Errorf("derived record: revision %d, id match %v", o.Revision, bytes.Equal(o.MessageID, m.ID))
	}
	wantResult(t, w.submitOne(t, m.Transport), m.ID, schema.StatusRejected, schema.CategoryDuplicate)
	e.wantInputs(1)
	w.wantOutcome(t, m.ID, schema.StatusQueued, "", schema.ClassApplication)
}

// An admitted input costs one write: it is on FABRIC_IN, and FABRIC_OUTCOMES
// holds nothing about it until converge decides.
func TestAdmittedInputWritesNoRecord(t *testing.T) {
	t.Parallel()
	e, w, g := hostedGroup(t)
	m := text(t, g, "one write")
	wantResult(t, w.submitOne(t, m.Transport), m.ID, schema.StatusQueued, "")
	subj, err := subject.Outcome(testTenant, hex.EncodeToString(m.ID))
	if err != nil {
		t.Fatal(err)
	}
	if l, err := w.svc.readOutcome(t.Context(), subj); err != nil || l != nil {
		t.Fatalf("outcome record written on the hot path: %v, %v", l, err)
	}
	e.wantInputs(1)
	// The lookup finds stored inputs by id only: an id never submitted is
	// not found.
	if _, ok := w.outcome(t, bytes.Repeat([]byte{7}, 32)); ok {
		t.Fatal("an outcome for an id never submitted")
	}
}

// A record written between ingest's read and its write (converge deciding
// fast, another worker) is not overwritten by the queued record.
func TestQueuedRecordNeverOverwritesADecision(t *testing.T) {
	t.Parallel()
	e, w, g := hostedGroup(t)
	m := text(t, g, "decided first")
	e.converged(m.ID, schema.ClassApplication)
	in := &input{msg: m.Transport}
	w.svc.prepare(testTenant, in)
	// enter as if its read had found nothing: the create-if-absent meets
	// converge's record.
	rec := pendingOutcome{rec: schema.Outcome{MessageID: m.ID, Class: schema.ClassApplication, Status: schema.StatusQueued}}
	if err := w.svc.writeOutcomes(t.Context(), testTenant, []pendingOutcome{rec}); err != nil {
		t.Fatal(err)
	}
	if o, _ := w.outcome(t, m.ID); o.Disposition != schema.DispositionAccepted {
		t.Fatalf("decision overwritten: %s/%s", o.Status, o.Category)
	}
}

// Bytes that are not an MLSMessage fail closed with invalid_encoding, and
// so does a sealed payload too short to hold a tag.
func TestMalformedInput(t *testing.T) {
	t.Parallel()
	e, w, g := hostedGroup(t)
	junk := []byte{0x00, 0x01, 0x00}
	res := w.submit(t,
		schema.TransportMessage{V: 1, Group: g.ID(), Kind: schema.TransportMLS, Payload: junk},
		schema.TransportMessage{V: 1, Group: g.ID(), Kind: schema.TransportSealed, Payload: make([]byte, 20)},
	)
	id := sha256.Sum256(junk)
	wantResult(t, res[0], id[:], schema.StatusRejected, schema.CategoryInvalidEncoding)
	w.wantOutcome(t, id[:], schema.StatusRejected, schema.CategoryInvalidEncoding, schema.ClassMalformed)
	short := sha256.Sum256(make([]byte, 20))
	wantResult(t, res[1], short[:], schema.StatusRejected, schema.CategoryInvalidEncoding)
	e.wantInputs(0)
}

// Input of a protocol version or wire format the fabric does not process
// fails closed with unsupported_required_feature.
func TestUnsupportedInput(t *testing.T) {
	t.Parallel()
	_, w, g := hostedGroup(t)
	m := text(t, g, "v2")
	v2 := slices.Clone(m.MLS)
	v2[0], v2[1] = 0x00, 0x02 // protocol version mls20
	kp := remoteKeyPackage(t)
	res := w.submit(t,
		schema.TransportMessage{V: 1, Group: g.ID(), Kind: schema.TransportMLS, Payload: v2},
		schema.TransportMessage{V: 1, Group: g.ID(), Kind: schema.TransportMLS, Payload: kp},
	)
	id := sha256.Sum256(v2)
	wantResult(t, res[0], id[:], schema.StatusRejected, schema.CategoryUnsupportedRequiredFeature)
	w.wantOutcome(t, id[:], schema.StatusRejected, schema.CategoryUnsupportedRequiredFeature, schema.ClassUnsupported)
	kpID := sha256.Sum256(kp)
	wantResult(t, res[1], kpID[:], schema.StatusRejected, schema.CategoryUnsupportedRequiredFeature)
	w.wantOutcome(t, kpID[:], schema.StatusRejected, schema.CategoryUnsupportedRequiredFeature, schema.ClassKeyPackage)
}

// A group message routed under another group's id is wrong_recipient.
func TestWrongRecipient(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	w := e.workers[0]
	g, other := newGroup(t), newGroup(t)
	e.hostGroup(g.ID())
	e.hostGroup(other.ID())
	m := text(t, g, "misrouted")
	tm := m.Transport
	tm.Group = other.ID()
	wantResult(t, w.submitOne(t, tm), m.ID, schema.StatusRejected, schema.CategoryWrongRecipient)
	w.wantOutcome(t, m.ID, schema.StatusRejected, schema.CategoryWrongRecipient, schema.ClassApplication)
	// The routing was the transport's mistake, not the bytes': the same
	// bytes routed right enter, and their record moves on.
	wantResult(t, w.submitOne(t, m.Transport), m.ID, schema.StatusQueued, "")
	if o := w.wantOutcome(t, m.ID, schema.StatusQueued, "", schema.ClassApplication); o.Revision != 2 {
		t.Errorf("revision = %d, want 2", o.Revision)
	}
}

// The batched dedup read asks in chunks the server can answer and finds
// every record, whatever the number of subjects.
func TestLastMsgsReadsInChunks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	ctx := t.Context()
	const stored, asked = 1100, 2300 // more than two chunks, more found than one chunk holds
	subjects := make([]string, asked)
	var msgs []*nats.Msg
	for i := range subjects {
		id := sha256.Sum256([]byte(strconv.Itoa(i)))
		subjects[i], _ = subject.Outcome(testTenant, hex.EncodeToString(id[:]))
		if i < stored {
			m := nats.NewMsg(subjects[i])
			m.Data = []byte(strconv.Itoa(i))
			msgs = append(msgs, m)
		}
	}
	res, err := e.workers[0].svc.pub.publish(ctx, e.js, msgs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.err != nil {
			t.Fatalf("publish %d: %v", i, r.err)
		}
	}
	got, err := bus.LastMsgs(ctx, e.js, streams.StreamOutcomes, subjects)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != stored {
		t.Fatalf("found %d records, want %d", len(got), stored)
	}
	for i := range stored {
		if m := got[subjects[i]]; m == nil || string(m.Data) != strconv.Itoa(i) {
			t.Fatalf("record %d missing or wrong", i)
		}
	}
	if _, err := bus.LastMsgs(ctx, e.js, "NO_SUCH_STREAM", subjects[:1]); err == nil {
		t.Fatal("a read of a stream that does not exist succeeded")
	}
}

// Input for a group no hosted client holds is unknown_group, retained, and
// offered to convergence once a hosted client joins (late welcome
// backfill).
func TestUnknownGroupBackfilledAfterJoin(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	w := e.workers[0]
	g := newGroup(t)
	m := text(t, g, "early")
	wantResult(t, w.submitOne(t, m.Transport), m.ID, schema.StatusRejected, schema.CategoryUnknownGroup)
	w.wantOutcome(t, m.ID, schema.StatusRejected, schema.CategoryUnknownGroup, schema.ClassApplication)
	if n := e.retained(); n != 1 {
		t.Fatalf("FABRIC_RETAINED holds %d objects, want 1", n)
	}
	if n := len(e.inputs()); n != 0 {
		t.Fatalf("FABRIC_IN holds %d messages before the join, want 0", n)
	}

	e.hostGroup(g.ID())
	eventually.True(t, "backfill onto FABRIC_IN", func() bool { return len(e.inputs()) == 1 })
	eventually.True(t, "retained object removed", func() bool { return e.retained() == 0 })
	o := w.wantOutcome(t, m.ID, schema.StatusQueued, "", schema.ClassApplication)
	if o.Revision != 2 {
		t.Errorf("revision = %d, want 2", o.Revision)
	}
	// Delivered again now: a duplicate once convergence has decided.
	e.converged(m.ID, schema.ClassApplication)
	wantResult(t, w.submitOne(t, m.Transport), m.ID, schema.StatusRejected, schema.CategoryDuplicate)
}

// A group converge has just recorded is hosted even before this worker's
// watch delivers the record: a directory miss is confirmed with a read of
// fabric-groups, so an app message posted right after conversation.joined
// is queued, not unknown_group.
func TestFreshGroupRecordBeatsLaggingWatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	w := e.workers[0]
	g := newGroup(t)
	key := testTenant + "." + hex.EncodeToString(g.ID())

	// As it happens: the record is written and input follows at once.
	e.putKV(streams.BucketGroups, g.ID(), msgpackBody(t, bus.GroupRecord{Members: []string{"c1"}, CheckpointSeq: 1}))
	m := text(t, g, "right after the join")
	wantResult(t, w.submitOne(t, m.Transport), m.ID, schema.StatusQueued, "")

	// Deterministically: the watch has the record, but this worker's
	// cache is made to miss it, as a lagging watch would.
	eventually.True(t, "group known", func() bool { return w.svc.dir.known(key) })
	w.svc.dir.mu.Lock()
	delete(w.svc.dir.groups, key)
	w.svc.dir.mu.Unlock()
	m2 := text(t, g, "cache missed")
	wantResult(t, w.submitOne(t, m2.Transport), m2.ID, schema.StatusQueued, "")
	if !w.svc.dir.known(key) {
		t.Fatal("the read did not update the directory")
	}
	if n := e.retained(); n != 0 {
		t.Fatalf("FABRIC_RETAINED holds %d objects, want 0", n)
	}
	e.wantInputs(2)

	// A group without a record is still unknown_group after the read.
	other := newGroup(t)
	m3 := text(t, other, "nobody here")
	wantResult(t, w.submitOne(t, m3.Transport), m3.ID, schema.StatusRejected, schema.CategoryUnknownGroup)
}

// A read that raced a later change of the record cannot undo it: the newer
// fabric-groups revision wins.
func TestDirectoryKeepsNewestGroupRevision(t *testing.T) {
	t.Parallel()
	d := newDirectory()
	const key = "t.aa"
	d.setKnown(key, false, 5, true) // the watch saw the delete at revision 5
	d.setKnown(key, true, 3, true)  // a read that found revision 3 lands late
	if d.known(key) {
		t.Fatal("an older revision brought the group back")
	}
	d.setKnown(key, true, 6, true)
	if !d.known(key) {
		t.Fatal("a newer revision was ignored")
	}
}

// A welcome goes to the group its hint names, known or not: it is what
// makes a group known.
func TestWelcomeGoesToHintedGroup(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	w := e.workers[0]
	g := newGroup(t)
	welcome := invite(t, g)
	wantResult(t, w.submitOne(t, welcome.Transport), welcome.ID, schema.StatusQueued, "")
	w.wantOutcome(t, welcome.ID, schema.StatusQueued, "", schema.ClassWelcome)
	in := e.inputs()
	if len(in) != 1 {
		t.Fatalf("FABRIC_IN holds %d messages, want 1", len(in))
	}
	got, err := subject.ParseStoredInput(in[0].Subject)
	if err != nil || got.Tenant != testTenant || got.GroupHex != hex.EncodeToString(g.ID()) || got.MessageIDHex != hex.EncodeToString(welcome.ID) {
		t.Fatalf("welcome stored under %s", in[0].Subject)
	}
}

// A sealed message no candidate key opens is transport_deferred, retained,
// and retried when the group's key set changes (inbound-processing.md,
// "Transport-deferred input").
func TestSealedDeferredUntilKeySetChanges(t *testing.T) {
	t.Parallel()
	e, w, g := hostedGroup(t)
	stranger := newGroup(t)
	e.setGroupKeys(g.ID(), stranger) // keys that do not open g's messages
	key := testTenant + "." + hex.EncodeToString(g.ID())
	eventually.True(t, "key set loaded", func() bool { k, _ := w.svc.dir.candidateKeys(key); return len(k) > 0 })

	g.SetSealed(true)
	m := text(t, g, "sealed")
	transportID := sha256.Sum256(m.Transport.Payload)
	wantResult(t, w.submitOne(t, m.Transport), transportID[:], schema.StatusDeferred, schema.CategoryTransportDeferred)
	// A sealed object no key opens has its own class: it is not yet an
	// MLSMessage, so neither malformed nor unsupported.
	w.wantOutcome(t, transportID[:], schema.StatusDeferred, schema.CategoryTransportDeferred, schema.ClassSealed)
	if n := e.retained(); n != 1 {
		t.Fatalf("FABRIC_RETAINED holds %d objects, want 1", n)
	}

	e.setGroupKeys(g.ID(), g)
	eventually.True(t, "opened onto FABRIC_IN", func() bool { return len(e.inputs()) == 1 })
	eventually.True(t, "retained object removed", func() bool { return e.retained() == 0 })
	w.wantOutcome(t, m.ID, schema.StatusQueued, "", schema.ClassApplication)
	eventually.True(t, "transport id settles", func() bool {
		o, _ := w.outcome(t, transportID[:])
		return o.Status == schema.StatusQueued
	})
}

// Over the tenant's retention bound an object is refused with
// resource_refused, which is not a duplicate record: the same bytes are
// processed afresh later.
func TestRetentionBoundRefuses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{limits: Limits{MaxRetainedPerTenant: 1}})
	w := e.workers[0]
	g := newGroup(t)
	first, second := text(t, g, "one"), text(t, g, "two")
	wantResult(t, w.submitOne(t, first.Transport), first.ID, schema.StatusRejected, schema.CategoryUnknownGroup)
	wantResult(t, w.submitOne(t, second.Transport), second.ID, schema.StatusRejected, schema.CategoryResourceRefused)
	w.wantOutcome(t, second.ID, schema.StatusRejected, schema.CategoryResourceRefused, schema.ClassApplication)
	wantResult(t, w.submitOne(t, second.Transport), second.ID, schema.StatusRejected, schema.CategoryResourceRefused)

	e.hostGroup(g.ID())
	eventually.True(t, "backfill", func() bool { return len(e.inputs()) == 1 })
	wantResult(t, w.submitOne(t, second.Transport), second.ID, schema.StatusQueued, "")
	e.wantInputs(2)
}

// The outcome endpoint answers 404 for an id with no record and 400 for
// something that is not a message id.
func TestOutcomeNotFound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	w := e.workers[0]
	id := sha256.Sum256([]byte("never sent"))
	if _, ok := w.outcome(t, id[:]); ok {
		t.Fatal("outcome found for an id never sent")
	}
}

// Metrics count inputs by class, status and category and show retained
// objects, and no label value carries a tenant, group or message id.
func TestMetricsCarryNoIDs(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	e := newEnv(t, envOpts{reg: reg})
	w := e.workers[0]
	g := newGroup(t)
	m := text(t, g, "unknown")
	wantResult(t, w.submitOne(t, m.Transport), m.ID, schema.StatusRejected, schema.CategoryUnknownGroup)
	e.hostGroup(g.ID())
	eventually.True(t, "backfill", func() bool { return len(e.inputs()) == 1 })
	eventually.True(t, "retained object removed", func() bool { return e.retained() == 0 })
	m2 := text(t, g, "known")
	wantResult(t, w.submitOne(t, m2.Transport), m2.ID, schema.StatusQueued, "")

	forbidden := []string{testTenant, hex.EncodeToString(g.ID()), hex.EncodeToString(m.ID), hex.EncodeToString(m2.ID)}
	gather := func() map[string]float64 {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, f := range families {
			for _, metric := range f.GetMetric() {
				key := f.GetName()
				for _, l := range metric.GetLabel() {
					for _, bad := range forbidden {
						if strings.Contains(l.GetValue(), bad) {
							t.Errorf("metric %s label %s carries an id", f.GetName(), l.GetName())
						}
					}
					key += "," + l.GetName() + "=" + l.GetValue()
				}
				got[key] = metric.GetCounter().GetValue() + metric.GetGauge().GetValue()
			}
		}
		return got
	}
	// The release is counted just after the object is removed.
	eventually.True(t, "release counted", func() bool { return gather()["fabric_ingest_released_total,reason=unknown_group"] == 1 })
	got := gather()
	for key, want := range map[string]float64{
		"fabric_ingest_inputs_total,category=,class=application,status=queued,transport=http":                1,
		"fabric_ingest_inputs_total,category=unknown_group,class=application,status=rejected,transport=http": 1,
		"fabric_ingest_inputs_total,category=,class=application,status=queued,transport=retained":            1,
		"fabric_ingest_retained_total,reason=unknown_group":                                                  1,
		"fabric_ingest_released_total,reason=unknown_group":                                                  1,
		"fabric_ingest_retained_objects,reason=unknown_group":                                                0,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", key, v, ok, want)
		}
	}
}

// A fabric-groups record that names no hosted member leaves the group
// unknown.
func TestGroupRecordWithoutMembersIsUnknown(t *testing.T) {
	t.Parallel()
	e, w, g := hostedGroup(t)
	e.putKV(streams.BucketGroups, g.ID(), msgpackBody(t, bus.GroupRecord{CheckpointSeq: 2}))
	key := testTenant + "." + hex.EncodeToString(g.ID())
	eventually.True(t, "group unknown", func() bool { return !w.svc.dir.known(key) })
	m := text(t, g, "nobody home")
	wantResult(t, w.submitOne(t, m.Transport), m.ID, schema.StatusRejected, schema.CategoryUnknownGroup)
}

// The bound holds inside one batch too.
func TestRetentionBoundInsideBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{limits: Limits{MaxRetainedPerTenant: 2}})
	w := e.workers[0]
	g := newGroup(t)
	a, b, c := text(t, g, "a"), text(t, g, "b"), text(t, g, "c")
	res := w.submit(t, a.Transport, b.Transport, c.Transport)
	wantResult(t, res[0], a.ID, schema.StatusRejected, schema.CategoryUnknownGroup)
	wantResult(t, res[1], b.ID, schema.StatusRejected, schema.CategoryUnknownGroup)
	wantResult(t, res[2], c.ID, schema.StatusRejected, schema.CategoryResourceRefused)
	if n := e.retained(); n != 2 {
		t.Fatalf("FABRIC_RETAINED holds %d objects, want 2", n)
	}
}

// Group event keys are sealed at rest: a fabric-group-keys value in the
// clear (a fabric from before sealing, or a forged one) is not read, so it
// gives no key to peel with (docs/converge.md).
func TestUnsealedGroupKeysAreNotRead(t *testing.T) {
	t.Parallel()
	e, w, g := hostedGroup(t)
	plain, err := bus.EncodeGroupKeys(g.EventKeys())
	if err != nil {
		t.Fatal(err)
	}
	e.putKV(streams.BucketGroupKeys, g.ID(), plain)
	// The watch applies entries in order: once a later, sealed set is
	// loaded, the plain one has been seen.
	later := bytes.Clone(g.ID())
	later[len(later)-1] ^= 1
	e.setGroupKeys(later, g)
	eventually.True(t, "later key set loaded", func() bool {
		k, _ := w.svc.dir.candidateKeys(testTenant + "." + hex.EncodeToString(later))
		return len(k) > 0
	})
	if k, _ := w.svc.dir.candidateKeys(testTenant + "." + hex.EncodeToString(g.ID())); len(k) != 0 {
		t.Fatalf("%d keys read from a key set in the clear", len(k))
	}
}
