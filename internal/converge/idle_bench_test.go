package converge

import (
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/procstat"
	"github.com/fabric-mls/fabric/internal/testpeer"
)

// BenchmarkIdleMembers measures the memory of idle hosted members: 1,000
// of them, in groups of 1, 10 or 100, join and go idle. Per member it
// reports the RSS the process holds once every group is dropped and the
// worker has returned the freed memory to the system as it does in
// production (cold-rss-B/member), beyond a worker that hosted one group of
// the same size and dropped it, each the mean over rssCycles collections
// (settledRSS); against mls-go's own state of the same members, their
// joined states held in memory (mls-B/member), as a ratio (cold-rss/mls).
// Beside them: the live heap dropping the groups freed (resident-B/member:
// what an idle member kept in memory holds), the live heap still held once
// they are dropped (cold-B/member), the RSS while they were resident
// (hot-rss-B/member) and mls-go's state serialized and sealed
// (mls-snapshot-B/member). With -converge-server-cpus the server's process
// is another, and its RSS per member is server-rss-B/member; embedded, the
// figures hold the server's share of the stored state. b.N is not used:
// run it with -benchtime 1x.
func BenchmarkIdleMembers(b *testing.B) {
	for _, per := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("members=1000/per-group=%d", per), func(b *testing.B) { benchIdle(b, 1000, per) })
	}
}

func benchIdle(b *testing.B, total, per int) {
	e := newEnvWithin(b, 20*time.Minute)
	groups := total / per
	welcomes := make([]testpeer.Message, groups)
	members := make([][]hosted, groups)
	for i := range groups {
		_, members[i], welcomes[i] = benchGroup(b, e, per)
	}
	_, _, warm := benchGroup(b, e, per)
	clock := &testClock{}
	m := NewMetrics(nil)
	w, _ := e.worker("bench", func(c *Config) { c.Metrics, c.Now, c.IdleAfter = m, clock.Now, time.Hour })
	// The base is a worker that has owned every partition, hosted one
	// group of the same size and dropped it: what it holds whatever the
	// members (its caches, its partitions' fetch buffers, the code it ran).
	e.publish(warm)
	e.waitAccepted(warm.ID, 10*time.Minute)
	e.goIdle(w, clock, 1)
	baseRSS, baseServer := settledRSS(b), e.serverRSS()
	baseHeap := liveHeap()
	for _, wel := range welcomes {
		e.publish(wel)
	}
	for _, wel := range welcomes {
		e.waitAccepted(wel.ID, 10*time.Minute)
	}
	hotRSS := settledRSS(b)
	hotHeap := liveHeap()
	e.goIdle(w, clock, 2)
	// What the worker left, read before any collection of the benchmark's.
	coldRSS, coldServer := settledRSS(b), e.serverRSS()
	coldHeap := liveHeap()

	// The anchor: the same members joined outside converge, held, with
	// no cache beside them.
	before := liveHeap()
	mls := EngineMLS{Vault: e.vault}
	states := make([]MemberState, 0, total)
	for i, hs := range members {
		for _, h := range hs {
			st, _, err := mls.Join(e.ctx, Client{Tenant: tenant, ClientID: h.rec.ClientID, Sealed: h.rec.Installation}, welcomes[i].MLS)
			if err != nil {
				b.Fatal(err)
			}
			states = append(states, st)
		}
	}
	after := liveHeap()
	// The test's own Welcomes and hosted records, last read by the joins
	// above, are no part of the difference.
	runtime.KeepAlive(welcomes)
	runtime.KeepAlive(members)
	snapshots := 0
	for _, st := range states {
		s, err := st.Snapshot()
		if err != nil {
			b.Fatal(err)
		}
		snapshots += len(s)
	}
	runtime.KeepAlive(states)
	perMember := func(v int64) float64 { return float64(v) / float64(total) }
	anchor := perMember(int64(after) - int64(before))
	b.ReportMetric(perMember(coldRSS-baseRSS), "cold-rss-B/member")
	b.ReportMetric(anchor, "mls-B/member")
	b.ReportMetric(perMember(coldRSS-baseRSS)/anchor, "cold-rss/mls")
	b.ReportMetric(perMember(int64(hotHeap)-int64(coldHeap)), "resident-B/member")
	b.ReportMetric(perMember(int64(coldHeap)-int64(baseHeap)), "cold-B/member")
	b.ReportMetric(perMember(hotRSS-baseRSS), "hot-rss-B/member")
	b.ReportMetric(perMember(int64(snapshots)), "mls-snapshot-B/member")
	if e.server != nil {
		b.ReportMetric(perMember(coldServer-baseServer), "server-rss-B/member")
	}
}

