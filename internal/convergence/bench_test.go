package convergence

import (
	"crypto/rand"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/testpeer"
)

// BenchmarkPassThreeWayForkDepth5 measures one convergence pass from a
// fresh instance: admitting a 3-way fork of depth 5 (15 commits) in a
// 50-member group, then cutoff, selection and apply.
//
//	go test -run '^$' -bench PassThreeWayFork -benchmem ./internal/convergence/
func BenchmarkPassThreeWayForkDepth5(b *testing.B) {
	ag, joined := bigGroup(b)
	var inputs []Input
	for range 3 {
		br := clone(b, ag)
		for range 5 {
			inputs = append(inputs, input(commit(b, br)))
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		st := must[*engine.State](b)(joined.Clone())
		g := must[*Group](b)(New(V1, st))
		b.StartTimer()
		for _, in := range inputs {
			if _, err := g.Admit(in, t0); err != nil {
				b.Fatal(err)
			}
		}
		d, _ := g.Deadline()
		r, err := g.Tick(d)
		if err != nil {
			b.Fatal(err)
		}
		if len(r.Applied) != 5 {
			b.Fatalf("applied %d commits", len(r.Applied))
		}
	}
}

// bigGroup is a 50-member group: alice (admin), 48 members and the hosted
// member, whose joined state it returns.
func bigGroup(b *testing.B) (*testpeer.Group, *engine.State) {
	alice := must[*testpeer.Peer](b)(testpeer.NewWithAccount("alice", account(0x80)))
	ag := must[*testpeer.Group](b)(alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}}))
	var peers []*testpeer.Peer
	for i := range 48 {
		peers = append(peers, must[*testpeer.Peer](b)(testpeer.New(fmt.Sprintf("member-%d", i))))
	}
	if _, _, err := ag.Add(peers...); err != nil {
		b.Fatal(err)
	}
	acct := make([]byte, engine.AccountIDLen)
	if _, err := rand.Read(acct); err != nil {
		b.Fatal(err)
	}
	hosted := must[*engine.Installation](b)(engine.CreateInstallation(acct, 0))
	kps := must[[][]byte](b)(hosted.NewKeyPackages(1))
	_, welcome, err := ag.Invite(kps[0])
	if err != nil {
		b.Fatal(err)
	}
	joined, _, err := hosted.Join(welcome.MLS, nil)
	if err != nil {
		b.Fatal(err)
	}
	return ag, joined
}

// BenchmarkAdmitAppMessage measures delivering one app message on the
// canonical tip of a 50-member group: decrypt, payload check, disposition.
//
//	go test -run '^$' -bench AdmitApp -benchmem ./internal/convergence/
func BenchmarkAdmitAppMessage(b *testing.B) {
	ag, joined := bigGroup(b)
	g := must[*Group](b)(New(V1, joined))
	msgs := make([]Input, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		if len(msgs) == 0 {
			for range 4096 {
				msgs = append(msgs, input(text(b, ag, "hello")))
			}
		}
		in := msgs[0] // in send order: the ratchet moves forward
		msgs = msgs[1:]
		b.StartTimer()
		r, err := g.Admit(in, t0)
		if err != nil || len(r.Delivered) != 1 {
			b.Fatalf("not delivered: %v", err)
		}
	}
}

// BenchmarkCompare measures the pinned branch order on tied scores, the
// comparison a pass makes per candidate.
func BenchmarkCompare(b *testing.B) {
	x := Score{EffectiveDepth: 2, Witness: 3, Committer: "20", Digest: ID{1}}
	y := x
	y.Digest = ID{2}
	b.ReportAllocs()
	for b.Loop() {
		if Compare(x, y) >= 0 {
			b.Fatal("order")
		}
	}
}

// BenchmarkAdmitMarshalAfter measures what a caller pays per app message in
// a long epoch: Admit one message to a 50-member group that already holds K
// delivered messages of the same epoch, then Marshal the whole group (what
// internal/converge persists every transaction). at=anchor is an epoch with
// no commit since the join; at=above-anchor follows a commit, so the
// messages may still be withdrawn and keep their payloads. marshal-B/op is
// the size of the persisted bytes at the end.
//
//	go test -run '^$' -bench AdmitMarshalAfter -benchtime 100x -count 3 ./internal/convergence/
func BenchmarkAdmitMarshalAfter(b *testing.B) {
	ag, joined := bigGroup(b)
	for _, at := range []string{"anchor", "above-anchor"} {
		for _, k := range []int{100, 1000, 5000} {
			b.Run(fmt.Sprintf("at=%s/K=%d", at, k), func(b *testing.B) {
				st := must[*engine.State](b)(joined.Clone())
				send := clone(b, ag)
				g := must[*Group](b)(New(V1, st))
				if at == "above-anchor" {
					admit(b, g, t0, commit(b, send))
					if r := settle(b, g); len(r.Applied) != 1 {
						b.Fatal("the commit was not applied")
					}
				}
				for range k {
					if r, err := g.Admit(input(text(b, send, "earlier")), t0); err != nil || len(r.Delivered) != 1 {
						b.Fatalf("not delivered: %v", err)
					}
				}
				if _, err := g.Marshal(); err != nil {
					b.Fatal(err)
				}
				var msgs []Input
				size := 0
				b.ReportAllocs()
				for b.Loop() {
					if len(msgs) == 0 {
						b.StopTimer()
						for range 256 {
							msgs = append(msgs, input(text(b, send, "hello")))
						}
						b.StartTimer()
					}
					in := msgs[0]
					msgs = msgs[1:]
					if r, err := g.Admit(in, t0); err != nil || len(r.Delivered) != 1 {
						b.Fatalf("not delivered: %v", err)
					}
					raw, err := g.Marshal()
					if err != nil {
						b.Fatal(err)
					}
					size = len(raw)
				}
				b.ReportMetric(float64(size), "marshal-B/op")
			})
		}
	}
}

