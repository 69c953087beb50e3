package converge

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fabric-mls/fabric/internal/procstat"
	"github.com/fabric-mls/fabric/internal/testpeer"
)

// BenchmarkIdleMembers measures the memory of idle hosted members: 1,000
// of them, in groups of 1, 10 or 100, join and go idle. Per member it
// reports the live heap Config.IdleAfter frees when it drops their groups
// (resident-B/member: what an idle member kept in memory holds), the live
// heap and RSS the process still holds beyond what it held before the
// worker started once they are dropped (cold-B/member, cold-rss-B/member:
// the embedded NATS server's share of the stored state included), and
// mls-go's own state of the same members: their joined states held in
// memory (mls-B/member) and serialized, sealed (mls-snapshot-B/member).
// b.N is not used: run it with -benchtime 1x.
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
	clock := &testClock{}
	m := NewMetrics(nil)
	baseHeap, baseRSS := liveMemory()
	e.worker("bench", func(c *Config) { c.Metrics, c.Now, c.IdleAfter = m, clock.Now, time.Hour })
	for _, w := range welcomes {
		e.publish(w)
	}
	for _, w := range welcomes {
		e.waitAccepted(w.ID, 10*time.Minute)
	}
	hotHeap, _ := liveMemory()
	clock.run(2 * time.Hour)
	e.waitCold(m)
	coldHeap, coldRSS := liveMemory()

	// The anchor: the same members joined outside converge, held, with
	// no cache beside them.
	before, _ := liveMemory()
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
	after, _ := liveMemory()
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
	b.ReportMetric(perMember(int64(hotHeap)-int64(coldHeap)), "resident-B/member")
	b.ReportMetric(perMember(int64(coldHeap)-int64(baseHeap)), "cold-B/member")
	b.ReportMetric(perMember(coldRSS-baseRSS), "cold-rss-B/member")
	b.ReportMetric(perMember(int64(after)-int64(before)), "mls-B/member")
	b.ReportMetric(perMember(int64(snapshots)), "mls-snapshot-B/member")
}

// liveMemory is the live heap after a full collection and the process's
// RSS once the freed memory is returned to the system, read when two
// readings 2 s apart agree within 0.5 % (or after 40 s): the embedded
// server drops its caches of what it stored a few seconds after.
func liveMemory() (heap uint64, rss int64) {
	read := func() uint64 {
		runtime.GC()
		debug.FreeOSMemory()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	heap = read()
	for range 20 {
		time.Sleep(2 * time.Second)
		next := read()
		settled := max(next, heap)-min(next, heap) < heap/200
		heap = next
		if settled {
			break
		}
	}
	return heap, procstat.RSS(os.Getpid())
}

// waitCold waits until the worker holds no group in memory
// (Config.IdleAfter).
func (e *env) waitCold(m *Metrics) {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for testutil.ToFloat64(m.Resident) != 0 {
		if time.Now().After(deadline) {
			e.t.Fatalf("%v groups still resident", testutil.ToFloat64(m.Resident))
		}
		time.Sleep(20 * time.Millisecond)
	}
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
			e.worker("bench", func(c *Config) { c.Metrics, c.Now, c.IdleAfter = m, clock.Now, time.Hour })
			for _, w := range welcomes {
				e.publish(w)
			}
			for _, w := range welcomes {
				e.waitAccepted(w.ID, 10*time.Minute)
			}
			clock.run(2 * time.Hour)
			e.waitCold(m)
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
