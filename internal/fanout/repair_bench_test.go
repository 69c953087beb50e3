package fanout

import (
	"testing"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
)

// BenchmarkRepairRead is the stream reads of repairing one gap of
// fetchBatch events (tap.scan): the stream's bounds, then one batched
// direct get of the client's events.
//
//	go test -run '^$' -bench RepairRead -count 5 ./internal/fanout/
func BenchmarkRepairRead(b *testing.B) {
	n := natstest.Start(b)
	v, err := auth.NewVerifier(secret)
	if err != nil {
		b.Fatal(err)
	}
	g, err := New(Config{NATS: n.Conn, Verifier: v})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = g.Shutdown(b.Context()) })
	for i := range fetchBatch {
		ce := received(groupA, i, &text)
		ev := bus.Event{Tenant: tenantA, ClientID: client1, ID: bus.EventID([]byte{byte(i), byte(i >> 8)}), Event: &ce}
		if _, err := bus.Publish(b.Context(), n.JS, ev); err != nil {
			b.Fatal(err)
		}
	}
	subj, err := subject.Events(tenantA, client1)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, _, err := g.streamBounds(); err != nil {
			b.Fatal(err)
		}
		msgs, err := g.fetchBatch(subj, 1, fetchBatch)
		if err != nil || len(msgs) != fetchBatch {
			b.Fatal(len(msgs), err)
		}
	}
}
