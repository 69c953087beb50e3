package groupstate

import (
	"bufio"
	"crypto/rand"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/engine"
)

// benchSizes are the hosted-member counts of the benchmarks
// (docs/shared-state.md); pick one with -bench 'Shared/H=1000$'.
var benchSizes = []int{100, 1000, 3000}

// benchWorld is a world of h hosted members plus one standalone engine
// member (the last hosted one, kept apart), whose cost is one member's.
type benchWorld struct {
	*world
	one *engine.State
}

func newBenchWorld(b *testing.B, h int) *benchWorld {
	b.Helper()
	w := newWorld(b, 0, Config{}, false)
	// Invite in batches: one commit with thousands of adds is mls-go's
	// slowest path and not what is measured.
	for len(w.hosted) < h {
		w.invite(min(500, h-len(w.hosted)))
	}
	// Give the tree path keys: a few self-updates.
	for range 2 {
		w.remoteCommit(w.bob, w.bob.Commit)
	}
	one, err := w.g.StateOf(w.hosted[len(w.hosted)-1])
	if err != nil {
		b.Fatal(err)
	}
	return &benchWorld{world: w, one: one}
}

// benchWorlds keeps a size's world across the runs of one benchmark
// (b.N grows between them): setting up thousands of members is slow.
var benchWorlds = map[string]*benchWorld{}

func benchWorldOf(b *testing.B, h int) *benchWorld {
	key := b.Name()
	if bw := benchWorlds[key]; bw != nil {
		bw.t = b
		return bw
	}
	bw := newBenchWorld(b, h)
	benchWorlds[key] = bw
	return bw
}

// peerCommit has bob commit a self-update and alice process it; it
// returns the commit, not yet processed by the hosted members.
func (bw *benchWorld) peerCommit(b *testing.B) []byte {
	b.Helper()
	m, err := bw.bob.Commit()
	if err != nil {
		b.Fatal(err)
	}
	bw.peersProcess(m.Transport, bw.bob)
	return m.MLS
}

// BenchmarkSharedCommit: one commit by a peer (a self-update, so every
// hosted member's path changes), processed once for all h hosted members
// (shared-ms) against one standalone member processing it (one-ms).
func BenchmarkSharedCommit(b *testing.B) {
	for _, h := range benchSizes {
		b.Run(fmt.Sprintf("H=%d", h), func(b *testing.B) {
			bw := benchWorldOf(b, h)
			var shared, one time.Duration
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				commit := bw.peerCommit(b)
				b.StartTimer()
				t0 := time.Now()
				if _, err := bw.g.ProcessHandshake(commit); err != nil {
					b.Fatal(err)
				}
				shared += time.Since(t0)
				b.StopTimer()
				t0 = time.Now()
				next, _, err := bw.one.ProcessHandshake(commit)
				if err != nil {
					b.Fatal(err)
				}
				one += time.Since(t0)
				bw.one = next
				b.StartTimer()
			}
			b.StopTimer()
			// State at rest: the group's one blob against one member's
			// snapshot.
			blob := blobOf(b, bw.g)
			oneSnap, err := bw.one.Snapshot()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(len(blob))/(1<<20), "group-snap-MB")
			b.ReportMetric(float64(len(oneSnap))/(1<<20), "one-snap-MB")
			report(b, "shared-ms", "one-ms", float64(shared.Microseconds())/1e3, float64(one.Microseconds())/1e3)
		})
	}
}

// BenchmarkSharedMessage: a peer's application message decrypted once
// (decrypt-us) and handed to every hosted member (deliver-us, a counter
// per recipient: the O(H) part), against one standalone member decrypting
// it (one-us).
func BenchmarkSharedMessage(b *testing.B) {
	for _, h := range benchSizes {
		b.Run(fmt.Sprintf("H=%d", h), func(b *testing.B) {
			bw := benchWorldOf(b, h)
			msgs := make([][]byte, b.N)
			for i := range msgs {
				m, err := bw.bob.SendText("benchmark message")
				if err != nil {
					b.Fatal(err)
				}
				msgs[i] = m.MLS
			}
			delivered := 0
			var decrypt, deliver, one time.Duration
			b.ResetTimer()
			for _, msg := range msgs {
				t0 := time.Now()
				d, err := bw.g.Decrypt(msg)
				if err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				d.Each(func(string) { delivered++ })
				t2 := time.Now()
				decrypt += t1.Sub(t0)
				deliver += t2.Sub(t1)
				b.StopTimer()
				t0 = time.Now()
				if _, err := bw.one.Decrypt(msg); err != nil {
					b.Fatal(err)
				}
				one += time.Since(t0)
				b.StartTimer()
			}
			b.StopTimer()
			if delivered != h*b.N {
				b.Fatalf("delivered %d times, want %d", delivered, h*b.N)
			}
			b.ReportMetric(float64(deliver.Nanoseconds())/float64(b.N)/1e3, "deliver-us")
			b.ReportMetric(float64(deliver.Nanoseconds())/float64(b.N*h), "ns/recipient")
			report(b, "decrypt-us", "one-us", float64(decrypt.Nanoseconds())/1e3, float64(one.Nanoseconds())/1e3)
		})
	}
}