// serverRSS is the RSS of the server's own process under
// -converge-server-cpus, 0 for a server embedded in the test process.
func (e *env) serverRSS() int64 {
	if e.server == nil {
		return 0
	}
	return procstat.RSS(e.server.Pid)
}

// liveHeap is the live heap after a full collection, read when two
// readings 2 s apart agree within 0.5 % (or after 40 s): an embedded
// server drops its caches of what it stored a few seconds after.
func liveHeap() uint64 {
	read := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	heap := read()
	for range 20 {
		time.Sleep(2 * time.Second)
		next := read()
		settled := max(next, heap)-min(next, heap) < heap/200
		heap = next
		if settled {
			break
		}
	}
	return heap
}

// rssCycles is how many garbage collections settledRSS averages over.
const rssCycles = 10

// settledRSS is the process's mean RSS over its next rssCycles garbage
// collections, the benchmark forcing none: an idle worker still allocates
// (each partition's fetch, every cleanup interval), so its RSS rises
// towards the heap goal between collections, and what is returned to the
// system just after one is not what the process holds.
func settledRSS(t testing.TB) int64 {
	cycles := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(cycles)
	end := cycles[0].Value.Uint64() + rssCycles
	var sum, n int64
	eventually.Within(t, 5*time.Minute, fmt.Sprintf("%d garbage collections", rssCycles), func() bool {
		sum += procstat.RSS(os.Getpid())
		n++
		metrics.Read(cycles)
		return cycles[0].Value.Uint64() >= end
	})
	return sum / n
}

// goIdle moves the worker's clock (Config.Now) an hour at a time, with
// Config.IdleAfter an hour, until the worker holds no group in memory, has
// returned the memory of every dropped group to the system, and has done
// so at least releases times. A convergence pass a group's last input left
// due runs at the first move and is a transaction too: the group is idle
// an hour after it.
func (e *env) goIdle(w *Worker, clock *testClock, releases int) {
	e.t.Helper()
	m := w.metrics
	eventually.Within(e.t, time.Minute, "every group dropped and its memory released", func() bool {
		done := testutil.ToFloat64(m.MemoryReleases)
		w.release.mu.Lock()
		released := !w.release.pending && float64(w.release.asked) == done
		w.release.mu.Unlock()
		if testutil.ToFloat64(m.Resident) == 0 && released && done >= float64(releases) {
			return true
		}
		clock.advance(time.Hour)
		return false
	})
}

// BenchmarkColdActivation measures the first input to a cold group: b.N
// groups of 1, 10 or 100 hosted members join and are dropped from memory
// (Config.IdleAfter); then one message is sent to each in turn, and the
// time from its publication to its accepted outcome is the activation
// latency (ns/op, cold-ms/msg), beside the same for a second message to
// each, its members resident again (hot-ms/msg).
func BenchmarkColdActivation(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			e := newEnvWithin(b, 20*time.Minute)
			gs := make([]*testpeer.Group, b.N)
			welcomes := make([]testpeer.Message, b.N)
			for i := range gs {
				gs[i], _, welcomes[i] = benchGroup(b, e, n)
			}
			clock := &testClock{}
			m := NewMetrics(nil)
			w, _ := e.worker("bench", func(c *Config) { c.Metrics, c.Now, c.IdleAfter = m, clock.Now, time.Hour })
			for _, wel := range welcomes {
				e.publish(wel)
			}
			for _, wel := range welcomes {
				e.waitAccepted(wel.ID, 10*time.Minute)
			}
			e.goIdle(w, clock, 1)
			// One message to each group, in turn, timed from publication
			// to its accepted outcome.
			round := func(text string) time.Duration {
				var took time.Duration
				for i, g := range gs {
					msg := must[testpeer.Message](b)(g.SendText(fmt.Sprintf("%s %d", text, i)))
					done := e.acceptedSignal(msg.ID)
					start := time.Now()
					e.publish(msg)
					e.wait(done, "message not accepted in time")
					took += time.Since(start)
				}
				return took
			}
			b.ResetTimer()
			cold := round("cold")
			b.StopTimer()
			hot := round("hot")
			b.ReportMetric(float64(cold.Microseconds())/1000/float64(b.N), "cold-ms/msg")
			b.ReportMetric(float64(hot.Microseconds())/1000/float64(b.N), "hot-ms/msg")
		})
	}
}
