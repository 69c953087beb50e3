package engine

import (
	"testing"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
)

// FuzzProcessInput feeds arbitrary bytes to every engine entry point that
// decodes received MLS bytes (parent identification and proposal refs
// included): none may panic, and every error has a category.
func FuzzProcessInput(f *testing.F) {
	alice, err := testpeer.New("alice")
	if err != nil {
		f.Fatal(err)
	}
	ag, err := alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}})
	if err != nil {
		f.Fatal(err)
	}
	hosted, err := CreateInstallation(newAccount(f), 0)
	if err != nil {
		f.Fatal(err)
	}
	kps, err := hosted.NewKeyPackages(1)
	if err != nil {
		f.Fatal(err)
	}
	_, welcome, err := ag.Invite(kps[0])
	if err != nil {
		f.Fatal(err)
	}
	st, _, err := hosted.Join(welcome.MLS, nil)
	if err != nil {
		f.Fatal(err)
	}
	app, err := ag.SendText("hi")
	if err != nil {
		f.Fatal(err)
	}
	commit, err := ag.Commit()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(welcome.MLS)
	f.Add(app.MLS)
	f.Add(commit.MLS)
	sigs := NewSignatureCache(64)
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, _, err := st.ProcessHandshake(b); err != nil && CategoryOf(err) == "" {
			t.Fatalf("handshake error without category: %v", err)
		}
		if _, err := st.Authenticates(b); err != nil && CategoryOf(err) == "" {
			t.Fatalf("authenticate error without category: %v", err)
		}
		if _, err := st.ProposalRef(b); err != nil && CategoryOf(err) == "" {
			t.Fatalf("proposal ref error without category: %v", err)
		}
		if _, err := ConsumedProposalRefs(b); err != nil && CategoryOf(err) == "" {
			t.Fatalf("consumed proposal refs error without category: %v", err)
		}
		if _, _, err := hosted.Join(b, nil); err != nil && CategoryOf(err) == "" {
			t.Fatalf("join error without category: %v", err)
		}
		s, err := st.Clone()
		if err != nil {
			t.Fatal(err)
		}
		s.ShareSignatures(sigs)
		if _, err := s.Decrypt(b); err != nil && CategoryOf(err) == "" {
			t.Fatalf("decrypt error without category: %v", err)
		}
	})
}

// FuzzCommitAdd feeds arbitrary bytes as a KeyPackage to an own commit (the
// bytes an operation's caller supplies): it may not panic, every error has
// a category, and a refused commit leaves the state unchanged.
func FuzzCommitAdd(f *testing.F) {
	inst, err := CreateInstallation(newAccount(f), 0)
	if err != nil {
		f.Fatal(err)
	}
	st, err := inst.CreateGroup(nil, components.Set{Admins: []components.AccountID{components.AccountID(inst.AccountID())}})
	if err != nil {
		f.Fatal(err)
	}
	bob, err := testpeer.New("bob")
	if err != nil {
		f.Fatal(err)
	}
	kp, err := bob.KeyPackage()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(kp)
	f.Add(kp[4:])
	f.Fuzz(func(t *testing.T, b []byte) {
		before := st.Changes()
		if _, err := st.Commit(inst, CommitRequest{Add: [][]byte{b}}); err != nil {
			if CategoryOf(err) == "" {
				t.Fatalf("commit error without category: %v", err)
			}
			if st.Changes() != before {
				t.Fatal("a refused commit changed the state")
			}
		}
	})
}