// report adds per-op metrics, their ratio, and the process's peak RSS and
// live heap (run one size per process for a size's peak).
func report(b *testing.B, sharedUnit, oneUnit string, shared, one float64) {
	n := float64(b.N)
	b.ReportMetric(shared/n, sharedUnit)
	b.ReportMetric(one/n, oneUnit)
	if one > 0 {
		b.ReportMetric(shared/one, "ratio")
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "heap-MB")
	b.ReportMetric(peakRSSMB(), "peak-RSS-MB")
}

// peakRSSMB reads VmHWM, the process's peak resident set, from procfs; 0
// where there is none.
func peakRSSMB() float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			if err != nil {
				return 0
			}
			return kb / 1024
		}
	}
	return 0
}

// BenchmarkSharedRestore: a cold restore of the whole group from its one
// blob (the shared state restored once, every member's part taken), and
// the blob's size.
func BenchmarkSharedRestore(b *testing.B) {
	for _, h := range benchSizes {
		b.Run(fmt.Sprintf("H=%d", h), func(b *testing.B) {
			bw := benchWorldOf(b, h)
			snap, err := bw.g.Snapshot()
			if err != nil {
				b.Fatal(err)
			}
			blob, err := snap.Marshal()
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				s, err := UnmarshalSnapshot(blob)
				if err != nil {
					b.Fatal(err)
				}
				g, err := Restore(s, Config{})
				if err != nil {
					b.Fatal(err)
				}
				if len(g.roster) != h {
					b.Fatalf("restored %d members", len(g.roster))
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(len(blob))/(1<<20), "blob-MB")
			// Live heap of one more restored group, and of one more
			// standalone member's state of the same group.
			group := heapOf(func() any {
				g, err := Restore(snap, Config{})
				if err != nil {
					b.Fatal(err)
				}
				return g
			})
			oneSnap, err := bw.one.Snapshot()
			if err != nil {
				b.Fatal(err)
			}
			one := heapOf(func() any {
				st, err := engine.Restore(oneSnap)
				if err != nil {
					b.Fatal(err)
				}
				return st
			})
			b.ReportMetric(group, "group-heap-MB")
			b.ReportMetric(one, "one-heap-MB")
			b.ReportMetric(group/one, "heap-ratio")
		})
	}
}

// heapOf returns the live heap, in MB, of what produce returns: the mean
// of four copies held at once, so the collector's noise is small beside it.
func heapOf(produce func() any) float64 {
	const copies = 4
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	held := make([]any, copies)
	for i := range held {
		held[i] = produce()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(held)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / copies / (1 << 20)
}

// BenchmarkSharedJoin: hosted members joining a group held already, from
// one Welcome that adds 50 of them: the first joins in full
// (first-join-ms: every leaf's signature checked, as any member's join
// does; the Welcome's one parse included), the others derive only their keys (engine.Installation.JoinKeys,
// keys-join-ms/member). The Welcome's commit is processed before.
func BenchmarkSharedJoin(b *testing.B) {
	for _, h := range benchSizes {
		b.Run(fmt.Sprintf("H=%d", h), func(b *testing.B) {
			bw := benchWorldOf(b, h)
			var first, joins time.Duration
			n := 0
			for range b.N {
				var kps [][]byte
				var insts []*engine.Installation
				for range 50 {
					account := make([]byte, engine.AccountIDLen)
					if _, err := rand.Read(account); err != nil {
						b.Fatal(err)
					}
					inst, err := engine.CreateInstallation(account, 0)
					if err != nil {
						b.Fatal(err)
					}
					kp, err := inst.NewKeyPackages(1)
					if err != nil {
						b.Fatal(err)
					}
					kps, insts = append(kps, kp[0]), append(insts, inst)
					n++
				}
				commit, welcome, err := bw.alice.Invite(kps...)
				if err != nil {
					b.Fatal(err)
				}
				bw.peersProcess(commit.Transport, bw.alice)
				if _, err := bw.g.ProcessHandshake(commit.MLS); err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				pw, err := engine.ParseWelcome(welcome.MLS)
				if err != nil {
					b.Fatal(err)
				}
				first += time.Since(t0)
				for i, inst := range insts {
					t0 := time.Now()
					if _, err := bw.g.JoinWelcome(inst, welcome.MLS, pw, bw.wc); err != nil {
						b.Fatal(err)
					}
					if i == 0 {
						first += time.Since(t0)
					} else {
						joins += time.Since(t0)
					}
				}
			}
			b.ReportMetric(float64(first.Microseconds())/float64(b.N)/1e3, "first-join-ms")
			b.ReportMetric(float64(joins.Microseconds())/float64(n-b.N)/1e3, "keys-join-ms/member")
		})
	}
}

// blobOf is a group's snapshot as its one blob at rest.
func blobOf(tb testing.TB, g *Group) []byte {
	tb.Helper()
	snap, err := g.Snapshot()
	if err != nil {
		tb.Fatal(err)
	}
	blob, err := snap.Marshal()
	if err != nil {
		tb.Fatal(err)
	}
	return blob
}
