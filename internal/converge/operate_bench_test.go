package converge

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// BenchmarkSend: send operations of one hosted client in one group, stored
// as the API stores them (no ingest: the outbound messages are not taken
// back as input), measured from the store of each operation to the store
// of its message on the outbound subject. "sequential" stores the next
// operation once the last one's message is stored: its p50 and p99 are the
// send latency. "burst" stores all b.N at once: sends/s is one group's
// rate, and the latencies include the wait behind earlier operations.
func BenchmarkSend(b *testing.B) {
	for _, burst := range []bool{false, true} {
		name := "sequential"
		if burst {
			name = "burst"
		}
		b.Run(name, func(b *testing.B) { benchSend(b, burst) })
	}
}

func benchSend(b *testing.B, burst bool) {
	e := newEnv(b)
	e.worker("w1", nil)
	h := e.register(sha256.Sum256([]byte("sender")), 1)
	create := e.operate(bus.OperationRequest{Kind: schema.OpCreateConversation, ClientID: h.rec.ClientID})
	group := bus.OperationGroupID(create)
	e.operation(create, schema.OperationDone)
	subj, err := subject.Outbound(tenant, hex.EncodeToString(group))
	if err != nil {
		b.Fatal(err)
	}
	c, err := e.js.OrderedConsumer(e.ctx, streams.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		b.Fatal(err)
	}
	payload := textOf(b, "hello, this is a chat message of a typical length")
	sent := make(map[string]time.Time, b.N)
	lat := make([]time.Duration, 0, b.N)
	send := func(i int) {
		id := bus.OperationID(tenant, h.rec.ClientID, fmt.Sprintf("send-%d", i))
		sent[hex.EncodeToString(id)] = time.Now()
		e.operate(bus.OperationRequest{ID: id, Kind: schema.OpSendMessage, ClientID: h.rec.ClientID, GroupID: group, Payload: payload})
	}
	receive := func(n int) {
		for want := len(lat) + n; len(lat) < want; {
			batch, err := c.Fetch(want-len(lat), jetstream.FetchMaxWait(30*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			got := 0
			for m := range batch.Messages() {
				md, err := m.Metadata()
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, md.Timestamp.Sub(sent[m.Headers().Get(bus.HeaderOperationID)]))
				got++
			}
			if got == 0 {
				b.Fatalf("%d of %d messages on the outbound subject", len(lat), want)
			}
		}
	}
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		send(i)
		if !burst {
			receive(1)
		}
	}
	if burst {
		receive(b.N)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "sends/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
