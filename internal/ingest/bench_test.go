package ingest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Benchmark shape: 1 KiB application messages, in batches, from several
// concurrent callers.
const (
	benchBatch   = 250
	benchCallers = 8
	benchText    = 1000 // characters of text: a ~1 KiB PrivateMessage
	// benchRound is how many batches run between two plain rounds.
	benchRound = 2 * benchCallers
)

// BenchmarkIngest measures ingest over HTTP and over NATS against two
// anchors sending the same messages to the same stream on the same server:
// a plain JetStream async publish, and one with Nats-Msg-Id (the server's
// dedup, what ingest's own dedup stands in for). Each sub-benchmark
// interleaves the three in rounds of benchRound batches, timed apart, the
// first of each round rotating (interleaved). It reports msgs/s (the
// measured path), plain-msgs/s, msgid-msgs/s, the ratios of-plain and
// of-msgid, and the process CPU time per message of each (cpu-µs/msg,
// plain-cpu-µs/msg, msgid-cpu-µs/msg) with the ratios cpu-of-plain and
// cpu-of-msgid (an anchor's CPU over the path's): server and ingest run in
// the process, so on a machine others load too the CPU ratio says what the
// rate ratio would be with the CPU to itself.
// jetstream-one-write is the bound: the one write an admitted input costs
// (the input on its per-message subject with its headers, created only if
// absent), sent as ingest sends it (batchPublisher), without ingest's
// intake, peel, classify or dedup read. The anchors publish to one subject
// of the group with the JetStream client's async publish.
//
//	go test -run '^$' -bench BenchmarkIngest -benchtime 20000x -count 3 ./internal/ingest/
func BenchmarkIngest(b *testing.B) {
	b.Run("jetstream-one-write", func(b *testing.B) {
		r := newBenchRig(b)
		p := newBatchPublisher(r.env.nc)
		if err := p.start(); err != nil {
			b.Fatal(err)
		}
		defer p.stop()
		interleaved(b, r, func(bt batch) error {
			res, err := p.publish(context.Background(), r.js, bt.raw)
			if err != nil {
				return err
			}
			for _, r := range res {
				if r.err != nil {
					return r.err
				}
			}
			return nil
		}, true)
	})
	b.Run("http-msgpack", func(b *testing.B) {
		r := newBenchRig(b)
		send, done := httpSender(b, r)
		defer done()
		interleaved(b, r, send, false)
	})
	b.Run("nats-msgpack", func(b *testing.B) {
		r := newBenchRig(b)
		interleaved(b, r, func(bt batch) error {
			m := nats.NewMsg(intakeSubject(testTenant))
			m.Header.Set(HeaderContentType, httpapi.ContentTypeMsgpack)
			m.Data = bt.body
			reply, err := r.env.nc.RequestMsg(m, 30*time.Second)
			if err != nil {
				return err
			}
			var res Response
			if err := decodeMsgpack(reply.Data, &res); err != nil {
				return err
			}
			return checkQueued(res, bt.n)
		}, false)
	})
}

// BenchmarkIngestHTTPAlone runs ingest's HTTP path alone, the same
// messages and batches as BenchmarkIngest/http-msgpack without the anchors
// and with the messages made before the profile starts, so that a CPU
// profile shows what ingest's path costs (docs/ingest.md, "Throughput"):
//
//	go test -run '^$' -bench BenchmarkIngestHTTPAlone -benchtime 100000x -cpuprofile cpu.prof ./internal/ingest/
func BenchmarkIngestHTTPAlone(b *testing.B) {
	r := newBenchRig(b)
	send, done := httpSender(b, r)
	defer done()
	bodies := encodeBatches(b, benchMessages(b, r.group, b.N), false)
	runtime.GC()
	b.ResetTimer()
	c0 := cpuNow()
	fanIn(b, bodies, send)
	b.StopTimer()
	b.ReportMetric(float64((cpuNow()-c0).Microseconds())/float64(b.N), "cpu-µs/msg")
}

// httpSender posts one batch to the rig's worker over HTTP as msgpack and
// checks that every message was queued.
func httpSender(b *testing.B, r *benchRig) (send func(batch) error, done func()) {
	w := r.env.workers[0]
	tok := benchToken(b)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchCallers}}
	return func(bt batch) error {
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
		var res Response
		if err := decodeResponse(resp, &res); err != nil {
			return err
		}
		return checkQueued(res, bt.n)
	}, client.CloseIdleConnections
}

// benchRig is one sub-benchmark's server, ingest worker and hosted group.
// Each sub-benchmark has its own, so none runs against a stream and a heap
// the one before it filled.
type benchRig struct {
	env   *env
	group *testpeer.Group
	js    jetstream.JetStream
}

