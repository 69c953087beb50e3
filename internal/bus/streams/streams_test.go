package streams

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
	"go.uber.org/goleak"

	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/natsserver"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// setup starts an embedded server and returns a JetStream context on it.
// It is not natstest.Start: natstest provisions with this package, so these
// tests, which check that provisioning, start the server bare.
func setup(t *testing.T) (context.Context, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	s, err := natsserver.Start(ctx, natsserver.Options{StoreDir: t.TempDir(), InProcess: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, nc, js
}

func ensured(t *testing.T, cfg Config) (context.Context, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	ctx, nc, js := setup(t)
	if err := Ensure(ctx, js, cfg); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	return ctx, nc, js
}

func TestEnsureCreatesThenIsNoOp(t *testing.T) {
	ctx, _, js := ensured(t, Config{})
	created := map[string]time.Time{}
	for _, sc := range StreamConfigs(Config{}) {
		s, err := js.Stream(ctx, sc.Name)
		if err != nil {
			t.Fatalf("stream %s missing: %v", sc.Name, err)
		}
		created[sc.Name] = s.CachedInfo().Created
	}
	for _, kc := range BucketConfigs(Config{}) {
		if _, err := js.KeyValue(ctx, kc.Bucket); err != nil {
			t.Fatalf("bucket %s missing: %v", kc.Bucket, err)
		}
	}
	if err := Ensure(ctx, js, Config{}); err != nil {
		t.Fatalf("second Ensure: %v", err)
	}
	for name, c := range created {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if !s.CachedInfo().Created.Equal(c) {
			t.Fatalf("second Ensure recreated %s", name)
		}
	}
}

func TestEnsureReportsDrift(t *testing.T) {
	ctx, _, js := ensured(t, Config{})
	s, err := js.Stream(ctx, StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	altered := s.CachedInfo().Config
	altered.MaxAge = time.Hour
	altered.AllowDirect = false
	if _, err := js.UpdateStream(ctx, altered); err != nil {
		t.Fatal(err)
	}
	kvs, err := js.Stream(ctx, "KV_"+BucketGroups)
	if err != nil {
		t.Fatal(err)
	}
	kvAltered := kvs.CachedInfo().Config
	kvAltered.MaxMsgsPerSubject = 5
	if _, err := js.UpdateStream(ctx, kvAltered); err != nil {
		t.Fatal(err)
	}

	err = Ensure(ctx, js, Config{})
	var de *DriftError
	if !errors.As(err, &de) {
		t.Fatalf("Ensure = %v, want *DriftError", err)
	}
	got := map[string]Drift{}
	for _, d := range de.Drifts {
		got[d.Name+"."+d.Field] = d
	}
	if d, ok := got[StreamEvents+".MaxAge"]; !ok || d.Want != (24*time.Hour).String() || d.Got != time.Hour.String() {
		t.Errorf("MaxAge drift = %+v (all: %v)", d, de.Drifts)
	}
	if _, ok := got[StreamEvents+".AllowDirect"]; !ok {
		t.Errorf("AllowDirect drift missing: %v", de.Drifts)
	}
	if d, ok := got[BucketGroups+".History"]; !ok || d.Want != "1" || d.Got != "5" {
		t.Errorf("History drift = %+v (all: %v)", d, de.Drifts)
	}
	if len(de.Drifts) != 3 {
		t.Errorf("drifts = %v, want exactly 3", de.Drifts)
	}
	// Never silently overwritten.
	s, _ = js.Stream(ctx, StreamEvents)
	if s.CachedInfo().Config.MaxAge != time.Hour {
		t.Fatal("Ensure overwrote the drifted stream")
	}
}

func TestEnsureOtherConfigIsDrift(t *testing.T) {
	ctx, _, js := ensured(t, Config{})
	err := Ensure(ctx, js, Config{EventsMaxAge: 48 * time.Hour})
	var de *DriftError
	if !errors.As(err, &de) || len(de.Drifts) != 1 || de.Drifts[0].Field != "MaxAge" {
		t.Fatalf("Ensure with another MaxAge = %v", err)
	}
}

// TestInputTransformStoresPartition verifies FABRIC_IN's subject transform:
// the server stores fabric.in.<p>.<tenant>.<group>.<message_id> with the
// partition subject.Partition computes from tenant and group only, and a consumer filtered on fabric.in.<p>.>
// receives it.
func TestInputTransformStoresPartition(t *testing.T) {
	ctx, _, js := ensured(t, Config{})
	st, err := js.Stream(ctx, StreamInput)
	if err != nil {
		t.Fatal(err)
	}
	const tenant = "acme"
	for i := range 32 {
		group := fmt.Sprintf("%08x", i*7919)
		id := fmt.Sprintf("%064x", i)
		in, err := subject.Input(tenant, group, id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, in, []byte(group)); err != nil {
			t.Fatal(err)
		}
		stored, _ := subject.StoredInput(tenant, group, id)
		m, err := st.GetLastMsgForSubject(ctx, stored)
		if err != nil {
			t.Fatalf("group %s not stored under %s: %v", group, stored, err)
		}
		if string(m.Data) != group {
			t.Fatalf("wrong message under %s", stored)
		}
	}

	group := "00ff"
	p, _ := subject.Partition(tenant, group)
	filter, _ := subject.InputPartition(p)
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		t.Fatal(err)
	}
	// Two message ids of one group land in the group's one partition, in
	// the order published.
	ids := []string{strings.Repeat("ab", 32), strings.Repeat("01", 32)}
	for _, id := range ids {
		in, _ := subject.Input(tenant, group, id)
		if _, err := js.Publish(ctx, in, []byte(id)); err != nil {
			t.Fatal(err)
		}
	}
	next := 0
	for next < len(ids) {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("consumer on %s got nothing: %v", filter, err)
		}
		got, err := subject.ParseStoredInput(m.Subject())
		if err != nil {
			t.Fatalf("delivered subject does not parse: %v", err)
		}
		if got.Tenant != tenant || got.GroupHex != group {
			continue
		}
		stored, _ := subject.StoredInput(tenant, group, ids[next])
		if m.Subject() != stored || string(m.Data()) != ids[next] {
			t.Fatalf("input %d of the group: got %s, want %s", next, m.Subject(), stored)
		}
		next++
	}
}

// TestRepublishHeaders: an event on fabric.ev.t.c is republished on
// fabric.live.t.c with the sequence chain, and duplicates are not.
func TestRepublishHeaders(t *testing.T) {
	ctx, nc, js := ensured(t, Config{})
	ev, _ := subject.Events("t", "c0")
	live, _ := subject.Live("t", "c0")
	sub, err := nc.SubscribeSync(live)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, id := range []string{"a", "a", "b"} {
		ack, err := js.Publish(ctx, ev, []byte("e"+id), jetstream.WithMsgID(id))
		if err != nil {
			t.Fatal(err)
		}
		if !ack.Duplicate {
			seqs = append(seqs, ack.Sequence)
		}
	}
	// An event of another client in between must not break the chain.
	other, _ := subject.Events("t", "c1")
	if _, err := js.Publish(ctx, other, nil); err != nil {
		t.Fatal(err)
	}

	var last uint64
	for i, want := range seqs {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("republished copy %d: %v", i, err)
		}
		seq, _ := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		prev, perr := strconv.ParseUint(m.Header.Get("Nats-Last-Sequence"), 10, 64)
		if seq != want || perr != nil || prev != last {
			t.Fatalf("copy %d: Nats-Sequence %d Nats-Last-Sequence %q, want %d and %d", i, seq, m.Header.Get("Nats-Last-Sequence"), want, last)
		}
		if m.Header.Get(jetstream.MsgIDHeader) == "" || m.Header.Get(jetstream.TimeStampHeaer) == "" {
			t.Fatalf("copy %d lacks Nats-Msg-Id or Nats-Time-Stamp: %v", i, m.Header)
		}
		last = seq
	}
	if m, err := sub.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("unexpected republished copy %v", m.Header)
	}
}