// BenchmarkAdmitHosted measures one app message and one commit (a peer's
// self-update, which changes every hosted member's path) admitted, the
// commit's pass applied, for H hosted members of a group of H+1: one view
// for all of them (shared) against one view per member (per-member, as
// internal/converge runs them today, their states sharing one signature
// cache). docs/shared-state.md, Step 1, holds the figures.
//
//	go test -run '^$' -bench AdmitHosted -benchmem -benchtime 10x ./internal/convergence/
func BenchmarkAdmitHosted(b *testing.B) {
	const h = 100
	alice := must[*testpeer.Peer](b)(testpeer.NewWithAccount("alice", account(0x80)))
	ag := must[*testpeer.Group](b)(alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}}))
	insts, kps := hostedKeyPackages(b, h)
	_, welcome, err := ag.Invite(kps...)
	if err != nil {
		b.Fatal(err)
	}
	joined := map[string]*engine.State{}
	for i, inst := range insts {
		st, _, err := inst.Join(welcome.MLS, nil)
		if err != nil {
			b.Fatal(err)
		}
		joined[fmt.Sprintf("h%03d", i)] = st
	}
	states := func() map[string]*engine.State {
		sigs := engine.NewSignatureCache(0)
		out := map[string]*engine.State{}
		for id, st := range joined {
			out[id] = must[*engine.State](b)(st.Clone())
			out[id].ShareSignatures(sigs)
		}
		return out
	}
	run := func(b *testing.B, views []*Group) {
		send := clone(b, ag)
		now := t0
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			m, c := input(text(b, send, "hello")), input(commit(b, send))
			now = now.Add(time.Minute)
			b.StartTimer()
			for _, g := range views {
				if r, err := g.Admit(m, now); err != nil || len(r.Delivered) != 1 {
					b.Fatalf("message not delivered: %v", err)
				}
				if _, err := g.Admit(c, now); err != nil {
					b.Fatal(err)
				}
				d, _ := g.Deadline()
				if r, err := g.Tick(d); err != nil || len(r.Applied) != 1 {
					b.Fatalf("commit not applied: %v", err)
				}
			}
		}
	}
	b.Run(fmt.Sprintf("H=%d/shared", h), func(b *testing.B) {
		run(b, []*Group{must[*Group](b)(NewHosted(V1, states()))})
	})
	b.Run(fmt.Sprintf("H=%d/per-member", h), func(b *testing.B) {
		var views []*Group
		for _, st := range states() {
			views = append(views, must[*Group](b)(New(V1, st)))
		}
		run(b, views)
	})
}

