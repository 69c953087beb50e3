package ingest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/streams"
	"github.com/fabric-mls/fabric/internal/subject"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Benchmark shape: 1 KiB application messages, in batches, from several
// concurrent callers.
const (
	benchBatch   = 250
	benchCallers = 8
	benchText    = 1000 // characters of text: a ~1 KiB PrivateMessage
)

// BenchmarkIngest measures ingest over HTTP and over NATS against a plain
// JetStream async publish of the same bytes to the same stream on the same
// server, in one run. Each sub-benchmark reports msgs/s; the others also
// report their rate as a fraction of the plain publish ("of-plain").
// jetstream-three-writes is the bound: the three writes an admitted input
// costs, raw.
//
//	go test -run '^$' -bench BenchmarkIngest -benchtime 20000x ./internal/ingest/
func BenchmarkIngest(b *testing.B) {
	e := newEnv(b, envOpts{limits: Limits{RatePerTenant: -1}})
	g := newBenchGroup(b)
	e.hostGroup(g.ID())
	var plain float64

	b.Run("jetstream-async-publish", func(b *testing.B) {
		msgs := benchMessages(b, g, b.N)
		subj, err := subject.Input(testTenant, hex.EncodeToString(g.ID()))
		if err != nil {
			b.Fatal(err)
		}
		js, err := jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(4096))
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(msgs[0].Payload)))
		b.ResetTimer()
		for _, m := range msgs {
			if _, err := js.PublishAsync(subj, m.Payload, jetstream.WithStallWait(stallWait)); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			b.Fatal("publishes not acknowledged")
		}
		plain = msgsPerSec(b)
	})
	// The writes ingest must make for each admitted input, raw: the
	// fabric-seen create, the first outcome record and the input itself,
	// pipelined, without any ingest logic. Its rate bounds ingest's.
	b.Run("jetstream-three-writes", func(b *testing.B) {
		msgs := benchMessages(b, g, b.N)
		raw := make([]*nats.Msg, 0, 3*len(msgs))
		for _, tm := range msgs {
			id := sha256.Sum256(tm.Payload)
			idHex := hex.EncodeToString(id[:])
			key, err := subject.SeenKey(testTenant, idHex)
			if err != nil {
				b.Fatal(err)
			}
			seen := nats.NewMsg("$KV." + streams.BucketSeen + "." + key)
			seen.Data = []byte("1764685000000")
			seen.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
			rec, err := outcomeMsg(testTenant, schema.Outcome{MessageID: id[:], Class: schema.ClassApplication, Status: schema.StatusQueued, Revision: 1, Time: time.Now().UTC()}, 0)
			if err != nil {
				b.Fatal(err)
			}
			subj, err := subject.Input(testTenant, hex.EncodeToString(g.ID()))
			if err != nil {
				b.Fatal(err)
			}
			in := nats.NewMsg(subj)
			in.Data = tm.Payload
			in.Header.Set(jetstream.MsgIDHeader, testTenant+"."+idHex)
			in.Header.Set(HeaderClass, string(schema.ClassApplication))
			in.Header.Set(HeaderMessageID, idHex)
			raw = append(raw, seen, rec, in)
		}
		js, err := jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(4096))
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(msgs[0].Payload)))
		b.ResetTimer()
		for _, m := range raw {
			if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(stallWait)); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			b.Fatal("publishes not acknowledged")
		}
		reportOfPlain(b, plain)
	})
	w := e.workers[0]
	tok := benchToken(b)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchCallers}}
	defer client.CloseIdleConnections()
	b.Run("http-msgpack", func(b *testing.B) {
		msgs := benchMessages(b, g, b.N)
		bodies := encodeBatches(b, msgs)
		b.SetBytes(int64(len(msgs[0].Payload)))
		b.ResetTimer()
		fanIn(b, bodies, func(bt batch) error {
			req, err := http.NewRequest(http.MethodPost, w.http.URL+"/v1/tenants/"+testTenant+"/transport", bytes.NewReader(bt.body))
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Content-Type", httpapi.ContentTypeMsgpack)
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			var r Response
			if err := decodeResponse(resp, &r); err != nil {
				return err
			}
			return checkQueued(r, bt.n)
		})
		reportOfPlain(b, plain)
	})
	b.Run("nats-msgpack", func(b *testing.B) {
		msgs := benchMessages(b, g, b.N)
		bodies := encodeBatches(b, msgs)
		b.SetBytes(int64(len(msgs[0].Payload)))
		b.ResetTimer()
		fanIn(b, bodies, func(bt batch) error {
			m := nats.NewMsg(IntakePrefix + testTenant)
			m.Header.Set(HeaderContentType, httpapi.ContentTypeMsgpack)
			m.Data = bt.body
			reply, err := e.nc.RequestMsg(m, 30*time.Second)
			if err != nil {
				return err
			}
			var r Response
			if err := decodeMsgpack(reply.Data, &r); err != nil {
				return err
			}
			return checkQueued(r, bt.n)
		})
		reportOfPlain(b, plain)
	})
}