// TestCheckpointFence_AtomicBatch documents converge's fence on R1: a batch
// of events plus a checkpoint carrying Nats-Expected-Last-Subject-Sequence
// commits once; the same batch with the now stale expectation fails as a
// whole with 10071 (wrong last sequence) and stores nothing; a retry that
// repeats a stored event id fails as a whole with 10201 whatever the
// expectation; with the current expectation and fresh ids it commits.
func TestCheckpointFence_AtomicBatch(t *testing.T) {
	ctx, _, js := ensured(t, Config{})
	ev, _ := subject.Events("t", "c0")
	ck, _ := subject.Checkpoint("t", "00ff")
	batch := func(expect uint64, ids ...string) []*nats.Msg {
		var msgs []*nats.Msg
		for _, id := range ids {
			m := nats.NewMsg(ev)
			m.Header.Set(jetstream.MsgIDHeader, id)
			msgs = append(msgs, m)
		}
		c := nats.NewMsg(ck)
		c.Header.Set(jetstream.MsgTTLHeader, CheckpointTTL)
		c.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
		return append(msgs, c)
	}

	ack, err := jetstreamext.PublishMsgBatch(ctx, js, batch(0, "e1", "e2"))
	if err != nil {
		t.Fatalf("first batch: %v", err)
	}
	if ack.BatchSize != 3 || ack.Sequence != 3 {
		t.Fatalf("first batch ack %+v", ack)
	}
	ckSeq := ack.Sequence

	// A zombie replaying with the stale expectation, new ids.
	_, err = jetstreamext.PublishMsgBatch(ctx, js, batch(0, "e3", "e4"))
	assertAPIError(t, err, 10071)
	// A retry of the committed batch, same ids, same stale expectation:
	// inside an atomic batch the ids are checked first, even on R1, so the
	// retry fails with 10201 (duplicate message id), not 10071 as a single
	// publish with both headers would on R1.
	_, err = jetstreamext.PublishMsgBatch(ctx, js, batch(0, "e1", "e2"))
	assertAPIError(t, err, int(jetstreamext.JSErrCodeBatchPublishDuplicateMsgID))

	st, _ := js.Stream(ctx, StreamEvents)
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 {
		t.Fatalf("stream holds %d messages after rejected batches, want 3", info.State.Msgs)
	}

	// The current owner, with the current expectation, but one id that
	// was already stored: the whole batch is refused as a duplicate.
	_, err = jetstreamext.PublishMsgBatch(ctx, js, batch(ckSeq, "e2", "e5"))
	assertAPIError(t, err, int(jetstreamext.JSErrCodeBatchPublishDuplicateMsgID))

	ack, err = jetstreamext.PublishMsgBatch(ctx, js, batch(ckSeq, "e5", "e6"))
	if err != nil {
		t.Fatalf("batch with current expectation: %v", err)
	}
	if ack.Sequence != 6 {
		t.Fatalf("second batch ack %+v", ack)
	}

	// For contrast, a single publish repeating a stored id with a stale
	// expectation gets 10071 on R1, not a duplicate ack.
	m := nats.NewMsg(ev)
	m.Header.Set(jetstream.MsgIDHeader, "e6")
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	_, err = js.PublishMsg(ctx, m)
	assertAPIError(t, err, 10071)
}