// BenchmarkHostedCurve measures one view of H hosted members (NewHosted)
// against a view of one member of the same group (New), for H = 100,
// 1,000 and 3,000 (docs/shared-state.md, Step 1, Measured; issue 29). The
// group is one mls-go peer and the H members, invited in batches of up to
// 500: each batch's commit admitted and applied into the view, then each
// member joined (a full join through one engine.WelcomeCache) and put in
// the view by Group.Join. Per iteration the peer sends an app message and
// commits a self-update (every hosted member's path changes); the message
// is admitted into each view (msg-us, one-msg-us; deliver-us is the
// view's Delivery.Recipients of it timed again right after, caches warm:
// a lower bound of msg-us's O(H) part), then the commit admitted and its
// pass applied (commit-ms, one-commit-ms), the two views in turn, the
// first alternating. commit-ratio and msg-ratio are shared over one. peak-RSS-MB is the process's VmHWM over the iterations (reset
// after setup where procfs allows; setup-peak-RSS-MB before it);
// view-heap-MB and one-view-heap-MB are each view's live heap at the end.
// Run one size per process.
//
//	go test -run '^$' -bench 'HostedCurve/H=3000$' -benchtime 10x ./internal/convergence/
func BenchmarkHostedCurve(b *testing.B) {
	for _, h := range []int{100, 1000, 3000} {
		b.Run(fmt.Sprintf("H=%d", h), func(b *testing.B) {
			send, shared, one, now := hostedCurveGroup(b, h)
			setupPeak := peakRSSMB()
			runtime.GC()
			debug.FreeOSMemory()
			if os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) != nil {
				setupPeak = 0
			}
			views := [2]*Group{shared, one}
			var commitT, msgT [2]time.Duration
			var deliverT time.Duration
			i := 0
			for b.Loop() {
				b.StopTimer()
				m, c := input(text(b, send, "hello")), input(commit(b, send))
				now = now.Add(time.Minute)
				b.StartTimer()
				for k := range 2 {
					side := (i + k) % 2
					start := time.Now()
					r, err := views[side].Admit(m, now)
					if err != nil || len(r.Delivered) != 1 {
						b.Fatalf("message not delivered: %v", err)
					}
					msgT[side] += time.Since(start)
					if want := []int{h, 1}[side]; len(r.Delivered[0].Recipients) != want {
						b.Fatalf("%d recipients, want %d", len(r.Delivered[0].Recipients), want)
					}
					if side == 0 {
						start = time.Now()
						views[0].recipients(views[0].tip, r.Delivered[0].Sender)
						deliverT += time.Since(start)
					}
				}
				for k := range 2 {
					side := (i + k) % 2
					start := time.Now()
					if _, err := views[side].Admit(c, now); err != nil {
						b.Fatal(err)
					}
					d, _ := views[side].Deadline()
					r, err := views[side].Tick(d)
					commitT[side] += time.Since(start)
					if err != nil || len(r.Applied) != 1 {
						b.Fatalf("commit not applied: %v", err)
					}
				}
				i++
			}
			n := float64(b.N)
			b.ReportMetric(float64(commitT[0].Microseconds())/1e3/n, "commit-ms")
			b.ReportMetric(float64(commitT[1].Microseconds())/1e3/n, "one-commit-ms")
			b.ReportMetric(float64(commitT[0])/float64(commitT[1]), "commit-ratio")
			b.ReportMetric(float64(msgT[0].Nanoseconds())/1e3/n, "msg-us")
			b.ReportMetric(float64(msgT[1].Nanoseconds())/1e3/n, "one-msg-us")
			b.ReportMetric(float64(msgT[0])/float64(msgT[1]), "msg-ratio")
			b.ReportMetric(float64(deliverT.Nanoseconds())/1e3/n, "deliver-us")
			b.ReportMetric(peakRSSMB(), "peak-RSS-MB")
			b.ReportMetric(setupPeak, "setup-peak-RSS-MB")
			views = [2]*Group{}
			both := heapMB()
			runtime.KeepAlive(one)
			withShared := heapMB()
			runtime.KeepAlive(shared)
			b.ReportMetric(both-withShared, "one-view-heap-MB")
			b.ReportMetric(withShared-heapMB(), "view-heap-MB")
		})
	}
}

// hostedCurveGroup builds BenchmarkHostedCurve's group: the peer's group,
// the view of the h hosted members, a view of the last of them alone, and
// the view's time.
func hostedCurveGroup(b *testing.B, h int) (send *testpeer.Group, shared, one *Group, now time.Time) {
	alice := must[*testpeer.Peer](b)(testpeer.NewWithAccount("alice", account(0x80)))
	send = must[*testpeer.Group](b)(alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}}))
	cache := engine.NewWelcomeCache(0)
	now = t0
	var last string
	for joined := 0; joined < h; {
		// Batches: one commit with thousands of adds is mls-go's slowest
		// path and not what is measured.
		insts, kps := hostedKeyPackages(b, min(500, h-joined))
		c, welcome, err := send.Invite(kps...)
		if err != nil {
			b.Fatal(err)
		}
		if shared != nil {
			now = now.Add(time.Minute)
			admit(b, shared, now, c)
			if r := settle(b, shared); len(r.Applied) != 1 {
				b.Fatal("the invite was not applied")
			}
		}
		// One joined state held at a time: a full state is O(N).
		for _, inst := range insts {
			st, _, err := inst.Join(welcome.MLS, nil, engine.WithWelcomeCache(cache))
			if err != nil {
				b.Fatal(err)
			}
			last = fmt.Sprintf("h%04d", joined)
			joined++
			if shared == nil {
				shared = must[*Group](b)(NewHosted(V1, map[string]*engine.State{last: st}))
			} else if err := shared.Join(last, st); err != nil {
				b.Fatal(err)
			}
		}
	}
	// Give the tree path keys: a few self-updates.
	for range 2 {
		now = now.Add(time.Minute)
		admit(b, shared, now, commit(b, send))
		if r := settle(b, shared); len(r.Applied) != 1 {
			b.Fatal("the self-update was not applied")
		}
	}
	if got := len(shared.Hosted()); got != h {
		b.Fatalf("%d hosted members, want %d", got, h)
	}
	one = must[*Group](b)(New(V1, must[*engine.State](b)(shared.StateOf(last))))
	return send, shared, one, now
}

// peakRSSMB reads VmHWM, the process's peak resident set, from procfs; 0
// where there is none.
func peakRSSMB() float64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(raw)) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			if err != nil {
				return 0
			}
			return kb / 1024
		}
	}
	return 0
}

// heapMB is the live heap after a collection.
func heapMB() float64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc) / (1 << 20)
}
