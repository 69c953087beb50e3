package convergence

import (
	"crypto/rand"
	"fmt"
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
	insts := make([]*engine.Installation, h)
	var kps [][]byte
	for i := range insts {
		insts[i] = newHostedInstallation(b)
		kps = append(kps, must[[][]byte](b)(insts[i].NewKeyPackages(1))...)
	}
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