func assertAPIError(t *testing.T, err error, code int) {
	t.Helper()
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		t.Fatalf("err = %v, want API error %d", err, code)
	}
	if int(apiErr.ErrorCode) != code {
		t.Fatalf("err = %v (code %d), want %d", err, apiErr.ErrorCode, code)
	}
}

// TestCheckpointOutlivesMaxAge: events expire after EventsMaxAge, a
// checkpoint published with Nats-TTL: never stays.
func TestCheckpointOutlivesMaxAge(t *testing.T) {
	ctx, _, js := ensured(t, Config{EventsMaxAge: time.Second, DuplicateWindow: 500 * time.Millisecond})
	ev, _ := subject.Events("t", "c0")
	ck, _ := subject.Checkpoint("t", "00ff")
	c := nats.NewMsg(ck)
	c.Header.Set(jetstream.MsgTTLHeader, CheckpointTTL)
	if _, err := js.PublishMsg(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, ev, []byte("e")); err != nil {
		t.Fatal(err)
	}
	st, _ := js.Stream(ctx, StreamEvents)
	eventually.NoError(t, func() error {
		if _, err := st.GetLastMsgForSubject(ctx, ev); !errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("event did not expire: %v", err)
		}
		return nil
	})
	if _, err := st.GetLastMsgForSubject(ctx, ck); err != nil {
		t.Fatalf("checkpoint expired with the events: %v", err)
	}
}

