package read_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

var (
	benchMessages      = flag.Int("read-bench-messages", 100_000, "BenchmarkReadPages: messages of the long conversation")
	benchConversations = flag.Int("read-bench-conversations", 10_000, "BenchmarkReadPages: conversations of the client")
	benchRate          = flag.Int("read-bench-rate", 1000, "BenchmarkReadPages: messages/s offered to intake meanwhile")
	benchGroups        = flag.Int("read-bench-groups", 4, "BenchmarkReadPages: groups the offered messages go to")
	benchSync          = flag.Duration("read-bench-sync", 0, "BenchmarkReadPages: JetStream's fsync interval (allinone.Options.SyncInterval); 0 fsyncs every write")
	// Intake answers a request once it stored every message (an fsync by
	// default), so one request at a time would bound the offered rate by
	// that latency.
	benchPosters = flag.Int("read-bench-inflight", 8, "BenchmarkReadPages: intake requests the load keeps in flight")
)

// BenchmarkReadPages measures GET …/conversations/{group_id}/messages?limit=50
// on a conversation of -read-bench-messages messages and GET
// …/conversations?limit=50 on a client with -read-bench-conversations
// conversations, while -read-bench-rate real messages/s are offered to
// intake (bob's, in -read-bench-groups real groups the client holds, the
// MLS messages made before the clock starts), and reports the rate intake
// took and the rate converge delivered (message.received events).
//
// The long conversation and the many conversations are seeded directly:
// the records converge writes (readmodel.RecordMsg on the same subjects,
// content sealed under the tenant's key), published outside converge,
// since making them through MLS would take far longer than the reads. It
// reports the latency percentiles of each request kind and the stream bytes
// one seeded message (its record and pointer) adds.
func BenchmarkReadPages(b *testing.B) {
	master := make([]byte, 32)
	_, _ = rand.Read(master)
	fx := startWith(b, allinone.Options{MasterKey: master, SyncInterval: *benchSync})
	ctx := context.Background()
	js := fx.natsAs(b, allinone.UserConverge)
	vault, err := engine.NewVault(master)
	if err != nil {
		b.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, streams.BucketClients)
	if err != nil {
		b.Fatal(err)
	}
	salt, err := readmodel.TenantSalt(ctx, kv, allinone.DevTenant, true)
	if err != nil {
		b.Fatal(err)
	}
	sealer, err := readmodel.NewSealer(vault, allinone.DevTenant, salt)
	if err != nil {
		b.Fatal(err)
	}
	me := fx.hosted.ClientID
	tenant := allinone.DevTenant

	// The live groups converge ingests into during the reads, and their
	// messages, round robin.
	ch := fx.collect(b)
	var bobs []*testpeer.Group
	for i := range *benchGroups {
		alice, err := testpeer.New("alice")
		if err != nil {
			b.Fatal(err)
		}
		_, _, bob, welcome := invitedBy(b, fx, alice, components.Set{Profile: &components.ProfileState{Name: fmt.Sprintf("live %d", i)}}, fx.keyPackage(b))
		fx.post(b, welcome)
		await(b, ch, schema.KindConversationJoined)
		bobs = append(bobs, bob)
	}
	live := make([]testpeer.Message, 0, 20*(*benchRate))
	for i := range cap(live) {
		m, err := bobs[i%len(bobs)].SendText(fmt.Sprintf("live %d", i))
		if err != nil {
			b.Fatal(err)
		}
		live = append(live, m)
	}
	var delivered atomic.Int64 // message.received events
	// It ends when the subscription's channel closes, at the end.
	go func() {
		for ev := range ch {
			if ev.Kind == schema.KindMessageReceived {
				delivered.Add(1)
			}
		}
	}()

	// Seed: one conversation of benchMessages messages, and
	// benchConversations conversations of the client.
	events, err := js.Stream(ctx, streams.StreamEvents)
	if err != nil {
		b.Fatal(err)
	}
	before := streamBytes(b, events)
	gid := make([]byte, 32)
	_, _ = rand.Read(gid)
	g := hex.EncodeToString(gid)
	sender := hex.EncodeToString(gid) // an inbox id of the right shape
	payload, _ := apppayload.Encode(apppayload.NewText("a message of about the length people write"))
	ct := &schema.ContentTypeID{AuthorityID: "xmtp.org", TypeID: "text", VersionMajor: 1}
	now := time.Now().UnixMilli()
	published := 0
	publish := func(subj string, v any) {
		if published++; published%2000 == 0 {
			awaitPublished(b, js)
		}
		m, err := readmodel.RecordMsg(subj, v)
		if err == nil {
			_, err = js.PublishMsgAsync(m)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	for n := uint64(1); n <= uint64(*benchMessages); n++ {
		id := make([]byte, 32)
		_, _ = rand.Read(id)
		content, err := sealer.Seal(gid, n, payload)
		if err != nil {
			b.Fatal(err)
		}
		subj, _ := readmodel.MessageSubject(tenant, g, n)
		publish(subj, readmodel.Message{N: n, ID: id, GroupID: gid, SenderInboxID: sender, SenderInstallation: gid,
			Seq: n, SentAt: now, State: readmodel.StateDelivered, ContentType: ct, Content: content})
		ps, _ := readmodel.PointerSubject(tenant, id)
		publish(ps, readmodel.Pointer{GroupID: gid, N: n})
	}
	awaitPublished(b, js)
	perMessage := float64(streamBytes(b, events)-before) / float64(*benchMessages)
	installation, _ := hex.DecodeString(me)
	conv := func(group []byte, delivered uint64) readmodel.Conversation {
		return readmodel.Conversation{GroupID: group, ClientID: me, InboxID: fx.hosted.InboxID, Installation: installation,
			Epoch: 1, Inboxes: 2, Installations: 2, Delivered: delivered, FirstN: 1, Activity: now}
	}
	cs, _ := readmodel.ConversationSubject(tenant, g, me)
	publish(cs, conv(gid, uint64(*benchMessages)))
	for range *benchConversations - 1 {
		other := make([]byte, 32)
		_, _ = rand.Read(other)
		s, _ := readmodel.ConversationSubject(tenant, hex.EncodeToString(other), me)
		publish(s, conv(other, 0))
	}
	awaitPublished(b, js)

	// Offered to intake at benchRate per second, in requests of a tick's
	// messages, up to -read-bench-inflight in flight, while the reads run.
	loadCtx, stopLoad := context.WithCancel(ctx)
	var taken atomic.Int64 // messages intake answered queued
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		var posters sync.WaitGroup
		defer posters.Wait()
		sem := make(chan struct{}, max(*benchPosters, 1))
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		per := max(*benchRate/100, 1)
		for sent := 0; sent+per <= len(live); sent += per {
			select {
			case <-loadCtx.Done():
				return
			case <-tick.C:
			}
			select {
			case sem <- struct{}{}:
			case <-loadCtx.Done():
				return
			}
			var ts []schema.TransportMessage
			for _, m := range live[sent : sent+per] {
				ts = append(ts, m.Transport)
			}
			posters.Go(func() {
				defer func() { <-sem }()
				res, err := fx.api.Post(loadCtx, ts...)
				if err != nil && loadCtx.Err() == nil {
					b.Error(err)
				}
				for _, r := range res {
					if r.Status == "queued" {
						taken.Add(1)
					}
				}
			})
		}
	}()

	var msgLat, convLat []time.Duration
	var cursor string
	b.ResetTimer()
	start, delivered0 := time.Now(), delivered.Load()
	for i := range b.N {
		t0 := time.Now()
		n := uint64(i*7919)%uint64(*benchMessages-50) + 1
		var msgs schema.MessagePage
		if st := fx.getMsgpack(b, fmt.Sprintf("/conversations/%s/messages?limit=50&cursor=%d", g, n), &msgs); st != http.StatusOK || len(msgs.Messages) != 50 || msgs.Messages[0].Content == nil {
			b.Fatalf("messages from %d: %d, %d messages", n, st, len(msgs.Messages))
		}
		msgLat = append(msgLat, time.Since(t0))
		t0 = time.Now()
		path := "/conversations?limit=50"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		var page schema.ConversationPage
		if st := fx.getMsgpack(b, path, &page); st != http.StatusOK || len(page.Conversations) != 50 && page.NextCursor != "" {
			b.Fatalf("GET %s: %d, %d conversations", path, st, len(page.Conversations))
		}
		convLat = append(convLat, time.Since(t0))
		cursor = page.NextCursor
	}
	elapsed, deliveredN := time.Since(start), delivered.Load()-delivered0
	b.StopTimer()
	stopLoad()
	<-loadDone
	b.ReportMetric(ms(percentile(msgLat, 0.50)), "messages-p50-ms")
	b.ReportMetric(ms(percentile(msgLat, 0.99)), "messages-p99-ms")
	b.ReportMetric(ms(percentile(convLat, 0.50)), "conversations-p50-ms")
	b.ReportMetric(ms(percentile(convLat, 0.99)), "conversations-p99-ms")
	b.ReportMetric(perMessage, "stored-B/message")
	b.ReportMetric(float64(taken.Load())/elapsed.Seconds(), "intake-msgs/s")
	b.ReportMetric(float64(deliveredN)/elapsed.Seconds(), "delivered-msgs/s")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Ceil(p*float64(len(s))))-1)]
}

func streamBytes(b *testing.B, s jetstream.Stream) uint64 {
	info, err := s.Info(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	return info.State.Bytes
}

func awaitPublished(b *testing.B, js jetstream.JetStream) {
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatal("seeding did not complete")
	}
}
