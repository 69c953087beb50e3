package engine

import (
	"fmt"
	"testing"

	"github.com/thomas-vilte/mls-go/framing"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
)

func BenchmarkClassify(b *testing.B) {
	cases := messageCases(b)
	for _, name := range []string{"mls_welcome", "mls_group_info", "mls_key_package", "public_message_commit", "public_message_proposal", "private_message"} {
		var msg []byte
		for _, c := range cases {
			if c.name == name {
				msg = c.msg
				break
			}
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(msg)))
			for b.Loop() {
				if _, err := Classify(msg); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/without-id", func(b *testing.B) {
			for b.Loop() {
				if _, err := classifyFraming(msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// adminGroup returns a new group of a remote admin, alice.
func adminGroup(b testing.TB) *testpeer.Group {
	b.Helper()
	alice, err := testpeer.New("alice")
	if err != nil {
		b.Fatal(err)
	}
	ag, err := alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}})
	if err != nil {
		b.Fatal(err)
	}
	return ag
}

// benchGroup returns a hosted member's state in a group of n members made by
// a remote admin, and the admin's group.
func benchGroup(b testing.TB, n int) (*State, *testpeer.Group) {
	b.Helper()
	st, ag, _ := benchGroupHosted(b, n)
	return st, ag
}

// benchGroupHosted is benchGroup with the hosted member's installation.
func benchGroupHosted(b testing.TB, n int) (*State, *testpeer.Group, *Installation) {
	b.Helper()
	ag := adminGroup(b)
	hosted, err := CreateInstallation(newAccount(b), 0)
	if err != nil {
		b.Fatal(err)
	}
	kps, err := hosted.NewKeyPackages(1)
	if err != nil {
		b.Fatal(err)
	}
	for i := range n - 2 {
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
	_, welcome, err := ag.Invite(kps...)
	if err != nil {
		b.Fatal(err)
	}
	st, _, err := hosted.Join(welcome.MLS, nil)
	if err != nil {
		b.Fatal(err)
	}
	return st, ag, hosted
}

// chatMessages returns n distinct text messages from g: identical ones
// would share a signature.
func chatMessages(b testing.TB, g *testpeer.Group, n int) [][]byte {
	b.Helper()
	msgs := make([][]byte, n)
	for i := range msgs {
		m, err := g.SendText(fmt.Sprintf("hello, this is chat message %d, of a typical length", i))
		if err != nil {
			b.Fatal(err)
		}
		msgs[i] = m.MLS
	}
	return msgs
}

// BenchmarkDecrypt decrypts one application message for one hosted member,
// beside mls-go's own receive (group.ReceiveApplicationMessage) of the same
// messages on an identical copy of the state.
func BenchmarkDecrypt(b *testing.B) {
	st, ag := benchGroup(b, 3)
	const batch = 4096
	msgs := chatMessages(b, ag, batch)
	b.Run("engine", func(b *testing.B) {
		var s *State
		i := 0
		for b.Loop() {
			if i%batch == 0 {
				b.StopTimer()
				var err error
				if s, err = st.Clone(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			if _, err := s.Decrypt(msgs[i%batch]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("mls-go", func(b *testing.B) {
		var s *State
		i := 0
		for b.Loop() {
			if i%batch == 0 {
				b.StopTimer()
				var err error
				if s, err = st.Clone(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			m, err := framing.UnmarshalMLSMessage(msgs[i%batch])
			if err != nil {
				b.Fatal(err)
			}
			pm, _ := m.AsPrivate()
			if _, _, _, err := s.g.ReceiveApplicationMessage(pm); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkDecryptTenMembers decrypts each message with ten states of the
// group, as ten hosted members do, with and without a shared
// SignatureCache; one op is one message for all ten.
func BenchmarkDecryptTenMembers(b *testing.B) {
	st, ag := benchGroup(b, 3)
	const batch = 512
	msgs := chatMessages(b, ag, batch)
	for _, shared := range []bool{false, true} {
		b.Run(fmt.Sprintf("shared-signatures=%v", shared), func(b *testing.B) {
			states := make([]*State, 10)
			i := 0
			for b.Loop() {
				if i%batch == 0 {
					b.StopTimer()
					var sigs *SignatureCache
					if shared {
						sigs = NewSignatureCache(0)
					}
					for k := range states {
						var err error
						if states[k], err = st.Clone(); err != nil {
							b.Fatal(err)
						}
						states[k].ShareSignatures(sigs)
					}
					b.StartTimer()
				}
				for _, s := range states {
					if _, err := s.Decrypt(msgs[i%batch]); err != nil {
						b.Fatal(err)
					}
				}
				i++
			}
		})
	}
}

func BenchmarkSnapshot100(b *testing.B) {
	st, _ := benchGroup(b, 100)
	snap, err := st.Snapshot()
	if err != nil {
		b.Fatal(err)
	}
	b.Run("snapshot", func(b *testing.B) {
		for b.Loop() {
			if _, err := st.Snapshot(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(snap)), "snapshot-bytes")
	})
	// The state encoded whole by mls-go each time, as its first snapshot
	// and the first after a send or an own commit are; "snapshot" above
	// splices the secret tree in, as after decryptions.
	b.Run("snapshot-whole", func(b *testing.B) {
		for b.Loop() {
			st.json.Store(nil)
			if _, err := st.Snapshot(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("restore", func(b *testing.B) {
		for b.Loop() {
			if _, err := Restore(snap); err != nil {
				b.Fatal(err)
			}
		}
	})
	// Without the structural pre-validation (what Clone does): the
	// difference to "restore" is the check's cost.
	b.Run("restore-unchecked", func(b *testing.B) {
		for b.Loop() {
			if _, err := restore(snap, false); err != nil {
				b.Fatal(err)
			}
		}
	})
	// A declared leaf count of 2^22 that mls-go allocated in full before it
	// read a node (≈0.5 s per restore before the check; 2^28 exhausted memory).
	damaged := withTreeLeaves(b, snap, 1<<22)
	b.Run("restore-damaged", func(b *testing.B) {
		for b.Loop() {
			if _, err := Restore(damaged); err == nil {
				b.Fatal("damaged snapshot restored")
			}
		}
	})
}

// BenchmarkAuthenticates is the membership-tag check convergence runs per
// retained candidate state before replaying a commit against it.
func BenchmarkAuthenticates100(b *testing.B) {
	st, ag := benchGroup(b, 100)
	commit, err := ag.Commit()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if ok, err := st.Authenticates(commit.MLS); !ok || err != nil {
			b.Fatal("genuine commit does not authenticate", err)
		}
	}
}

// BenchmarkProcessCommit100 is a commit against a 100-member parent, the
// unit of convergence replay (includes the copy of the parent).
func BenchmarkProcessCommit100(b *testing.B) {
	st, ag := benchGroup(b, 100)
	commit, err := ag.Commit()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, _, err := st.ProcessHandshake(commit.MLS); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHostedJoins: every hosted member of a 100-member group joins
// from the one Welcome that added them all; an op is the whole group's
// joins. In full each join checks all 100 leaves' signatures; through a
// WelcomeCache only the first does.
func BenchmarkHostedJoins(b *testing.B) {
	const n = 100
	insts, welcome := invitedInstallations(b, adminGroup(b), n)
	for _, cached := range []bool{false, true} {
		b.Run(fmt.Sprintf("welcome-cache=%v", cached), func(b *testing.B) {
			for b.Loop() {
				var opts []JoinOption
				if cached {
					opts = append(opts, WithWelcomeCache(NewWelcomeCache(0)))
				}
				for _, inst := range insts {
					if _, _, err := inst.Join(welcome.MLS, nil, opts...); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
