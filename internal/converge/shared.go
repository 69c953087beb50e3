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
// waiting to join the view (view), or, under Config.OwnViews, its own view.

// sharedKey names the group's view among the member states: client ids are
// hex, so none is this word.
const sharedKey = "view"

// unit is one convergence view that input goes to: a following member's
// own, or, with m nil, the group's shared view.
type unit struct {
	m  *hostedMember
	cg *convergence.Group
}

// units returns the views input goes to, in members' order.
func (p marmot) units(t *txn) ([]unit, error) {
	if p.shared {
		if len(t.g.following()) == 0 {
			return nil, nil
		}
		cg, err := p.view(t)
		if err != nil {
			return nil, err
		}
		return []unit{{cg: cg}}, nil
	}
	var out []unit
	for _, m := range t.g.following() {
		cg, err := p.group(t, m)
		if err != nil {
			return nil, err
		}
		out = append(out, unit{m: m, cg: cg})
	}
	return out, nil
}

// view returns the group's shared view, joining into it every following
// member whose own state a Welcome or a create just gave (Group.Join). A
// member whose Welcome is ahead of every state the view retains
// (convergence.ErrNoNode: the commit that adds it is not in yet) keeps its
// own state and joins once the view reaches its epoch. A member's own view
// (Config.OwnViews, or stored before views were shared) joins by its tip.
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

// before is a view's state before a call, to measure its result against:
// the tip and, for the shared view, the members hosted at it.
type before struct {
	tip    *engine.State
	hosted []string
}

func (u unit) before() before {
	b := before{tip: u.cg.Tip()}
	if u.m == nil {
		b.hosted = u.cg.Hosted()
	}
	return b
}

// record turns a view's result into events and outcome notes.
func (s *step) record(m *hostedMember, b before, res convergence.Result) {
	if m == nil {
		s.sharedEffects(b, res)
		return
	}
	s.effects(m, b.tip, res)
}

// sharedEffects turns the shared view's result into every member's events
// as effects does for a member's own view (docs/converge.md, Branch
// selection → Effects): a member is at a state of the view when it is
// hosted there (b.hosted, then AppliedCommit.Hosted; AppliedCommit.Removed
// are not), its commit events are measured against its own view before,
// and it is delivered what names it a recipient (Delivery.Recipients).
func (s *step) sharedEffects(b before, res convergence.Result) {
	t := s.t
	gid := t.g.GroupID
	s.isLead = false
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
				// Not at the commit's state, it is told nothing of the next.
				views[i] = s.applied(m, views[i], own)
				views[i].gone = !at
				if !m.Removed && slices.Contains(a.Removed, m.ClientID) {
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

// saveShared makes the shared view's tip the group's canonical state. A
// removed member hosted at the tip again was brought back by a winning
// branch (as save does for a member's own view); removals are taken from
// the applied commits (sharedEffects), since a member that joined below
// the tip is not at it either.
func (p marmot) saveShared(t *txn, cg *convergence.Group) {
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

// ownState is member m's own state at the view's tip: the tip itself for a
// member's own view, a copy of its state in the shared view.
func (p marmot) ownState(cg *convergence.Group, m *hostedMember) (*engine.State, error) {
	if !p.shared {
		return cg.Tip(), nil
	}
	return cg.StateOf(m.ClientID)
}

// storedStates returns the ids of the states a transaction stores: every
// following member's own under Config.OwnViews, else the group's one view
// (sharedKey) and the states of members waiting to join it.
func (w *Worker) storedStates(t *txn) []string {
	var out []string
	for _, m := range t.g.following() {
		if w.cfg.OwnViews || !t.inView(m) {
			out = append(out, m.ClientID)
		}
	}
	if t.members[sharedKey] != nil {
		out = append(out, sharedKey)
	}
	return out
}
