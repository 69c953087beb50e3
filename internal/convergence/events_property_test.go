package convergence

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/converge/project"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// conversation generates a history whose app messages all sit above the
// root (so one pass settles every one of them): on random nodes, a text,
// a reply to it by another member and, now and then, its sender deleting
// it, with texts of their own between.
func conversation(t testing.TB, w *world, rng *rand.Rand) []testpeer.Message {
	t.Helper()
	out, nodes := historyTree(t, w, rng)
	for range 1 + rng.IntN(3) {
		n := nodes[1+rng.IntN(len(nodes)-1)]
		a, b := n.members[rng.IntN(len(n.members))], n.members[rng.IntN(len(n.members))]
		x := text(t, a, "hello")
		reply := must[testpeer.Message](t)(b.SendReply(x.ID, "hi"))
		out = append(out, x, reply, text(t, b, "aside"))
		if rng.IntN(2) == 0 {
			out = append(out, must[testpeer.Message](t)(a.SendDelete(x.ID)))
		}
	}
	return out
}

// projection turns a hosted member's convergence results into its client
// events as internal/converge does (docs/converge.md, "Effects"): what no
// longer holds, then the applied commits and deliveries in the order the
// changes were made, each commit measured against the view before it, a
// deletion applied to a delivered message of its sender.
type projection struct {
	gid     []byte
	self    project.Member
	comps   components.Set
	inboxes []string
	senders map[ID]string // delivered, not deleted: their sender inbox
	events  []schema.ClientEvent
}

func newProjection(t testing.TB, st *engine.State) *projection {
	t.Helper()
	me, ok := st.Member(st.OwnLeaf())
	if !ok {
		t.Fatal("no own leaf")
	}
	comps, _, err := st.Components()
	if err != nil {
		t.Fatal(err)
	}
	return &projection{
		gid: st.GroupID(), self: project.Member{InboxID: me.InboxID, Installation: me.InstallationKey},
		comps: comps, inboxes: st.InboxIDs(), senders: map[ID]string{},
	}
}

func (p *projection) add(evs ...project.Event) {
	project.Order(evs)
	for _, e := range evs {
		p.events = append(p.events, e.ClientEvent)
	}
}

func (p *projection) take(r Result) {
	for _, s := range r.Superseded {
		p.add(project.Superseded(p.gid, s.ID[:], nil))
	}
	for _, id := range r.Withdrawn {
		delete(p.senders, id)
		p.add(project.Invalidated(p.gid, id[:]))
	}
	for _, s := range r.Steps() {
		if a := s.Commit; a != nil {
			after := a.Result.Components
			var inboxes []string
			if a.State != nil {
				inboxes = a.State.InboxIDs()
			}
			c := project.Commit{Before: p.comps, After: after}
			for _, i := range inboxes {
				if !slices.Contains(p.inboxes, i) {
					c.AddedInboxIDs = append(c.AddedInboxIDs, i)
				}
			}
			for _, i := range p.inboxes {
				if !slices.Contains(inboxes, i) {
					c.RemovedInboxIDs = append(c.RemovedInboxIDs, i)
				}
			}
			for _, l := range a.Result.RemovedLeaves {
				c.RemovedInstallations = append(c.RemovedInstallations, l.InstallationKey)
			}
			p.add(project.CommitEvents(p.gid, p.self, c)...)
			p.comps, p.inboxes = after, inboxes
			continue
		}
		d := s.Delivery
		pl, err := apppayload.Decode(d.Payload)
		if err != nil {
			continue
		}
		ct := &schema.ContentTypeID{AuthorityID: pl.ContentType.AuthorityID, TypeID: pl.ContentType.TypeID, VersionMajor: pl.ContentType.VersionMajor}
		var evs []project.Event
		if ev, ok := project.Received(p.gid, p.self, project.Message{ID: d.ID[:], SenderInboxID: d.Sender.InboxID, SenderInstallation: d.Sender.InstallationKey, ContentType: ct}, 0); ok {
			evs = append(evs, ev)
		}
		if target, ok := pl.DeletionTarget(); ok && len(target) == len(ID{}) && p.senders[ID(target)] == d.Sender.InboxID {
			delete(p.senders, ID(target))
			evs = append(evs, project.Deleted(p.gid, target))
		}
		p.add(evs...)
		p.senders[d.ID] = d.Sender.InboxID
	}
}

// TestPermutationInvarianceOfEvents: what one pass settles projects to the
// same client events (kinds, payloads, order) for the hosted member
// whatever the arrival order and duplicates of its input: random forked
// histories with replies and deletions above the root, admitted in random
// permutations with duplicates before one cutoff (EVENT-012; a deletion
// after its target, PROC-037). Messages at the root are left out: on the
// canonical tip outside recovery they are delivered on arrival, in arrival
// order. Every delivered deletion deletes its target. -convergence.histories=N
// runs more (a tenth of N here).
func TestPermutationInvarianceOfEvents(t *testing.T) {
	n := max(*histories/10, 5)
	if testing.Short() {
		n = 5
	}
	w := newWorld(t)
	deletions := 0
	for h := range n {
		rng := rand.New(rand.NewPCG(uint64(h), 0xe7e7))
		in := conversation(t, w, rng)
		var first []schema.ClientEvent
		for run := range 3 {
			order := slices.Clone(in)
			for range len(in) / 2 {
				order = append(order, in[rng.IntN(len(in))])
			}
			rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			g := w.fresh()
			p := newProjection(t, w.joined)
			for _, m := range order {
				p.take(admit(t, g, t0, m))
			}
			drain(t, g, p.take)
			if run == 0 {
				first = p.events
				asked, deleted := 0, 0
				for _, e := range first {
					switch {
					case e.Kind == schema.KindMessageDeleted:
						deleted++
					case e.Kind == schema.KindMessageReceived && e.MessageReceived.ContentType.TypeID == apppayload.DeletionType.TypeID:
						asked++
					}
				}
				if asked != deleted {
					t.Fatalf("history %d: %d deletions delivered, %d messages deleted:\n%s", h, asked, deleted, eventList(first))
				}
				deletions += deleted
				continue
			}
			if !reflect.DeepEqual(p.events, first) {
				t.Fatalf("history %d run %d: events differ:\n%s\nvs first run:\n%s", h, run, eventList(p.events), eventList(first))
			}
		}
	}
	if deletions == 0 {
		t.Fatal("no history deleted a message")
	}
}

func eventList(evs []schema.ClientEvent) string {
	var b bytes.Buffer
	for _, e := range evs {
		j, _ := e.MarshalJSON()
		fmt.Fprintf(&b, "  %s\n", j)
	}
	return b.String()
}
