package converge

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/natsserver"
	"github.com/fabric-mls/fabric/internal/procstat"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// benchGroup makes a group whose n hosted members have joined, with the
// remote sender alice, and returns the Welcome too.
func benchGroup(b *testing.B, e *env, n int) (*testpeer.Group, []hosted, testpeer.Message) {
	b.Helper()
	alice := peer(b, "alice")
	hs := make([]hosted, n)
	kps := make([][]byte, n)
	for i := range hs {
		hs[i] = e.register(peer(b, fmt.Sprintf("member-%d", i)).AccountID(), 1)
		kps[i] = hs[i].kps[0]
	}
	g := must[*testpeer.Group](b)(alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}}))
	_, welcome, err := g.Invite(kps...)
	if err != nil {
		b.Fatal(err)
	}
	return g, hs, welcome
}

// waitAccepted waits for an input's accepted outcome.
func (e *env) waitAccepted(id []byte, timeout time.Duration) {
	e.t.Helper()
	subj, err := subject.Outcome(tenant, hex.EncodeToString(id))
	if err != nil {
		e.t.Fatal(err)
	}
	s, err := e.js.Stream(e.ctx, streams.StreamOutcomes)
	if err != nil {
		e.t.Fatal(err)
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if m, err := s.GetLastMsgForSubject(e.ctx, subj); err == nil {
			var o schema.Outcome
			if o.UnmarshalMsgpack(m.Data) == nil && o.Disposition == schema.DispositionAccepted {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.t.Fatal("input not accepted in time")
}

// BenchmarkConverge measures application messages per second through
// converge (FABRIC_IN to committed events, outcome recorded) for a group
// with 1, 10 and 100 hosted members, writing member states after every
// transaction that decrypted (the default) or every 16th. The same run then
// decrypts the same messages with every member's state in memory, one
// member after another and nothing stored (the engine's raw rate), with the
// members' states sharing one signature cache as converge's do, so each
// message's signature is verified once in both; which of the two runs
// first is drawn at random in each round. It reports the ratio of the two.
func BenchmarkConverge(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		for _, every := range []int{1, 16} {
			b.Run(fmt.Sprintf("members=%d/snapshot-every=%d", n, every), func(b *testing.B) { benchConverge(b, n, every) })
		}
	}
}

func benchConverge(b *testing.B, n, every int) {
	e := newEnv(b)
	g, hs, welcome := benchGroup(b, e, n)
	states := benchStates(b, e, hs, welcome)
	// The atomic batch limit deploy/ and the embedded servers configure;
	// the default lease and cleanup period (the harness's shorter ones make
	// the 64 partitions' idle fetches and heartbeats five times as often).
	e.worker("bench", func(c *Config) {
		c.SnapshotEvery, c.MaxBatch = every, natsserver.DefaultMaxAtomicBatch
		c.LeaseTTL, c.CleanupInterval = DefaultLeaseTTL, DefaultCleanupInterval
	})
	e.publish(welcome)
	e.waitAccepted(welcome.ID, time.Minute)
	e.waitKeyPackagesConsumed(hs)
	e.waitConsumers()
	msgs, ins := benchInputs(b, g)
	done := e.acceptedSignal(msgs[len(msgs)-1].ID)
	rawFirst := rand.IntN(2) == 0
	var raw rawRun
	if rawFirst {
		raw = rawDecrypt(b, e, states, msgs)
	}
	b.ResetTimer()
	stopProfile := profileTimed(b)
	cpu, srvCPU := processCPU(b), e.serverCPU()
	start := time.Now()
	// Published as ingest does, pipelined: the publisher is not the bound.
	// Past nats.go's pending bound (a server behind in a long run) it
	// waits for the acknowledgements in flight, then goes on.
	for _, m := range ins {
		_, err := e.js.PublishMsgAsync(m)
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			<-e.js.PublishAsyncComplete()
			_, err = e.js.PublishMsgAsync(m)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	e.wait(done, "last input not accepted in time")
	took, used, srvUsed := time.Since(start), processCPU(b)-cpu, e.serverCPU()-srvCPU
	stopProfile()
	b.StopTimer()
	if !rawFirst {
		raw = rawDecrypt(b, e, states, msgs)
	}
	report(b, n, took, used, raw)
	e.reportServer(b, srvUsed)
}

// BenchmarkConvergeBacklog measures converge alone draining a backlog: the
// Welcome and b.N app messages are stored before the worker starts, so
// nothing publishes while it runs (ingest's cost is BenchmarkIngest's). The
// clock starts when the Welcome, the first input, is accepted and stops
// when the last message is.
func BenchmarkConvergeBacklog(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			e := newEnv(b)
			g, hs, welcome := benchGroup(b, e, n)
			states := benchStates(b, e, hs, welcome)
			msgs, ins := benchInputs(b, g)
			e.publish(welcome)
			for _, m := range ins {
				if _, err := e.js.PublishMsgAsync(m); err != nil {
					b.Fatal(err)
				}
			}
			e.wait(e.js.PublishAsyncComplete(), "inputs not stored in time")
			started := e.acceptedSignal(welcome.ID)
			done := e.acceptedSignal(msgs[len(msgs)-1].ID)
			// The worker owns the group's partition alone: a worker starting
			// with all of them would still be creating the others'
			// consumers while the clock runs.
			part, err := subject.Partition(tenant, hex.EncodeToString(g.ID()))
			if err != nil {
				b.Fatal(err)
			}
			e.worker("bench", func(c *Config) { c.MaxBatch, c.Partitions = natsserver.DefaultMaxAtomicBatch, []int{part} })
			e.wait(started, "Welcome not accepted in time")
			e.waitKeyPackagesConsumed(hs)
			b.ResetTimer()
			cpu, srvCPU := processCPU(b), e.serverCPU()
			start := time.Now()
			e.wait(done, "last input not accepted in time")
			took, used, srvUsed := time.Since(start), processCPU(b)-cpu, e.serverCPU()-srvCPU
			b.StopTimer()
			report(b, n, took, used, rawDecrypt(b, e, states, msgs))
			e.reportServer(b, srvUsed)
		})
	}
}

