package convergence

import (
	"crypto/rand"
	"fmt"
	"testing"

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
