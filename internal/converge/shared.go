package converge

import (
	"bytes"
	"errors"
	"fmt"
	"slices"

	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/converge/project"
	"github.com/fabric-mls/fabric/internal/convergence"
	"github.com/fabric-mls/fabric/internal/engine"
)

// A group's hosted members share one convergence view
// (convergence.NewHosted, docs/shared-state.md, Step 1): input is admitted
// and passes applied once for all of them, and the view is stored as one
// blob. It is held in the transaction's member states and the checkpoint's
// Members under sharedKey; a member's own entry there is only a state
// waiting to join the view, or its own view stored before views were
// shared, joined into the view when first loaded (view).

// sharedKey names the group's view among the member states: client ids are
// hex, so none is this word.
const sharedKey = "view"

// active returns the group's view input goes to, nil when no hosted
// member follows the group.
func (p marmot) active(t *txn) (*convergence.Group, error) {
	if len(t.g.following()) == 0 {
		return nil, nil
	}
	return p.view(t)
}

// view returns the group's shared view, joining into it every following
// member whose own state a Welcome or a create just gave (Group.Join). A
// member whose Welcome is ahead of every state the view retains
// (convergence.ErrNoNode: the commit that adds it is not in yet) keeps its
// own state and joins once the view reaches its epoch. A member's own view,
// stored before views were shared, joins by its tip.
func (p marmot) view(t *txn) (*convergence.Group, error) {
	b, _ := t.members[sharedKey].(*branchState)
	for _, m := range t.g.following() {
		var st *engine.State
		switch own := t.members[m.ClientID].(type) {
		case *engineState:
			st = own.st
		case *branchState:
			st = own.cg.Tip()
		}
		if st == nil {
			continue
		}
		if b == nil || b.cg.Tip() == nil {
			cg, err := convergence.NewHosted(convergence.V1, map[string]*engine.State{m.ClientID: st})
			if err != nil {
				return nil, fmt.Errorf("start shared view: %w", err)
			}
			b = &branchState{engineState: &engineState{st: cg.Tip(), vault: p.vault}, cg: cg}
		} else if err := b.cg.Join(m.ClientID, st); errors.Is(err, convergence.ErrNoNode) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("join shared view: %w", err)
		}
		delete(t.members, m.ClientID)
	}
	if b == nil {
		return nil, errBranchSelectionMLS
	}
	t.members[sharedKey] = b
	t.dirty[sharedKey] = true
	return b.cg, nil
}

// inView reports whether m's state is in the shared view, not its own
// state waiting to join.
func (t *txn) inView(m *hostedMember) bool { return t.members[m.ClientID] == nil }

// hosts reports whether client is hosted at the view's tip.
func hosts(cg *convergence.Group, client string) bool {
	_, ok := slices.BinarySearch(cg.Hosted(), client)
	return ok
}

// before is the view's state before a call, to measure its result
// against: the tip and the members hosted at it.
type before struct {
	tip    *engine.State
	hosted []string
}

func beforeOf(cg *convergence.Group) before {
	return before{tip: cg.Tip(), hosted: cg.Hosted()}
}