// TestEnsureAndFenceOnR3 provisions everything with three replicas on a
// three-node cluster and checks that the fence behaves as on R1.
func TestEnsureAndFenceOnR3(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test in -short mode")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := natsserver.StartCluster(ctx, 3, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown()
	nc, err := c.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := Ensure(ctx, js, Config{Replicas: 3}); err != nil {
		t.Fatalf("Ensure R3: %v", err)
	}
	if err := Ensure(ctx, js, Config{Replicas: 3}); err != nil {
		t.Fatalf("second Ensure R3: %v", err)
	}
	ev, _ := subject.Events("t", "c0")
	ck, _ := subject.Checkpoint("t", "00ff")
	batch := func(expect uint64, id string) []*nats.Msg {
		m := nats.NewMsg(ev)
		m.Header.Set(jetstream.MsgIDHeader, id)
		c := nats.NewMsg(ck)
		c.Header.Set(jetstream.MsgTTLHeader, CheckpointTTL)
		c.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
		return []*nats.Msg{m, c}
	}
	ack, err := jetstreamext.PublishMsgBatch(ctx, js, batch(0, "e1"))
	if err != nil {
		t.Fatalf("first batch: %v", err)
	}
	_, err = jetstreamext.PublishMsgBatch(ctx, js, batch(0, "e2"))
	assertAPIError(t, err, 10071)
	_, err = jetstreamext.PublishMsgBatch(ctx, js, batch(0, "e1"))
	assertAPIError(t, err, int(jetstreamext.JSErrCodeBatchPublishDuplicateMsgID))
	if _, err := jetstreamext.PublishMsgBatch(ctx, js, batch(ack.Sequence, "e2")); err != nil {
		t.Fatalf("batch with current expectation: %v", err)
	}
}

// FABRIC_IN is bounded in bytes and, full, refuses new input rather than
// dropping input not yet converged.
func TestInputIsBoundedAndNeverDropsStoredInput(t *testing.T) {
	ctx, _, js := ensured(t, Config{InputMaxBytes: 8 << 10})
	payload := make([]byte, 1000)
	var refused error
	for i := 0; i < 100 && refused == nil; i++ {
		subj, err := subject.Input("t1", "00ff", fmt.Sprintf("%064x", i))
		if err != nil {
			t.Fatal(err)
		}
		_, refused = js.Publish(ctx, subj, payload)
	}
	if refused == nil || !strings.Contains(refused.Error(), "maximum bytes exceeded") {
		t.Fatalf("publishing past InputMaxBytes: %v, want maximum bytes exceeded", refused)
	}
	s, err := js.Stream(ctx, StreamInput)
	if err != nil {
		t.Fatal(err)
	}
	if st := s.CachedInfo().State; st.FirstSeq != 1 || st.Bytes > 8<<10 {
		t.Fatalf("FABRIC_IN state %+v: the first input was dropped or the bound passed", st)
	}
}

// A cluster that forms or is loaded refuses an R3 stream with "no suitable
// peers for placement" until a node's statistics reach the meta leader (it
// failed CI once in TestEnsureAndFenceOnR3), and an API request can time
// out: Ensure retries those, and only those, while its context lasts.
func TestEnsureRetriesOnlyWhatPasses(t *testing.T) {
	noPeers := &jetstream.APIError{Code: 400, ErrorCode: jsErrNoPlacementPeers, Description: "no suitable peers for placement, peer offline"}
	for _, tc := range []struct {
		name      string
		errs      []error // what each call returns; then success
		wantCalls int
		wantErr   bool
	}{
		{"no placement peers, twice", []error{noPeers, noPeers}, 3, false},
		{"a request that timed out", []error{context.DeadlineExceeded, nats.ErrTimeout}, 3, false},
		{"not found is an answer", []error{jetstream.ErrStreamNotFound}, 1, true},
		{"a refusal is an answer", []error{&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeBadRequest}}, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			_, err := settling(context.Background(), func(context.Context) (int, error) {
				calls++
				if calls <= len(tc.errs) {
					return 0, tc.errs[calls-1]
				}
				return 1, nil
			})
			if calls != tc.wantCalls || (err != nil) != tc.wantErr {
				t.Fatalf("%d calls, %v; want %d calls, an error: %v", calls, err, tc.wantCalls, tc.wantErr)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := settling(ctx, func(context.Context) (int, error) { return 0, noPeers }); !errors.Is(err, noPeers) {
		t.Fatalf("a cluster that never settles: %v, want its last answer once the context ends", err)
	}
}
