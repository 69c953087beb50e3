package bridge

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
)

// Issue 27: the provisioner makes a bridge's consumer, a pull consumer of
// the asking tenant's outbound subjects, and nothing else: not ingest's
// consumer, not a name another tenant's consumer or a push consumer holds,
// not bounds out of range. Asked again, it keeps the consumer and its
// position.
func TestProvisionerMakesOnlyPullConsumersOfOneTenant(t *testing.T) {
	env := natstest.Start(t)
	provisioner(t, env.JS)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ask := func(subj, body string) (string, provisionReply) {
		t.Helper()
		m, err := env.Conn.RequestWithContext(ctx, subj, []byte(body))
		if err != nil {
			t.Fatalf("%s: %v", subj, err)
		}
		var r provisionReply
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Fatalf("%s: %q", subj, m.Data)
		}
		return m.Header.Get(bus.HeaderReplyStatus), r
	}
	if st, r := ask("fabric.bridge.acme.b1", `{"ack_wait_ms":5000,"max_ack_pending":8}`); st != "200" || r.Consumer != "b1" {
		t.Fatalf("acme b1: %s %+v", st, r)
	}
	c, err := env.JS.Consumer(ctx, streams.StreamEvents, "b1")
	if err != nil {
		t.Fatal(err)
	}
	if cfg := c.CachedInfo().Config; cfg.FilterSubject != "fabric.out.acme.*" || cfg.DeliverSubject != "" || cfg.AckWait != 5*time.Second || cfg.MaxAckPending != 8 || cfg.AckPolicy != jetstream.AckExplicitPolicy {
		t.Fatalf("b1: %+v", cfg)
	}
	publishTenant(t, env.JS, "acme", "a1")
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if st, _ := ask("fabric.bridge.acme.b1", `{}`); st != "200" {
		t.Fatalf("acme b1 again: %s", st)
	}
	info, err := c.Info(ctx)
	if err != nil || info.AckFloor.Stream == 0 {
		t.Fatalf("b1 asked again lost its position: %+v %v", info, err)
	}

	if _, err := env.JS.CreateOrUpdateConsumer(ctx, streams.StreamEvents, jetstream.ConsumerConfig{Durable: "pushed", FilterSubject: "fabric.out.acme.*", DeliverSubject: "somewhere"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ subj, body, status, code string }{
		{"fabric.bridge.other.b1", `{}`, "409", "conflict"},
		{"fabric.bridge.acme.pushed", `{}`, "409", "conflict"},
		{"fabric.bridge.acme." + streams.ConsumerOutbound, `{}`, "403", "forbidden"},
		{"fabric.bridge.acme.b2", `{"ack_wait_ms":3600001}`, "400", "bad_request"},
		{"fabric.bridge.acme.b2", `{"ack_wait_ms":999}`, "400", "bad_request"},
		{"fabric.bridge.acme.b2", `{"max_ack_pending":-1}`, "400", "bad_request"},
		{"fabric.bridge.acme.b2", `{"max_ack_pending":65537}`, "400", "bad_request"},
		{"fabric.bridge.acme.b2", `[`, "400", "bad_request"},
		{"fabric.bridge.acme.B2", `{}`, "400", "bad_request"},
	} {
		if st, r := ask(c.subj, c.body); st != c.status || r.Error == nil || r.Error.Code != c.code {
			t.Errorf("%s %s: %s %+v, want %s %s", c.subj, c.body, st, r, c.status, c.code)
		}
	}
	if cfg := must(t)(env.JS.Consumer(ctx, streams.StreamEvents, "b1")).CachedInfo().Config; cfg.FilterSubject != "fabric.out.acme.*" {
		t.Fatalf("b1 changed: %+v", cfg)
	}
}

func must(t *testing.T) func(jetstream.Consumer, error) jetstream.Consumer {
	return func(c jetstream.Consumer, err error) jetstream.Consumer {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}
