package allinone

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
)

// The all-in-one's NATS user bridge (fabric bridge, docs/outbound.md) may
// make consumers on FABRIC_EVENTS filtered to outbound subjects and read
// them; it may not make one on the events, nor create, read or change
// ingest's consumer ingest-outbound.
func TestBridgeUserReadsOnlyOutboundThroughItsOwnConsumers(t *testing.T) {
	f := startFabric(t, Options{})
	nc, errs := natsAs(t, f, UserBridge)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateOrUpdateConsumer(ctx, streams.StreamEvents, jetstream.ConsumerConfig{Durable: "to-b", FilterSubject: "fabric.out.dev.*", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatalf("the bridge user makes no consumer on dev's outbound subjects: %v", err)
	}
	for _, cfg := range []jetstream.ConsumerConfig{
		{Durable: "spy", FilterSubject: "fabric.ev.>"},
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
	if !refused(t, nc, errs, func() error {
		return nc.Publish(bus.PermConsumerNext+streams.StreamEvents+"."+streams.ConsumerOutbound, []byte(`{"batch":1}`))
	}) {
		t.Error("the bridge user may pull from ingest's consumer")
	}
}
