package testpeer_test

import (
	"bytes"
	"fmt"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
)

// Two remote members make a group, exchange a message and a reply, and end
// in the same state.
func Example() {
	alice, _ := testpeer.New("alice")
	bob, _ := testpeer.New("bob")

	a, _ := alice.CreateGroup(components.Set{
		Profile: &components.ProfileState{Name: "book club"},
		Admins:  []components.AccountID{alice.AccountID()},
	})
	_, joined, _ := a.Add(bob) // the founding commit; bob joins from the Welcome
	b := joined[0]

	hi, _ := a.SendText("hi bob")
	got, _ := b.Process(hi.Transport)
	text, _ := got.Payload.Text()
	fmt.Println(got.Kind, text)

	reply, _ := b.SendReply(hi.ID, "hi alice")
	got, _ = a.Process(reply.Transport)
	ref, kind, _ := got.Payload.References()
	fmt.Println(kind, bytes.Equal(ref, hi.ID))

	commit, _ := a.Commit()
	_, _ = b.Process(commit.Transport)
	fmt.Println(a.Epoch(), bytes.Equal(a.EpochAuthenticator(), b.EpochAuthenticator()))
	// Output:
	// application hi bob
	// reply true
	// 2 true
}