func newBenchRig(b *testing.B) *benchRig {
	r := &benchRig{env: newEnv(b, envOpts{limits: Limits{RatePerTenant: -1, ByteRatePerTenant: -1}}), group: newBenchGroup(b)}
	r.env.hostGroup(r.group.ID())
	js, err := jetstream.New(r.env.nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	r.js = js
	return r
}

// anchor publishes msgs to one input subject of the group, asynchronously,
// and awaits them: a plain JetStream publish, or with ids one carrying
// Nats-Msg-Id (the server's own dedup), the write ingest's dedup competes
// with.
func (r *benchRig) anchor(msgs []schema.TransportMessage, ids []string) error {
	subj, err := subject.Input(testTenant, hex.EncodeToString(r.group.ID()), strings.Repeat("00", sha256.Size))
	if err != nil {
		return err
	}
	for i, m := range msgs {
		opts := []jetstream.PublishOpt{jetstream.WithStallWait(stallWait)}
		if ids != nil {
			opts = append(opts, jetstream.WithMsgID(ids[i]))
		}
		if _, err := r.js.PublishAsync(subj, m.Payload, opts...); err != nil {
			return err
		}
	}
	return awaitAsync(r.js)
}

// arm is one path of the benchmark, with the wall and CPU time it took.
type arm struct {
	run       func(lo, hi int, round []batch) error
	wall, cpu time.Duration
}

// interleaved sends the same b.N messages three ways: through send (in
// batches from benchCallers goroutines), and through the two anchors, a
// plain JetStream async publish and one with Nats-Msg-Id, to the same
// stream, so with the same durability. The three alternate in rounds of
// benchRound batches, each timed apart, and which goes first rotates from
// round to round, so neither whatever else loads the machine nor running
// first or last favours one. With raw the batches carry the writes
// admission makes instead of request bodies.
func interleaved(b *testing.B, r *benchRig, send func(batch) error, raw bool) {
	msgs := benchMessages(b, r.group, b.N)
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		id := sha256.Sum256(m.Payload)
		ids[i] = hex.EncodeToString(id[:])
	}
	bodies := encodeBatches(b, msgs, raw)
	b.SetBytes(int64(len(msgs[0].Payload)))
	measured := &arm{run: func(_, _ int, round []batch) error { fanIn(b, round, send); return nil }}
	plain := &arm{run: func(lo, hi int, _ []batch) error { return r.anchor(msgs[lo:hi], nil) }}
	withID := &arm{run: func(lo, hi int, _ []batch) error { return r.anchor(msgs[lo:hi], ids[lo:hi]) }}
	arms := []*arm{measured, plain, withID}
	runtime.GC() // the garbage of making the messages is no one's cost
	b.ResetTimer()
	for k, lo, off := 0, 0, 0; lo < len(bodies); k, lo = k+1, lo+benchRound {
		round := bodies[lo:min(lo+benchRound, len(bodies))]
		n := 0
		for _, bt := range round {
			n += bt.n
		}
		for i := range arms {
			a := arms[(k+i)%len(arms)]
			start, c0 := time.Now(), cpuNow()
			if err := a.run(off, off+n, round); err != nil {
				b.Fatal(err)
			}
			a.wall += time.Since(start)
			a.cpu += cpuNow() - c0
		}
		off += n
	}
	b.StopTimer()
	rate := func(a *arm) float64 { return float64(b.N) / a.wall.Seconds() }
	perMsg := func(a *arm) float64 { return float64(a.cpu.Microseconds()) / float64(b.N) }
	b.ReportMetric(rate(measured), "msgs/s")
	b.ReportMetric(rate(plain), "plain-msgs/s")
	b.ReportMetric(rate(withID), "msgid-msgs/s")
	b.ReportMetric(rate(measured)/rate(plain), "of-plain")
	b.ReportMetric(rate(measured)/rate(withID), "of-msgid")
	b.ReportMetric(perMsg(measured), "cpu-µs/msg")
	b.ReportMetric(perMsg(plain), "plain-cpu-µs/msg")
	b.ReportMetric(perMsg(withID), "msgid-cpu-µs/msg")
	if measured.cpu > 0 {
		b.ReportMetric(float64(plain.cpu)/float64(measured.cpu), "cpu-of-plain")
		b.ReportMetric(float64(withID.cpu)/float64(measured.cpu), "cpu-of-msgid")
	}
}

// awaitAsync waits for every asynchronous publish of js.
func awaitAsync(js jetstream.JetStream) error {
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-time.After(time.Minute):
		return errors.New("publishes not acknowledged")
	}
}

// batch is one intake request body, and the raw writes its messages make
// when admitted, made before the timer starts: the callers' encoding is
// not ingest's cost.
type batch struct {
	body []byte
	raw  []*nats.Msg
	n    int
}

// encodeBatches cuts msgs into batches of benchBatch: msgpack request
// bodies, or with raw the writes their admission makes.
func encodeBatches(b *testing.B, msgs []schema.TransportMessage, raw bool) []batch {
	var out []batch
	for i := 0; i < len(msgs); i += benchBatch {
		part := msgs[i:min(i+benchBatch, len(msgs))]
		bt := batch{n: len(part)}
		if raw {
			bt.raw = rawWrites(b, part)
		} else {
			bt.body = encodeBatch(b, part)
		}
		out = append(out, bt)
	}
	return out
}

// rawWrites are the writes ingest makes for each admitted message: the
// input with its headers, created only if absent.
func rawWrites(b *testing.B, msgs []schema.TransportMessage) []*nats.Msg {
	out := make([]*nats.Msg, 0, len(msgs))
	for _, tm := range msgs {
		in := &input{msg: tm, id: sha256.Sum256(tm.Payload), class: schema.ClassApplication, mls: tm.Payload, groupHex: hex.EncodeToString(tm.Group)}
		pub, err := inputMsg(testTenant, in)
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, pub)
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
	body, err := io.ReadAll(resp.Body)
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