func msgsPerSec(b *testing.B) float64 {
	r := float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(r, "msgs/s")
	return r
}

func reportOfPlain(b *testing.B, plain float64) {
	r := msgsPerSec(b)
	if plain > 0 {
		b.ReportMetric(r/plain, "of-plain")
	}
}

// batch is one intake request body, encoded before the timer starts: the
// callers' encoding is not ingest's cost.
type batch struct {
	body []byte
	n    int
}

// encodeBatches cuts msgs into msgpack request bodies of benchBatch.
func encodeBatches(b *testing.B, msgs []schema.TransportMessage) []batch {
	var out []batch
	for i := 0; i < len(msgs); i += benchBatch {
		part := msgs[i:min(i+benchBatch, len(msgs))]
		out = append(out, batch{body: encodeBatch(b, part), n: len(part)})
	}
	return out
}

// fanIn sends the batches from benchCallers goroutines.
func fanIn(b *testing.B, all []batch, send func(batch) error) {
	batches := make(chan batch, len(all))
	for _, bt := range all {
		batches <- bt
	}
	close(batches)
	var wg sync.WaitGroup
	errs := make(chan error, benchCallers)
	for range benchCallers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := range batches {
				if err := send(batch); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

func checkQueued(r Response, n int) error {
	if len(r.Results) != n {
		return fmt.Errorf("%d results for %d messages", len(r.Results), n)
	}
	for _, res := range r.Results {
		if res.Status != schema.StatusQueued {
			return fmt.Errorf("result %s/%s", res.Status, res.Category)
		}
	}
	return nil
}

func encodeBatch(b *testing.B, batch []schema.TransportMessage) []byte {
	ws := make([]map[string]any, len(batch))
	for i, m := range batch {
		ws[i] = map[string]any{"v": m.V, "group": []byte(m.Group), "kind": string(m.Kind), "payload": []byte(m.Payload)}
	}
	return msgpackBody(b, map[string]any{"messages": ws})
}

func decodeResponse(resp *http.Response, r *Response) error {
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	body, err := httpapi.ReadBody(&http.Request{Body: resp.Body}, 64<<20)
	if err != nil {
		return err
	}
	return decodeMsgpack(body, r)
}

// benchMessages makes n distinct application messages of ~1 KiB.
func benchMessages(b *testing.B, g *testpeer.Group, n int) []schema.TransportMessage {
	b.Helper()
	body := strings.Repeat("x", benchText)
	out := make([]schema.TransportMessage, n)
	for i := range out {
		m, err := g.SendText(body)
		if err != nil {
			b.Fatal(err)
		}
		out[i] = m.Transport
	}
	return out
}

func newBenchGroup(b *testing.B) *testpeer.Group {
	b.Helper()
	p, err := testpeer.New("bench")
	if err != nil {
		b.Fatal(err)
	}
	g, err := p.CreateGroup(components.Set{})
	if err != nil {
		b.Fatal(err)
	}
	return g
}

func benchToken(b *testing.B) string {
	tok, err := auth.Mint(testSecret, auth.Claims{Tenant: testTenant, Scopes: []auth.Scope{auth.ScopeIngest}, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		b.Fatal(err)
	}
	return tok
}