var (
	timedProfile  = flag.String("converge-bench-cpuprofile", "", "write a CPU profile of BenchmarkConverge's timed part only to this path, .1, .2, … per run of more than one message (merge them with go tool pprof)")
	timedProfiles int
)

// profileTimed starts the CPU profile of -converge-bench-cpuprofile and
// returns what stops it: the profile then holds converge's work, not the
// set-up or the raw decryption.
func profileTimed(b *testing.B) func() {
	if *timedProfile == "" || b.N == 1 {
		return func() {}
	}
	timedProfiles++
	f, err := os.Create(fmt.Sprintf("%s.%d", *timedProfile, timedProfiles))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// waitKeyPackagesConsumed waits until the Welcome's KeyPackage of every
// hosted member is consumed and its pool refilled (their records
// rewritten), which converge does after the Welcome's batch is stored:
// the Welcome's work, not the messages' the clock measures.
func (e *env) waitKeyPackagesConsumed(hs []hosted) {
	e.t.Helper()
	eventually.Within(e.t, time.Minute, "every hosted member's KeyPackage consumed", func() bool {
		recs, _, err := e.store.ListClients(e.ctx, tenant, 0, len(hs)+1)
		if err != nil {
			return false
		}
		now := map[string][]byte{}
		for _, r := range recs {
			now[r.ClientID] = r.Installation
		}
		for _, h := range hs {
			if bytes.Equal(now[h.rec.ClientID], h.rec.Installation) {
				return false
			}
		}
		return true
	})
}

// waitConsumers waits until the worker has a consumer of every partition:
// making them is its start-up, not the work the clock measures.
func (e *env) waitConsumers() {
	e.t.Helper()
	s, err := e.js.Stream(e.ctx, streams.StreamInput)
	if err != nil {
		e.t.Fatal(err)
	}
	eventually.Within(e.t, time.Minute, "a consumer of every partition", func() bool {
		info, err := s.Info(e.ctx)
		return err == nil && info.State.Consumers >= subject.Partitions
	})
}

// benchStates joins every hosted member from the Welcome outside converge,
// for the raw decryption the rate is compared with. They share one
// signature cache, as the members converge hosts in a group do
// (EngineMLS.Signatures), so both verify each message's signature once.
func benchStates(b *testing.B, e *env, hs []hosted, welcome testpeer.Message) []MemberState {
	b.Helper()
	mls := EngineMLS{Vault: e.vault, Signatures: engine.NewSignatureCache(0)}
	states := make([]MemberState, len(hs))
	for i, h := range hs {
		st, _, err := mls.Join(e.ctx, Client{Tenant: tenant, ClientID: h.rec.ClientID, Sealed: h.rec.Installation}, welcome.MLS)
		if err != nil {
			b.Fatal(err)
		}
		states[i] = st
	}
	return states
}

// benchInputs makes b.N distinct app messages of g, and their inputs.
func benchInputs(b *testing.B, g *testpeer.Group) ([]testpeer.Message, []*nats.Msg) {
	b.Helper()
	msgs := make([]testpeer.Message, b.N)
	ins := make([]*nats.Msg, b.N)
	for i := range msgs {
		msgs[i] = must[testpeer.Message](b)(g.SendText(benchText(i)))
		ins[i] = inputMsg(b, msgs[i])
	}
	return msgs, ins
}

// wait waits for c, or fails the benchmark with why when the test's
// context ends first.
func (e *env) wait(c <-chan struct{}, why string) {
	e.t.Helper()
	select {
	case <-c:
	case <-e.ctx.Done():
		e.t.Fatal(why)
	}
}

// rawRun is the engine's raw decryption of a benchmark's messages.
type rawRun struct {
	rate float64       // messages/s
	cpu  time.Duration // process CPU per message
}

// rawDecrypt decrypts msgs with every member's state in memory, one member
// after another, nothing stored: the engine's raw rate.
func rawDecrypt(b *testing.B, e *env, states []MemberState, msgs []testpeer.Message) rawRun {
	cpu, start := processCPU(b), time.Now()
	for _, m := range msgs {
		for _, st := range states {
			if _, err := st.Decrypt(e.ctx, m.MLS); err != nil {
				b.Fatal(err)
			}
		}
	}
	return rawRun{rate: float64(len(msgs)) / time.Since(start).Seconds(), cpu: (processCPU(b) - cpu) / time.Duration(len(msgs))}
}

// report reports converge's rate beside the raw decryption's, their ratio,
// and the CPU of the whole test process (converge, any publisher, and the
// server unless -converge-server-cpus runs it in its own process) per
// message beside the raw decryption's, and their ratio: on a machine of c
// cores the rate cannot pass c/cpu-µs-per-msg, and on a machine others load
// too the CPU ratio is the steadier one.
func report(b *testing.B, n int, took, cpu time.Duration, raw rawRun) {
	rate := float64(b.N) / took.Seconds()
	perMsg := cpu / time.Duration(b.N)
	b.ReportMetric(float64(perMsg.Microseconds()), "cpu-µs/msg")
	b.ReportMetric(float64(raw.cpu.Microseconds()), "raw-cpu-µs/msg")
	b.ReportMetric(rate, "msgs/s")
	b.ReportMetric(rate*float64(n), "events/s")
	b.ReportMetric(raw.rate, "raw-msgs/s")
	b.ReportMetric(rate/raw.rate, "ratio")
	if perMsg > 0 {
		b.ReportMetric(float64(raw.cpu)/float64(perMsg), "cpu-ratio")
	}
}

// inputMsg is a peer's message as ingest puts it onto FABRIC_IN.
func inputMsg(b testing.TB, m testpeer.Message) *nats.Msg {
	b.Helper()
	c, err := engine.Classify(m.MLS)
	if err != nil {
		b.Fatal(err)
	}
	idHex := hex.EncodeToString(m.ID)
	subj, err := subject.Input(tenant, hex.EncodeToString(m.Transport.Group), idHex)
	if err != nil {
		b.Fatal(err)
	}
	msg := nats.NewMsg(subj)
	msg.Data = m.MLS
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	msg.Header.Set(bus.HeaderClass, string(c.Class))
	msg.Header.Set(bus.HeaderMessageID, idHex)
	return msg
}

// acceptedSignal returns a channel closed when the input's accepted outcome
// is stored: a subscription, so the end of a run is seen at once.
func (e *env) acceptedSignal(id []byte) <-chan struct{} {
	e.t.Helper()
	subj, err := subject.Outcome(tenant, hex.EncodeToString(id))
	if err != nil {
		e.t.Fatal(err)
	}
	done := make(chan struct{})
	var once sync.Once
	sub, err := e.nc.Subscribe(subj, func(m *nats.Msg) {
		var o schema.Outcome
		if o.UnmarshalMsgpack(m.Data) == nil && o.Disposition == schema.DispositionAccepted {
			once.Do(func() { close(done) })
		}
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := e.nc.Flush(); err != nil {
		e.t.Fatal(err)
	}
	return done
}

// serverCPU is the CPU time the server's own process has used
// (-converge-server-cpus), 0 for a server embedded in the test process.
func (e *env) serverCPU() time.Duration {
	if e.server == nil {
		return 0
	}
	return procstat.CPU(e.server.Pid)
}

// reportServer reports the CPU per message of the server's own process
// (-converge-server-cpus), which cpu-µs/msg then leaves out.
func (e *env) reportServer(b *testing.B, used time.Duration) {
	if e.server != nil {
		b.ReportMetric(float64((used / time.Duration(b.N)).Microseconds()), "server-cpu-µs/msg")
	}
}

// processCPU is the CPU time the process has used, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEngineDecrypt is the engine's raw rate for the same work: every
// hosted member's state decrypts every message, in memory, nothing stored.
func BenchmarkEngineDecrypt(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			e := newEnv(b)
			g, hs, welcome := benchGroup(b, e, n)
			states := benchStates(b, e, hs, welcome)
			msgs, _ := benchInputs(b, g)
			b.ResetTimer()
			start := time.Now()
			for _, m := range msgs {
				for _, st := range states {
					if _, err := st.Decrypt(e.ctx, m.MLS); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

// BenchmarkConvergeManyGroups measures the aggregate rate over 16 groups of
// one hosted member each: groups of different partitions are processed in
// parallel.
func BenchmarkConvergeManyGroups(b *testing.B) {
	const groups = 16
	e := newEnv(b)
	gs := make([]*testpeer.Group, groups)
	for i := range gs {
		g, _, welcome := benchGroup(b, e, 1)
		e.publish(welcome)
		gs[i] = g
	}
	e.worker("bench", nil)
	msgs := make([]testpeer.Message, b.N)
	for i := range msgs {
		msgs[i] = must[testpeer.Message](b)(gs[i%groups].SendText(benchText(i)))
	}
	b.ResetTimer()
	start := time.Now()
	for _, m := range msgs {
		e.publish(m)
	}
	for _, m := range msgs[max(0, len(msgs)-groups):] {
		e.waitAccepted(m.ID, 10*time.Minute)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// benchText is the text of benchmark message i. Every message differs, as
// a conversation's do: two messages of the same content from the same
// sender in one epoch carry the same signature, which a shared
// SignatureCache would verify once.
func benchText(i int) string { return fmt.Sprintf("benchmark message %d", i) }
