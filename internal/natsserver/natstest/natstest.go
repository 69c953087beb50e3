// Package natstest gives a test an embedded nats-server with JetStream and the
// fabric's streams and buckets, all torn down when the test ends.
package natstest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/natsserver"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Env is a running server and a connection to it.
type Env struct {
	Server *natsserver.Server // nil when the server runs InChildProcess or as ThreeNodes
	// Cluster is the three nodes under ThreeNodes, else nil.
	Cluster *natsserver.Cluster
	// Process is the server's process under InChildProcess, else nil.
	Process *os.Process
	URL     string // the client URL; empty for a server in process
	Conn    *nats.Conn
	JS      jetstream.JetStream
}

type options struct {
	loopback  bool
	provision bool
	streams   streams.Config
	child     bool
	cpus      string
	cluster   bool
}

// Option changes what Start starts.
type Option func(*options)

// OverLoopback listens on a random loopback port instead of running the
// server in process, for tests that need a URL or several connections.
func OverLoopback() Option { return func(o *options) { o.loopback = true } }

// WithStreams provisions the streams and buckets with cfg instead of the
// defaults.
func WithStreams(cfg streams.Config) Option { return func(o *options) { o.streams = cfg } }

// ThreeNodes starts a three-node cluster on loopback instead of one
// server, with the streams and buckets at 3 replicas unless WithStreams
// says otherwise; the test is skipped in -short mode.
func ThreeNodes() Option { return func(o *options) { o.cluster = true } }

// WithoutStreams provisions nothing.
func WithoutStreams() Option { return func(o *options) { o.provision = false } }

// Start starts a server with JetStream in a temporary folder, connects to it
// and provisions the fabric's streams and buckets.
func Start(t testing.TB, opts ...Option) *Env {
	t.Helper()
	o := options{provision: true}
	for _, opt := range opts {
		opt(&o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e := &Env{}
	switch {
	case o.cluster:
		if testing.Short() {
			t.Skip("cluster test in -short mode")
		}
		c, err := natsserver.StartCluster(ctx, 3, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Shutdown)
		e.Cluster, e.URL = c, c.ClientURLs()
		if o.streams.Replicas == 0 {
			o.streams.Replicas = 3
		}
	case o.child:
		e.Process, e.URL = startChild(t, o.cpus)
	default:
		so := natsserver.Options{StoreDir: t.TempDir(), InProcess: !o.loopback}
		if o.loopback {
			so.Port = natsserver.RandomPort
		}
		s, err := natsserver.Start(ctx, so)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Shutdown)
		e.Server, e.URL = s, s.ClientURL()
	}
	nc := e.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if o.provision {
		if err := streams.Ensure(ctx, js, o.streams); err != nil {
			t.Fatal(err)
		}
	}
	e.Conn, e.JS = nc, js
	return e
}

// Connect opens another connection to the server, closed when the test ends.
func (e *Env) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	var nc *nats.Conn
	var err error
	if e.Server != nil {
		nc, err = e.Server.Connect(opts...)
	} else {
		nc, err = nats.Connect(e.URL, opts...)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// StoredEvent is one client event read back from FABRIC_EVENTS.
type StoredEvent struct {
	ID    string // the event id (Nats-Msg-Id)
	Event schema.ClientEvent
	// ConversationKey is the Fabric-Conversation-Key header as sent.
	ConversationKey string
}

// ClientEvents reads every event stored on a client's subject, oldest first,
// with an ordered consumer.
func ClientEvents(t testing.TB, js jetstream.JetStream, tenant, clientID string) []StoredEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	subj, err := subject.Events(tenant, clientID)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, streams.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	si, err := st.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	want := int(si.State.Subjects[subj])
	if want == 0 {
		return nil
	}
	cons, err := js.OrderedConsumer(ctx, streams.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		t.Fatal(err)
	}
	var out []StoredEvent
	for len(out) < want {
		batch, err := cons.Fetch(want-len(out), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			var ev schema.ClientEvent
			if err := ev.UnmarshalMsgpack(m.Data()); err != nil {
				t.Fatalf("event body: %v", err)
			}
			out = append(out, StoredEvent{ID: m.Headers().Get(jetstream.MsgIDHeader), Event: ev,
				ConversationKey: m.Headers().Get("Fabric-Conversation-Key")})
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}