// effects turns the view's result into every member's events and the
// step's outcome notes, in the order docs/convergence.md gives: what no
// longer holds, then what now holds (docs/converge.md, Branch selection →
// Effects). A member is at a state of the view when it is hosted there
// (b.hosted, then AppliedCommit.Hosted; AppliedCommit.Removed are not), its
// commit events are measured against what it was last told, and it is
// delivered what names it a recipient (Delivery.Recipients).
func (s *step) effects(b before, res convergence.Result) {
	t := s.t
	gid := t.g.GroupID
	var ms []*hostedMember
	for _, m := range t.g.following() {
		if t.inView(m) {
			ms = append(ms, m)
		}
	}
	for _, sup := range res.Superseded {
		for _, m := range ms {
			if !m.tookCommit(sup.ID[:]) {
				continue
			}
			withdrawn := make([]string, m.attributedEvents(sup.ID[:]))
			for i := range withdrawn {
				withdrawn[i] = eventID(t.tenant, m.ClientID, s.cause("", sup.ID), i)
			}
			t.emit(m.ClientID, s.cause("superseded:", sup.ID), project.Superseded(gid, sup.ID[:], withdrawn))
		}
		s.rollBack(sup.ID)
	}
	for _, id := range res.Withdrawn {
		// Its recipients were the members holding it but its sender.
		msg := t.message(id[:])
		var to []*hostedMember
		for _, m := range ms {
			if msg == nil || m.holds(msg) && !bytes.Equal(m.Installation, msg.SenderInstallation) {
				to = append(to, m)
			}
		}
		if msg != nil {
			t.retire(msg, readmodel.StateInvalidated, "")
		}
		t.unindex(id[:])
		for _, m := range to {
			t.emit(m.ClientID, s.cause("invalidated:", id), project.Invalidated(gid, id[:]))
		}
		s.rollBack(id)
	}
	var views []view
	// joining are the active members not at the tip before: they joined
	// below it (Group.Join), so their own views start at their join, and
	// the commits up to it are no news to them.
	var joining []bool
	for _, c := range res.Steps() {
		if a := c.Commit; a != nil {
			if views == nil {
				tip := viewOf(b.tip)
				views, joining = make([]view, len(ms)), make([]bool, len(ms))
				for i, m := range ms {
					_, ok := slices.BinarySearch(b.hosted, m.ClientID)
					views[i], joining[i] = tip, !ok && !m.Removed
					if !ok && m.Removed {
						views[i] = view{gone: true}
					}
				}
			}
			for i, m := range ms {
				_, at := slices.BinarySearch(a.Hosted, m.ClientID)
				if joining[i] {
					if at {
						views[i], joining[i] = viewOf(a.State), false
					}
					continue
				}
				own := *a
				if !at {
					own.State = nil
				}
				// Neither at the commit's state nor removed by it: the
				// selected branch does not hold its join.
				lost := !at && !views[i].gone && !slices.Contains(a.Removed, m.ClientID)
				if lost {
					s.joinLost(m, *a)
				} else {
					// Not at the commit's state, it is told nothing of the next.
					views[i] = s.applied(m, views[i], own)
				}
				views[i].gone = !at
				if !m.Removed && (lost || slices.Contains(a.Removed, m.ClientID)) {
					// Retained until the removal settles (settleRemovals).
					m.Removed, m.Retained, m.RemovedEpoch = true, true, a.SourceEpoch+1
					m.LastN = t.g.Delivered
					t.groupChanged = true
				}
			}
			if _, ok := s.lead[a.ID]; !ok {
				s.add(change{commit: true, id: a.ID})
				s.lead[a.ID] = *a
			}
			continue
		}
		d := *c.Delivery
		if len(d.Recipients) == 0 {
			continue
		}
		s.add(change{id: d.ID})
		if s.to[d.ID] == nil {
			s.to[d.ID] = make(map[string]bool, len(d.Recipients))
			s.deliveries[d.ID] = d
		}
		for _, r := range d.Recipients {
			s.to[d.ID][r] = true
		}
	}
	for _, o := range res.Outcomes {
		s.note(noteOf(o, t.g.LastTime))
	}
}

// joinLost records the first commit of a selected branch that does not
// hold member m's join (the commit that added it, or one below it, lost):
// m has no keys there (docs/shared-state.md, Step 1), so its client, told
// conversation.joined, is told conversation.removed (EVENT-006;
// docs/converge.md, Effects: a member the losing branch added is reported
// removed) and nothing of the branch. A branch holding the join that wins
// later brings it back as it does a removed member (applied).
func (s *step) joinLost(m *hostedMember, a convergence.AppliedCommit) {
	s.add(change{commit: true, id: a.ID})
	s.commits[a.ID] = append(s.commits[a.ID], memberCommit{m: m, c: project.Commit{RemovedInstallations: [][]byte{m.Installation}}})
}

// save makes the view's tip the group's canonical state, written with the
// transaction. A removed member hosted at the tip again was brought back
// by a winning branch; removals are taken from the applied commits
// (effects), since a member that joined below the tip is not at it either.
func (p marmot) save(t *txn, cg *convergence.Group) {
	hosted := cg.Hosted()
	for _, m := range t.g.following() {
		if _, in := slices.BinarySearch(hosted, m.ClientID); in && t.inView(m) {
			if m.Removed {
				m.Removed, m.Retained, m.RemovedEpoch, m.LastN = false, false, 0, 0
				t.groupChanged = true
			}
			forkState(t, m, cg)
		}
	}
	t.members[sharedKey] = &branchState{engineState: &engineState{st: cg.Tip(), vault: p.vault}, cg: cg}
	t.dirty[sharedKey] = true
}

// storedStates returns the ids of the states a transaction stores: the
// group's one view (sharedKey) and the states of members waiting to join
// it.
func (t *txn) storedStates() []string {
	var out []string
	for _, m := range t.g.following() {
		if !t.inView(m) {
			out = append(out, m.ClientID)
		}
	}
	if t.members[sharedKey] != nil {
		out = append(out, sharedKey)
	}
	return out
}
