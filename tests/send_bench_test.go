package tests

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/demo"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// BenchmarkSendThroughAPI measures a hosted client's send through the
// whole front of the all-in-one (in process): from the HTTP request
// (POST …/conversations/{group_id}/messages {"text"}) through the client
// API, FABRIC_IN and converge, to the message stored on the outbound
// subject (its stream timestamp). One group, one hosted client, the only
// member. sequential: the next request once the last message is on the
// outbound subject (the send latency); burst: b.N requests from 8 callers
// at once (one group's rate, latency with the queue); burst-sync-interval:
// the burst without an fsync per write. Reported: sends/s, p50-ms, p99-ms
// (docs/outbound.md, Figures).
func BenchmarkSendThroughAPI(b *testing.B) {
	b.Run("sequential", func(b *testing.B) { benchSendThroughAPI(b, 1, 0) })
	b.Run("burst", func(b *testing.B) { benchSendThroughAPI(b, 8, 0) })
	// The same burst with JetStream fsyncing every two minutes instead of
	// every acknowledged write (fabric run -sync-interval 2m).
	b.Run("burst-sync-interval", func(b *testing.B) { benchSendThroughAPI(b, 8, 2*time.Minute) })
}

func benchSendThroughAPI(b *testing.B, callers int, syncInterval time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := startInProcess(b, ctx, func(o *allinone.Options) { o.SyncInterval = syncInterval })
	token := func(s auth.Scope) string { return ok[string](b)(f.Token(time.Hour, s)) }
	api := &demo.API{BaseURL: f.URL, Tenant: allinone.DevTenant, AdminToken: token(auth.ScopeAdmin)}
	account := make([]byte, 32)
	_, _ = rand.Read(account)
	hosted := ok[demo.Registered](b)(api.Register(ctx, hex.EncodeToString(account)))
	ops := client.NewOperations(f.URL, allinone.DevTenant, token(auth.ScopeSend), nil)
	name := "bench"
	created := ok[schema.OperationAccepted](b)(ops.CreateConversation(ctx, hosted.ClientID, "create", schema.CreateConversation{Name: &name}))
	operationDone(b, ctx, ops, hosted.ClientID, created.OperationID)

	// The outbound subject is read as a bridge reads it, as the NATS user
	// bridge.
	js := connectAsBridge(b, f)
	subj := ok[string](b)(subject.Outbound(allinone.DevTenant, hex.EncodeToString(created.GroupID)))
	c := ok[jetstream.Consumer](b)(js.CreateOrUpdateConsumer(ctx, streams.StreamEvents, jetstream.ConsumerConfig{
		Durable: "bench", FilterSubject: subj, AckPolicy: jetstream.AckNonePolicy, DeliverPolicy: jetstream.DeliverNewPolicy}))

	var mu sync.Mutex
	sent := make(map[string]time.Time, b.N)
	lat := make([]time.Duration, 0, b.N)
	send := func(i int) {
		key := fmt.Sprintf("send-%d", i)
		mu.Lock()
		sent[hex.EncodeToString(bus.OperationID(allinone.DevTenant, hosted.ClientID, key, string(schema.OpSendMessage), hex.EncodeToString(created.GroupID)))] = time.Now()
		mu.Unlock()
		if _, err := ops.SendText(ctx, hosted.ClientID, created.GroupID, key, "hello, this is a chat message of a typical length"); err != nil {
			b.Error(err)
		}
	}
	receive := func(n int) {
		for want := len(lat) + n; len(lat) < want; {
			batch := ok[jetstream.MessageBatch](b)(c.Fetch(want-len(lat), jetstream.FetchMaxWait(30*time.Second)))
			got := 0
			for m := range batch.Messages() {
				md := ok[*jetstream.MsgMetadata](b)(m.Metadata())
				mu.Lock()
				t0, known := sent[m.Headers().Get(bus.HeaderOperationID)]
				mu.Unlock()
				if !known {
					b.Fatalf("a message of an operation not sent: %s", m.Headers().Get(bus.HeaderOperationID))
				}
				lat = append(lat, md.Timestamp.Sub(t0))
				got++
			}
			if got == 0 {
				b.Fatalf("%d of %d messages on the outbound subject", len(lat), want)
			}
		}
	}

	b.ResetTimer()
	start := time.Now()
	if callers == 1 {
		for i := range b.N {
			send(i)
			receive(1)
		}
	} else {
		var wg sync.WaitGroup
		for w := range callers {
			wg.Go(func() {
				for i := w; i < b.N; i += callers {
					send(i)
				}
			})
		}
		receive(b.N)
		wg.Wait()
	}
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "sends/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
