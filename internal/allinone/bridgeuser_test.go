package allinone

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
)

// The all-in-one's NATS user bridge (fabric bridge, docs/outbound.md) gets
// a consumer of a tenant's outbound subjects by asking ingest for it
// (bridge.Provisioner) and reads it; it may make no consumer itself (issue
// 27: a push consumer would deliver anywhere), nor ask for, read or change
// ingest's consumer ingest-outbound.
func TestBridgeUserReadsOnlyOutboundThroughItsOwnConsumers(t *testing.T) {
	t.Parallel()
	f := startFabric(t, Options{})
	nc, errs := natsAs(t, f, UserBridge)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reply, err := nc.RequestWithContext(ctx, "fabric.bridge.dev.to-b", []byte(`{}`))
	if err != nil || reply.Header.Get(bus.HeaderReplyStatus) != "200" {
		t.Fatalf("the bridge user asks for a consumer of dev's outbound subjects: %v %s", err, reply.Data)
	}
	c, err := js.Consumer(ctx, streams.StreamEvents, "to-b")
	if err != nil {
		t.Fatalf("the bridge user binds its consumer: %v", err)
	}
	if cfg := c.CachedInfo().Config; cfg.FilterSubject != "fabric.out.dev.*" || cfg.DeliverSubject != "" {
		t.Fatalf("its consumer: %+v", cfg)
	}
	if _, err := c.Fetch(1, jetstream.FetchMaxWait(100*time.Millisecond)); err != nil {
		t.Fatalf("the bridge user fetches from its consumer: %v", err)
	}
	drain(t, nc, errs)
	for _, cfg := range []jetstream.ConsumerConfig{
		{Durable: "spy", FilterSubject: "fabric.ev.>"},
		{Durable: "to-c", FilterSubject: "fabric.out.dev.*"},
		{Durable: "to-live", FilterSubject: "fabric.out.dev.*", DeliverSubject: "fabric.live.dev.c0ffee"},
		{Durable: streams.ConsumerOutbound, FilterSubject: "fabric.out.*.*"},
	} {
		if !refused(t, nc, errs, func() error {
			cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer ccancel()
			_, err := js.CreateOrUpdateConsumer(cctx, streams.StreamEvents, cfg)
			return err
		}) {
			t.Errorf("the bridge user may make consumer %s on %s", cfg.Durable, cfg.FilterSubject)
		}
	}
	for _, subj := range []string{"fabric.bridge.dev." + streams.ConsumerOutbound, bus.PermConsumerNext + streams.StreamEvents + "." + streams.ConsumerOutbound} {
		if !refused(t, nc, errs, func() error { return nc.Publish(subj, []byte(`{"batch":1}`)) }) {
			t.Errorf("the bridge user may publish %s", subj)
		}
	}
}
