package bus

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/natsserver"
)

// TestReadsReachJetStreamInItsDomain reads the fabric's streams from a leaf
// node whose own JetStream is another domain, as on a leaf or a hub/spoke
// deploy (#16): every read of bus goes to the domain of the JetStream
// context it is given, none to the local JetStream, which has no fabric
// streams.
func TestReadsReachJetStreamInItsDomain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hub, err := natsserver.Start(ctx, natsserver.Options{StoreDir: t.TempDir(), Port: natsserver.RandomPort, Domain: "hub", LeafPort: natsserver.RandomPort})
	if err != nil {
		t.Fatal(err)
	}
	defer hub.Shutdown()
	leaf, err := natsserver.Start(ctx, natsserver.Options{StoreDir: t.TempDir(), Port: natsserver.RandomPort, Domain: "leaf", LeafRemotes: []*url.URL{hub.LeafURL()}})
	if err != nil {
		t.Fatal(err)
	}
	defer leaf.Shutdown()

	hubConn, err := hub.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer hubConn.Close()
	hubJS, err := jetstream.New(hubConn)
	if err != nil {
		t.Fatal(err)
	}
	if err := streams.Ensure(ctx, hubJS, streams.Config{}); err != nil {
		t.Fatal(err)
	}
	ev := event(1, received(1))
	seq, err := Publish(ctx, hubJS, ev)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := hubJS.KeyValue(ctx, streams.BucketGroups)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := groups.Put(ctx, "t1.aa", []byte("record")); err != nil {
		t.Fatal(err)
	}

	nc, err := leaf.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	local, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	subj, err := subject.Events(ev.Tenant, ev.ClientID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := GetMsg(ctx, local, streams.StreamEvents, MsgRequest{LastBySubject: subj}); err == nil {
		t.Fatal("the leaf's own JetStream answered for the hub's stream: the test proves nothing")
	}

	js, err := jetstream.NewWithDomain(nc, "hub")
	if err != nil {
		t.Fatal(err)
	}
	if m, err := GetMsg(ctx, js, streams.StreamEvents, MsgRequest{LastBySubject: subj}); err != nil || m.Sequence != seq {
		t.Errorf("GetMsg: %v, %v", m, err)
	}
	if got, _, err := ReadMsg(ctx, js, subj, 0); err != nil || got != seq {
		t.Errorf("ReadMsg: %d, %v", got, err)
	}
	if ms, err := LastMsgs(ctx, js, streams.StreamEvents, []string{subj}); err != nil || len(ms) != 1 || ms[subj].Sequence != seq {
		t.Errorf("LastMsgs: %v, %v", ms, err)
	}
	if ms, err := NextMsgs(ctx, js, streams.StreamEvents, subj, 1, 10); err != nil || len(ms) != 1 {
		t.Errorf("NextMsgs: %d messages, %v", len(ms), err)
	}
	if _, err := NextMsgs(ctx, js, streams.StreamEvents, subj, seq+1, 10); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("NextMsgs after the last: %v", err)
	}
	if _, err := DirectGet(ctx, js, streams.StreamEvents, DirectRequest{LastBySubject: subj}); err != nil {
		t.Errorf("DirectGet: %v", err)
	}
	if _, err := DirectGet(ctx, js, streams.StreamEvents, DirectRequest{NextBySubject: subj, StartTime: time.Now().Add(-time.Minute)}); err != nil {
		t.Errorf("DirectGet by start time: %v", err)
	}
	if v, ok, err := KVGet(ctx, js, streams.BucketGroups, "t1.aa"); err != nil || !ok || string(v) != "record" {
		t.Errorf("KVGet: %q, %v, %v", v, ok, err)
	}
	if err := groups.Delete(ctx, "t1.aa"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := KVGet(ctx, js, streams.BucketGroups, "t1.aa"); err != nil || ok {
		t.Errorf("KVGet of a deleted key: %v, %v", ok, err)
	}
}

// TestAPIPrefix names the prefix of each kind of JetStream context.
func TestAPIPrefix(t *testing.T) {
	nc := setup(t).nc
	for _, c := range []struct {
		new  func() (jetstream.JetStream, error)
		want string
	}{
		{func() (jetstream.JetStream, error) { return jetstream.New(nc) }, "$JS.API."},
		{func() (jetstream.JetStream, error) { return jetstream.NewWithDomain(nc, "hub") }, "$JS.hub.API."},
		{func() (jetstream.JetStream, error) { return jetstream.NewWithAPIPrefix(nc, "$JS.other.API") }, "$JS.other.API."},
		{func() (jetstream.JetStream, error) { return jetstream.NewWithAPIPrefix(nc, "imported.") }, "imported."},
	} {
		js, err := c.new()
		if err != nil {
			t.Fatal(err)
		}
		if got := APIPrefix(js); got != c.want {
			t.Errorf("APIPrefix = %q, want %q", got, c.want)
		}
	}
}

// readBench stores n events of one client and returns their subject: the
// reads ingest makes for every input (LastMsgs of outcome subjects, GetMsg
// from the leader) measured against one in-process server.
func readBench(b *testing.B, n int) (env, []string) {
	e := setup(b)
	subjects := make([]string, n)
	for i := range n {
		ev := event(i, received(1))
		ev.ClientID = fmt.Sprintf("c0%04x", i)
		if _, err := Publish(e.ctx, e.js, ev); err != nil {
			b.Fatal(err)
		}
		subjects[i], _ = subject.Events(ev.Tenant, ev.ClientID)
	}
	return e, subjects
}

// BenchmarkGetMsg is one read from the stream leader (ingest's dedup and
// compare-and-set reads, converge's checkpoint).
//
//	go test -run '^$' -bench 'GetMsg|LastMsgs' -count 5 ./internal/bus/
func BenchmarkGetMsg(b *testing.B) {
	e, subjects := readBench(b, 1)
	for b.Loop() {
		if _, err := GetMsg(e.ctx, e.js, streams.StreamEvents, MsgRequest{LastBySubject: subjects[0]}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLastMsgs is one batched direct get of the last message of 100
// subjects (ingest's outcome reads of a batch of inputs).
func BenchmarkLastMsgs(b *testing.B) {
	e, subjects := readBench(b, 100)
	for b.Loop() {
		ms, err := LastMsgs(e.ctx, e.js, streams.StreamEvents, subjects)
		if err != nil || len(ms) != len(subjects) {
			b.Fatal(len(ms), err)
		}
	}
}
