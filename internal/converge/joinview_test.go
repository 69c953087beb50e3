package converge

import (
	"bytes"
	"reflect"
	"sync"
	"testing"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// TestWelcomeIntoHeldEpoch_JoinsKeyOnly: hosted clients that a Welcome adds
// to a group whose view holds the Welcome's epoch (its commit admitted)
// join the view with only their keys (MLS.JoinView, docs/shared-state.md,
// Joining); a Welcome that arrives before its commit, and the first
// member's, which starts the view, are full joins. Every one of them is
// told its join as a full join tells it (origin, adder, conversation
// type) and receives the group's next message.
func TestWelcomeIntoHeldEpoch_JoinsKeyOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var hs []hosted
	for _, name := range []string{"bob", "carol", "dave", "erin"} {
		hs = append(hs, e.register(peer(t, name).AccountID(), 1))
	}
	bob, carol, dave, erin := hs[0].rec.ClientID, hs[1].rec.ClientID, hs[2].rec.ClientID, hs[3].rec.ClientID
	var mu sync.Mutex
	keyOnly := map[string]bool{}
	e.hooks.join = func(client string, k bool) {
		mu.Lock()
		defer mu.Unlock()
		keyOnly[client] = k
	}
	e.worker("w1", nil)
	alice, g := groupWithHosted(t, e, components.Set{}, hs[0])
	e.waitEvents(bob, 1)

	invite := func(h ...hosted) (commit, welcome testpeer.Message) {
		var kps [][]byte
		for _, x := range h {
			kps = append(kps, x.kps[0])
		}
		c, w, err := g.Invite(kps...)
		if err != nil {
			t.Fatal(err)
		}
		return c, w
	}
	commit, welcome := invite(hs[1], hs[2])
	e.publish(commit)
	e.publish(welcome)
	e.waitEvents(carol, 1)
	e.waitEvents(dave, 1)
	late, lateWelcome := invite(hs[3])
	e.publish(lateWelcome)
	e.publish(late)
	e.waitEvents(erin, 1)

	mu.Lock()
	got := map[string]bool{bob: keyOnly[bob], carol: keyOnly[carol], dave: keyOnly[dave], erin: keyOnly[erin]}
	mu.Unlock()
	if want := map[string]bool{bob: false, carol: true, dave: true, erin: false}; !reflect.DeepEqual(got, want) {
		t.Fatalf("key-only joins %v, want %v (bob: bob, carol, dave, erin)", got, want)
	}
	want := schema.ConversationJoined{GroupID: g.ID(), ConversationType: schema.ConversationGroup, Origin: schema.OriginWelcomed, AdderInboxID: str(alice.InboxID())}
	for _, c := range []string{carol, dave, erin} {
		if j := e.events(c)[0].Event.ConversationJoined; j == nil || !reflect.DeepEqual(*j, want) {
			t.Fatalf("%s: first event %+v, want %+v", c, e.events(c)[0].Event, want)
		}
	}

	m := must[testpeer.Message](t)(g.SendText("to all four"))
	e.publish(m)
	for _, c := range []string{bob, carol, dave, erin} {
		eventually.True(t, c+" receives the message", func() bool {
			for _, d := range e.events(c) {
				if r := d.Event.MessageReceived; r != nil && bytes.Equal(r.MessageID, m.ID) {
					return true
				}
			}
			return false
		})
	}
}
