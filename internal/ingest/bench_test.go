package ingest

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Benchmark shape: 1 KiB application messages, in batches, from several
// concurrent callers.
const (
	benchBatch   = 250
	benchCallers = 8
	benchText    = 1000 // characters of text: a ~1 KiB PrivateMessage
	// benchRound is how many batches each path sends in one round.
	benchRound = 2 * benchCallers
)

// BenchmarkIngest measures ingest over HTTP and over NATS against two
// anchors sending the same messages to the same stream on the same server:
// a plain JetStream async publish, and one with Nats-Msg-Id (the server's
// dedup, what ingest's own dedup stands in for). The callers of every path
// (the HTTP client, the NATS requester, the anchors' JetStream publisher)
// run in a process of their own, benchCallers goroutines each with one
// batch of benchBatch messages in flight, every acknowledgement awaited;
// the server and ingest run in this one. Each sub-benchmark interleaves
// the three paths in rounds of benchRound batches, timed apart, the first
// of each round rotating. It reports msgs/s (the measured path),
// plain-msgs/s, msgid-msgs/s, the ratios of-plain and of-msgid; the CPU
// time per message of each path, both processes (cpu-µs/msg,
// plain-cpu-µs/msg, msgid-cpu-µs/msg), and of that the caller's
// (caller-µs/msg, plain-caller-µs/msg, msgid-caller-µs/msg); and the
// ratios cpu-of-plain and cpu-of-msgid (an anchor's CPU over the path's,
// callers included) and srv-cpu-of-plain and srv-cpu-of-msgid (callers
// left out: the server's, and ingest's where it is in the path). On a
// machine others load too the CPU ratios say what the rate ratios would be
// with the CPU to itself.
// jetstream-one-write is the bound: the one write an admitted input costs
// (the input on its per-message subject with its headers, created only if
// absent), sent as ingest sends it (batchPublisher) by the caller process,
// without ingest's intake, peel, classify or dedup read. The anchors
// publish to one subject of the group with the JetStream client's async
// publish.
//
//	go test -run '^$' -bench BenchmarkIngest -benchtime 20000x -count 3 ./internal/ingest/
func BenchmarkIngest(b *testing.B) {
	for _, sub := range []struct{ name, arm string }{
		{"jetstream-one-write", armRaw},
		{"http-msgpack", armHTTP},
		{"nats-msgpack", armNATS},
	} {
		b.Run(sub.name, func(b *testing.B) {
			r := newBenchRig(b)
			interleaved(b, r, r.plan(b, benchMessages(b, r.group, b.N), sub.arm), sub.arm)
		})
	}
}

// BenchmarkIngestAlone runs each path of BenchmarkIngest alone (the same
// messages and batches, without the others), with the messages made before
// the profile starts and the caller in its own process, so that a CPU
// profile of this one shows what the server, and ingest where it is in the
// path, spend on it (docs/ingest.md, "Throughput"). -cpuprofile would also
// profile the making of the messages; -alone-profile profiles only the
// timed part of the one sub-benchmark run:
//
//	go test -run '^$' -bench 'BenchmarkIngestAlone/http-msgpack' -benchtime 100000x ./internal/ingest/ -args -alone-profile cpu.prof
func BenchmarkIngestAlone(b *testing.B) {
	for _, sub := range []struct{ name, arm string }{
		{"jetstream-one-write", armRaw},
		{"http-msgpack", armHTTP},
		{"nats-msgpack", armNATS},
		{"plain", armPlain},
		{"msgid", armMsgID},
	} {
		b.Run(sub.name, func(b *testing.B) {
			r := newBenchRig(b)
			plan := r.plan(b, benchMessages(b, r.group, b.N), sub.arm)
			c := startCaller(b, plan)
			runtime.GC()
			if *aloneProfile != "" {
				f, err := os.Create(*aloneProfile)
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			c0 := cpuNow()
			calls, err := c.run(sub.arm, 0, len(plan.Batches))
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if *aloneProfile != "" {
				pprof.StopCPUProfile()
			}
			perMsg := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) }
			b.ReportMetric(perMsg(cpuNow()-c0), "srv-µs/msg")
			b.ReportMetric(perMsg(calls), "caller-µs/msg")
		})
	}
}

var aloneProfile = flag.String("alone-profile", "", "BenchmarkIngestAlone writes a CPU profile of its timed part here")

// benchRig is one sub-benchmark's server, ingest worker and hosted group.
// Each sub-benchmark has its own, so none runs against a stream and a heap
// the one before it filled.
type benchRig struct {
	env   *env
	group *testpeer.Group
}

func newBenchRig(b *testing.B) *benchRig {
	r := &benchRig{env: newEnv(b, envOpts{limits: Limits{RatePerTenant: -1, ByteRatePerTenant: -1}}), group: newBenchGroup(b)}
	r.env.hostGroup(r.group.ID())
	return r
}

