package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/thomas-vilte/mls-go/framing"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
)

// benchHostedGroup returns a group of n members a hosted installation
// created and filled with one commit of n-1 testpeer KeyPackages.
func benchHostedGroup(b *testing.B, n int) (*Installation, *State) {
	b.Helper()
	inst, err := CreateInstallation(newAccount(b), 0)
	if err != nil {
		b.Fatal(err)
	}
	st, err := inst.CreateGroup(nil, components.Set{Admins: []components.AccountID{components.AccountID(inst.AccountID())}})
	if err != nil {
		b.Fatal(err)
	}
	var kps [][]byte
	for i := range n - 1 {
		p, err := testpeer.New(fmt.Sprintf("member-%d", i))
		if err != nil {
			b.Fatal(err)
		}
		kp, err := p.KeyPackage()
		if err != nil {
			b.Fatal(err)
		}
		kps = append(kps, kp)
	}
	if len(kps) > 0 {
		out, err := st.Commit(inst, CommitRequest{Add: kps})
		if err != nil {
			b.Fatal(err)
		}
		if st, _, err = st.ProcessHandshake(out.Commit); err != nil {
			b.Fatal(err)
		}
	}
	return inst, st
}

// BenchmarkEncrypt encrypts one text message as a hosted member
// (State.Encrypt: signer check, mls-go's SendMessage, the MLSMessage bytes,
// the id remembered for own_echo), beside mls-go's own SendMessage and
// marshal of the same payload on an identical copy of the state.
func BenchmarkEncrypt(b *testing.B) {
	inst, st := benchHostedGroup(b, 3)
	payload, err := apppayload.Encode(apppayload.NewText("hello, this is a chat message of a typical length"))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("engine", func(b *testing.B) {
		s, err := st.Clone()
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := s.Encrypt(inst, payload); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("mls-go", func(b *testing.B) {
		s, err := st.Clone()
		if err != nil {
			b.Fatal(err)
		}
		sig := inst.signer()
		for b.Loop() {
			pm, err := s.g.SendMessage(payload, sig)
			if err != nil {
				b.Fatal(err)
			}
			_ = framing.NewMLSMessagePrivate(pm).Marshal()
		}
	})
}

// BenchmarkEncryptOverhead alternates the two encryptions of
// BenchmarkEncrypt within each op, each timed on its own, so load from
// elsewhere falls on both alike; it reports the engine's time over
// mls-go's (ratio) and both per message.
func BenchmarkEncryptOverhead(b *testing.B) {
	inst, st := benchHostedGroup(b, 3)
	payload, err := apppayload.Encode(apppayload.NewText("hello, this is a chat message of a typical length"))
	if err != nil {
		b.Fatal(err)
	}
	eng, err := st.Clone()
	if err != nil {
		b.Fatal(err)
	}
	raw, err := st.Clone()
	if err != nil {
		b.Fatal(err)
	}
	sig := inst.signer()
	var te, tr time.Duration
	engine := func() {
		t0 := time.Now()
		if _, err := eng.Encrypt(inst, payload); err != nil {
			b.Fatal(err)
		}
		te += time.Since(t0)
	}
	mlsgo := func() {
		t0 := time.Now()
		pm, err := raw.g.SendMessage(payload, sig)
		if err != nil {
			b.Fatal(err)
		}
		_ = framing.NewMLSMessagePrivate(pm).Marshal()
		tr += time.Since(t0)
	}
	// Which runs first alternates, so neither gets the warmer cache.
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			engine()
			mlsgo()
		} else {
			mlsgo()
			engine()
		}
	}
	b.ReportMetric(float64(te)/float64(tr), "ratio")
	b.ReportMetric(float64(te.Microseconds())/float64(b.N), "engine-µs/msg")
	b.ReportMetric(float64(tr.Microseconds())/float64(b.N), "mls-go-µs/msg")
}

// BenchmarkCommit makes one self-update commit as a hosted member of a group
// of 10, 100 and 1000 members (State.Commit: a copy of the state, the
// commit, authorization against the parent, the state after it kept as
// pending; it leaves the state as it was), beside mls-go's own Commit and MergeCommit on a fresh copy of the
// state (the copy made outside the timer).
func BenchmarkCommit(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		inst, st := benchHostedGroup(b, n)
		b.Run(fmt.Sprintf("members=%d/engine", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := st.Commit(inst, CommitRequest{}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("members=%d/mls-go", n), func(b *testing.B) {
			sig := inst.signer()
			for b.Loop() {
				b.StopTimer()
				s, err := st.Clone()
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				staged, err := s.g.Commit(sig, sig.PublicKey(), nil)
				if err != nil {
					b.Fatal(err)
				}
				ac := staged.AuthenticatedContent()
				_ = framing.NewMLSMessagePublic(&framing.PublicMessage{Content: ac.Content, Auth: ac.Auth, MembershipTag: staged.MembershipTag()}).Marshal()
				if err := s.g.MergeCommit(staged); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