// plan cuts msgs into batches of benchBatch in the forms the anchors and
// arm send them: request bodies, or for armRaw the writes their admission
// makes.
func (r *benchRig) plan(b *testing.B, msgs []schema.TransportMessage, arm string) *callerPlan {
	anchor, err := subject.Input(testTenant, hex.EncodeToString(r.group.ID()), strings.Repeat("00", sha256.Size))
	if err != nil {
		b.Fatal(err)
	}
	p := &callerPlan{
		HTTPURL:       r.env.workers[0].http.URL + "/v1/tenants/" + testTenant + "/transport",
		NATSURL:       r.env.url,
		Token:         benchToken(b),
		IntakeSubject: intakeSubject(testTenant),
		AnchorSubject: anchor,
	}
	for i := 0; i < len(msgs); i += benchBatch {
		part := msgs[i:min(i+benchBatch, len(msgs))]
		var bt callerBatch
		for _, m := range part {
			id := sha256.Sum256(m.Payload)
			bt.Payloads = append(bt.Payloads, m.Payload)
			bt.IDs = append(bt.IDs, hex.EncodeToString(id[:]))
		}
		if arm == armRaw {
			bt.Raw = rawWrites(b, part)
		} else {
			bt.Body = encodeBatch(b, part)
		}
		p.Batches = append(p.Batches, bt)
	}
	return p
}

// path is one path of the benchmark, with the wall time it took and the
// CPU time of each process.
type path struct {
	arm                string
	wall, serve, calls time.Duration
}

// interleaved sends the plan's messages three ways from the caller
// process: through arm, and through the two anchors, a plain JetStream
// async publish and one with Nats-Msg-Id, to the same stream, so with the
// same durability. The three alternate in rounds of benchRound batches,
// each timed apart, and which goes first rotates from round to round, so
// neither whatever else loads the machine nor running first or last
// favours one.
func interleaved(b *testing.B, r *benchRig, plan *callerPlan, arm string) {
	b.SetBytes(int64(len(plan.Batches[0].Payloads[0])))
	c := startCaller(b, plan)
	measured, plain, withID := &path{arm: arm}, &path{arm: armPlain}, &path{arm: armMsgID}
	paths := []*path{measured, plain, withID}
	runtime.GC() // the garbage of making the messages is no one's cost
	b.ResetTimer()
	for k, lo := 0, 0; lo < len(plan.Batches); k, lo = k+1, lo+benchRound {
		hi := min(lo+benchRound, len(plan.Batches))
		for i := range paths {
			p := paths[(k+i)%len(paths)]
			start, c0 := time.Now(), cpuNow()
			calls, err := c.run(p.arm, lo, hi)
			if err != nil {
				b.Fatal(err)
			}
			p.wall += time.Since(start)
			p.serve += cpuNow() - c0
			p.calls += calls
		}
	}
	b.StopTimer()
	rate := func(p *path) float64 { return float64(b.N) / p.wall.Seconds() }
	perMsg := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) }
	b.ReportMetric(rate(measured), "msgs/s")
	b.ReportMetric(rate(plain), "plain-msgs/s")
	b.ReportMetric(rate(withID), "msgid-msgs/s")
	b.ReportMetric(rate(measured)/rate(plain), "of-plain")
	b.ReportMetric(rate(measured)/rate(withID), "of-msgid")
	for _, p := range []struct {
		prefix string
		p      *path
	}{{"", measured}, {"plain-", plain}, {"msgid-", withID}} {
		b.ReportMetric(perMsg(p.p.serve+p.p.calls), p.prefix+"cpu-µs/msg")
		b.ReportMetric(perMsg(p.p.calls), p.prefix+"caller-µs/msg")
	}
	if measured.serve > 0 {
		all := float64(measured.serve + measured.calls)
		b.ReportMetric(float64(plain.serve+plain.calls)/all, "cpu-of-plain")
		b.ReportMetric(float64(withID.serve+withID.calls)/all, "cpu-of-msgid")
		b.ReportMetric(float64(plain.serve)/float64(measured.serve), "srv-cpu-of-plain")
		b.ReportMetric(float64(withID.serve)/float64(measured.serve), "srv-cpu-of-msgid")
	}
}

// rawWrites are the writes ingest makes for each admitted message: the
// input with its headers, created only if absent.
func rawWrites(b *testing.B, msgs []schema.TransportMessage) []rawWrite {
	out := make([]rawWrite, 0, len(msgs))
	for _, tm := range msgs {
		in := &input{msg: tm, id: sha256.Sum256(tm.Payload), class: schema.ClassApplication, mls: tm.Payload, groupHex: hex.EncodeToString(tm.Group)}
		pub, err := inputMsg(testTenant, in)
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, rawWrite{Subject: pub.Subject, Header: pub.Header, Data: pub.Data})
	}
	return out
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
