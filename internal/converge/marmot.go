package converge

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/converge/project"
	"github.com/fabric-mls/fabric/internal/convergence"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// marmot is the policy of Marmot branch selection (DESIGN sections 5 and
// 6): a group's hosted members share one convergence.Group, their view of
// the group's candidate branches (shared.go); a member's canonical state is
// at that view's tip. Input
// is admitted in stream order at its stream time, so a replayed stream
// reproduces the same passes; a pass that falls due without input is cut
// off by the partition's cleanup round and applied in the next transaction,
// so its frozen batch is persisted before the selection it leads to.
type marmot struct {
	vault *engine.Vault
	hooks *hooks
}

// errBranchSelectionMLS reports a configuration of branch selection over
// an MLS seam other than EngineMLS: convergence replays engine states.
var errBranchSelectionMLS = errors.New("converge: branch selection needs EngineMLS")

// policy returns the policy the worker applies input with.
func (w *Worker) policy() policy {
	e, _ := w.cfg.MLS.(EngineMLS)
	return marmot{vault: e.Vault, hooks: w.cfg.hooks}
}

// step collects what one input or tick did to every hosted member, so the
// outcomes and deliveries the members share are recorded once.
type step struct {
	t     *txn
	notes []outcomeNote
	index map[string]int
	// changes are the applied commits and deliveries of the step, in the
	// order they were made (convergence.Result.Steps, EVENT-012), each
	// once.
	changes []change
	seen    map[change]bool
	// commits are, for each applied commit, what it changed for each
	// member at it, in members' order; lead is the commit as the view
	// applied it, which moves the group-level state.
	commits map[engine.MessageID][]memberCommit
	lead    map[engine.MessageID]convergence.AppliedCommit
	// deliveries are the payloads to deliver, with the members whose
	// view delivers them.
	deliveries map[engine.MessageID]convergence.Delivery
	to         map[engine.MessageID]map[string]bool
	// rolled are the commits and messages the step took back; their
	// rollback counts rise once the step is done, however many members
	// took them back.
	rolled []engine.MessageID
	// seq and at are the stream position and time the step's deliveries
	// are indexed with: the newest input's.
	seq uint64
	at  int64
	// inboxes are the member inboxes of the states applied, read once
	// for all members (inboxesOf); never changed.
	inboxes map[*engine.State][]string
}

// change is one applied commit or delivery of a step.
type change struct {
	commit bool
	id     engine.MessageID
}

// memberCommit is one applied commit as one member sees it.
type memberCommit struct {
	m *hostedMember
	c project.Commit
	// rejoined: the commit brings a removed member back (effects).
	rejoined bool
}

func (p marmot) newStep(t *txn) *step {
	return &step{
		t: t, index: map[string]int{}, seen: map[change]bool{},
		commits: map[engine.MessageID][]memberCommit{}, lead: map[engine.MessageID]convergence.AppliedCommit{},
		deliveries: map[engine.MessageID]convergence.Delivery{}, to: map[engine.MessageID]map[string]bool{},
		seq: t.g.LastSeq, at: t.g.LastTime,
	}
}

// run admits one input to the group's view.
func (p marmot) run(ctx context.Context, t *txn, in input) error {
	if in.Class == bus.ClassOperation {
		return p.operate(ctx, t, in)
	}
	if in.Class == schema.ClassWelcome {
		note, _, err := t.welcome(ctx, in, func(client string, keyOnly bool) error {
			p.hooks.onJoin(client, keyOnly)
			// Into the group's view at once: a Welcome to many hosted
			// members holds one full state at a time, not one each.
			if keyOnly {
				return nil
			}
			_, err := p.view(t)
			return err
		})
		if err != nil {
			return err
		}
		t.notes = append(t.notes, note)
		return p.settle(t)
	}
	t.g.LastSeq, t.g.LastTime = in.Seq, in.Time
	s := p.newStep(t)
	p.settleRemovals(t, in.Data)
	if len(t.g.following()) == 0 {
		t.notes = append(t.notes, rejectedNote(in.MessageID, in.Class, schema.CategoryUnknownGroup, in.Time))
		return nil
	}
	// A pass due before this input closes first: stream order decides its
	// batch.
	cg, err := p.admit(s, in, time.UnixMilli(in.Time), true)
	if err != nil {
		return err
	}
	if cg != nil && in.Class == schema.ClassProposal {
		p.leaveRequest(ctx, t, cg, in.Data)
	}
	s.finish()
	if err := p.settle(t); err != nil {
		return err
	}
	return p.ownCommitOutcomes(ctx, t)
}

// admit admits one commit, proposal or application message to the
// group's view at now, closing first the passes due at now when
// closePasses is set, and records what the view did in s. It returns the
// view when it admitted the input.
//
// An input the view admitted before is a duplicate there: an own message
// the view admitted when it was sent (deliverOwn), whose copy comes back
// through ingest. It is delivered nothing again; its outcome is the one
// the view holds.
func (p marmot) admit(s *step, in input, now time.Time, closePasses bool) (*convergence.Group, error) {
	t := s.t
	id := engine.MessageID(in.MessageID)
	cg, err := p.active(t)
	if err != nil || cg == nil {
		return nil, err
	}
	if closePasses {
		if _, err := p.pass(s, cg, now); err != nil {
			return nil, err
		}
	}
	b := beforeOf(cg)
	res, err := cg.Admit(convergence.Input{ID: id, Class: in.Class, Data: in.Data}, now)
	if errors.Is(err, convergence.ErrID) || errors.Is(err, convergence.ErrClass) {
		s.note(rejectedNote(in.MessageID, in.Class, schema.CategoryInvalidEncoding, in.Time))
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("admit: %w", err)
	}
	s.effects(b, res)
	if res.Duplicate {
		if o, ok := cg.Outcome(id); ok {
			s.note(noteOf(o, t.g.LastTime))
		}
	}
	p.save(t, cg)
	return cg, nil
}

// tick cuts off every pass that is due at t.now and applies every frozen
// one.
func (p marmot) tick(ctx context.Context, t *txn) (bool, error) {
	if t.g.Due == 0 || t.g.Due > t.now {
		return false, nil
	}
	now := time.UnixMilli(t.now)
	s := p.newStep(t)
	changed := false
	cg, err := p.active(t)
	if err != nil {
		return false, err
	}
	if cg != nil {
		if _, frozen := cg.Frozen(); frozen {
			applied, err := p.pass(s, cg, now)
			if err != nil || !applied {
				return false, err
			}
			changed = true
		} else if _, ok := cg.Cutoff(now); ok {
			changed = true
		}
		if changed {
			p.save(t, cg)
		}
	}
	s.finish()
	if err := p.settle(t); err != nil {
		return false, err
	}
	return changed, p.ownCommitOutcomes(ctx, t)
}

// leaveRequest notes a proposal that removes its sender's own leaf
// (GMOD-031), read against the retained states of its epoch: the
// canonical tip may not have reached it while a pass is open. It is noted
// however its branch fares; a commit that removes the member clears it.
func (p marmot) leaveRequest(ctx context.Context, t *txn, cg *convergence.Group, msg []byte) {
	c, err := engine.Classify(msg)
	if err != nil || !c.HasEpoch {
		return
	}
	for _, st := range cg.Retained() {
		if st.Epoch() != c.Epoch {
			continue
		}
		if _, pi, err := (&engineState{st: st, vault: p.vault}).Proposal(ctx, msg); err == nil {
			if pi.SelfRemoveInboxID != "" {
				t.g.addLeaveRequest(pi.SelfRemoveInboxID)
			}
			return
		}
	}
}

// pass applies the view's frozen pass, or, when a pass is due at now, cuts
// it off and applies it. It reports whether it applied one.
func (p marmot) pass(s *step, cg *convergence.Group, now time.Time) (bool, error) {
	c, frozen := cg.Frozen()
	if !frozen {
		d, open := cg.Deadline()
		if !open || now.Before(d) {
			return false, nil
		}
		if c, frozen = cg.Cutoff(now); !frozen {
			return false, nil
		}
	}
	if cg.Forked() || p.hooks.holdsFrozen() {
		return false, nil
	}
	b := beforeOf(cg)
	res, err := cg.Apply(c, now)
	if err != nil {
		return false, fmt.Errorf("apply pass: %w", err)
	}
	s.effects(b, res)
	return true, nil
}

// view is what a member's client was last told of the group: its
// components and member inboxes (sorted), or that it was removed (gone).
type view struct {
	comps   components.Set
	inboxes []string
	gone    bool
}

// viewOf is the view of a member's canonical state st; nil is gone.
func viewOf(st *engine.State) view {
	v := view{gone: st == nil}
	if st != nil {
		if set, _, err := st.Components(); err == nil {
			v.comps = set
		}
		v.inboxes = st.InboxIDs()
	}
	return v
}

// applied records one commit of the selected branch from the member's
// point of view. Membership and components are measured against the view
// before it, the first one against what the member last saw: after a
// rollback that is the superseded branch, so a member or component change
// the losing branch made and the winner does not is reported undone.
func (s *step) applied(m *hostedMember, before view, a convergence.AppliedCommit) view {
	r := a.Result
	after := view{comps: r.Components}
	if before.gone {
		if a.State == nil {
			return before
		}
		// A removed member that the winning branch keeps: its client was
		// told conversation.removed and now holds the group again, the
		// ended state replaced by the winner's (JOIN-042), so it is told
		// conversation.joined, not what changed since.
		after.inboxes = s.inboxesOf(a.State)
		s.add(change{commit: true, id: a.ID})
		s.commits[a.ID] = append(s.commits[a.ID], memberCommit{m: m, rejoined: true, c: project.Commit{After: r.Components}})
		return after
	}
	if a.State != nil {
		after.inboxes = s.inboxesOf(a.State)
	} else {
		// The commit removed the member: its inbox list is what the
		// commit changed of the one before.
		after.inboxes = slices.DeleteFunc(slices.Clone(before.inboxes), func(i string) bool { return slices.Contains(r.RemovedInboxes, i) })
		after.inboxes = append(after.inboxes, r.AddedInboxes...)
		slices.Sort(after.inboxes)
	}
	pc := project.Commit{
		AddedInboxIDs: missing(after.inboxes, before.inboxes), RemovedInboxIDs: missing(before.inboxes, after.inboxes),
		Before: before.comps, After: after.comps,
	}
	for _, l := range r.RemovedLeaves {
		pc.RemovedInstallations = append(pc.RemovedInstallations, l.InstallationKey)
	}
	s.add(change{commit: true, id: a.ID})
	s.commits[a.ID] = append(s.commits[a.ID], memberCommit{m: m, c: pc})
	return after
}

// inboxesOf returns st's member inboxes, sorted.
func (s *step) inboxesOf(st *engine.State) []string {
	if in, ok := s.inboxes[st]; ok {
		return in
	}
	if s.inboxes == nil {
		s.inboxes = map[*engine.State][]string{}
	}
	s.inboxes[st] = st.InboxIDs()
	return s.inboxes[st]
}

// missing returns the entries of a (sorted) that b (sorted) lacks.
func missing(a, b []string) []string {
	var out []string
	for _, x := range a {
		if _, found := slices.BinarySearch(b, x); !found {
			out = append(out, x)
		}
	}
	return out
}

// add notes a change the first time the step makes it.
func (s *step) add(c change) {
	if !s.seen[c] {
		s.seen[c] = true
		s.changes = append(s.changes, c)
	}
}

// finish emits the step's changes in the order they were made (EVENT-012):
// each commit's events for every member that applied it, then the
// group-level state it moves; each payload delivered and indexed, so a
// deletion finds a target settled with it (PROC-037). Then it records the
// outcome notes.
func (s *step) finish() {
	t := s.t
	for _, c := range s.changes {
		if c.commit {
			s.emitCommit(c.id)
			continue
		}
		d, to := s.deliveries[c.id], s.to[c.id]
		app := AppMessage{Sender: Leaf{InboxID: d.Sender.InboxID, InstallationKey: d.Sender.InstallationKey}, Plaintext: d.Payload}
		t.deliver(slices.Clone(d.ID[:]), s.cause("", d.ID), s.seq, s.at, app, func(m *hostedMember) bool { return to[m.ClientID] })
	}
	for _, id := range s.rolled {
		t.g.rollBack(id[:])
	}
	t.notes = append(t.notes, s.notes...)
}

// emitCommit emits one applied commit's events for each member at it and
// moves the group-level state with the commit as the view applied it.
func (s *step) emitCommit(id engine.MessageID) {
	t := s.t
	for _, mc := range s.commits[id] {
		v := project.Member{InboxID: mc.m.InboxID, Installation: mc.m.Installation, LeaveRequested: t.g.leaveRequested(mc.m.InboxID)}
		evs := project.CommitEvents(t.g.GroupID, v, mc.c)
		if mc.rejoined {
			// EVENT-005: fabric joins a hosted client by a Welcome only,
			// so the origin is welcomed and the adder the one it joined by.
			evs = []project.Event{project.Joined(t.g.GroupID, mc.c.After, schema.OriginWelcomed, mc.m.Adder)}
		}
		t.emit(mc.m.ClientID, s.cause("", id), evs...)
		mc.m.noteApplied(id[:], len(evs))
	}
	a, ok := s.lead[id]
	if !ok {
		return
	}
	t.groupChanged = true
	// The epoch and roster every conversation record carries moved, for
	// the members with no event of the commit too (one that joined by its
	// Welcome first): every record is written again (EVENT-010).
	t.rd.allActive, t.rd.groupMembers, t.rd.members = true, len(t.g.Members), true
	t.setComponents(a.Result.Components)
	if a.State != nil {
		members := a.State.InboxIDs()
		t.g.LeaveRequests = slices.DeleteFunc(t.g.LeaveRequests, func(inbox string) bool { return !slices.Contains(members, inbox) })
	}
}

// cause is the cause of an effect on id: the effect's kind, the id, and
// how often the id was taken back before this step, so each time a commit
// or message is applied, delivered or taken back again its events get new,
// still deterministic ids. A first application's cause is the input's id.
func (s *step) cause(kind string, id engine.MessageID) []byte {
	c := append([]byte(kind), id[:]...)
	if n := s.t.g.generation(id[:]); n > 0 {
		c = binary.BigEndian.AppendUint32(append(c, '#'), n)
	}
	return c
}

// rollBack records that the step took id back.
func (s *step) rollBack(id engine.MessageID) {
	if !slices.Contains(s.rolled, id) {
		s.rolled = append(s.rolled, id)
	}
}

// note records an input's outcome once per step; a later note of the same
// input replaces it only when it says accepted.
func (s *step) note(n outcomeNote) {
	k := string(n.MessageID)
	if i, ok := s.index[k]; ok {
		if n.Disposition == schema.DispositionAccepted {
			s.notes[i] = n
		}
		return
	}
	s.index[k] = len(s.notes)
	s.notes = append(s.notes, n)
}

// noteOf is the outcome record of a convergence outcome.
func noteOf(o convergence.Outcome, at int64) outcomeNote {
	id := slices.Clone(o.ID[:])
	if o.Rejected() {
		cat := o.Category
		if !rejectableCategory(cat) {
			cat = schema.CategoryInvalidEncoding
		}
		return rejectedNote(id, o.Class, cat, at)
	}
	return outcomeNote{MessageID: id, Class: o.Class, Status: schema.StatusQueued, Disposition: o.Disposition, Category: o.Category, Named: o.NamedOutcome, Time: at}
}

// branchPrefix marks a member blob that holds a whole convergence state,
// not an engine snapshot; splitPrefix one that holds the head of a split
// convergence state, whose settled chunks are blobs of their own
// (checkpoint MemberChunks).
var (
	branchPrefix = []byte("fabric-branches-v1\x00")
	splitPrefix  = []byte("fabric-branches-v2\x00")
)

// branchState is a hosted member's state under branch selection: its
// convergence state, whose tip is the member's canonical engine state.
type branchState struct {
	*engineState
	cg *convergence.Group
}

// Snapshot seals the whole convergence state (convergence.Group.Marshal):
// it holds epoch secrets of every retained state. A transaction stores the
// split form instead (snapshotSplit).
func (b *branchState) Snapshot() ([]byte, error) {
	raw, err := b.cg.Marshal()
	if err != nil {
		return nil, fmt.Errorf("marshal branch state: %w", err)
	}
	return b.seal(branchPrefix, raw)
}

// snapshotSplit seals the head of the convergence state and returns its
// settled chunks as they are: the caller seals those that changed.
func (b *branchState) snapshotSplit() (head []byte, chunks [][]byte, err error) {
	raw, chunks, err := b.cg.MarshalSplit()
	if err != nil {
		return nil, nil, fmt.Errorf("marshal branch state: %w", err)
	}
	head, err = b.seal(splitPrefix, raw)
	return head, chunks, err
}

func (b *branchState) seal(prefix, raw []byte) ([]byte, error) {
	// The prefix is copied into the sealed bytes' one allocation.
	sealed, err := b.vault.AppendSealState(prefix[:len(prefix):len(prefix)], raw)
	clear(raw)
	if err != nil {
		return nil, fmt.Errorf("seal branch state: %w", err)
	}
	return sealed, nil
}

// restoreMember opens a member blob: a convergence state under branch
// selection, whole or split (with its opened chunks), an engine snapshot
// otherwise.
func (w *Worker) restoreMember(ctx context.Context, c Client, blob []byte, chunks []storedChunk) (MemberState, error) {
	e, ok := w.cfg.MLS.(EngineMLS)
	sealed, split := bytes.CutPrefix(blob, splitPrefix)
	whole := false
	if !split {
		sealed, whole = bytes.CutPrefix(blob, branchPrefix)
	}
	if !ok || !(split || whole) {
		if len(chunks) > 0 {
			return nil, errors.New("restore member state: chunks beside a blob that is not split")
		}
		return w.cfg.MLS.Restore(ctx, c, blob)
	}
	raw, err := e.Vault.OpenState(sealed)
	if err != nil {
		return nil, fmt.Errorf("open branch state: %w", err)
	}
	defer clear(raw)
	var cg *convergence.Group
	if split {
		plain := make([][]byte, len(chunks))
		for i, ch := range chunks {
			plain[i] = ch.plain
		}
		cg, err = convergence.UnmarshalSplit(convergence.V1, raw, plain)
	} else if len(chunks) > 0 {
		err = errors.New("chunks beside a whole convergence state")
	} else {
		cg, err = convergence.Unmarshal(convergence.V1, raw)
	}
	if err != nil {
		return nil, fmt.Errorf("restore branch state: %w", err)
	}
	// A nil tip is a removed member's state, Retained while the removal
	// is inside the rollback horizon.
	for _, st := range cg.Retained() {
		st.ShareSignatures(e.Signatures)
	}
	return &branchState{engineState: &engineState{st: cg.Tip(), vault: e.Vault}, cg: cg}, nil
}

// storedChunk is one settled chunk of a member's split convergence state:
// the key of its sealed blob and its plain bytes, to tell whether the
// next transaction must store it again.
type storedChunk struct {
	key   string
	plain []byte
}

// memberSnapshot is what a transaction stores of one member: the blob at
// key, and for a split convergence state its chunks, each a kept or a new
// blob; blobs are the ones to write.
type memberSnapshot struct {
	key    string
	chunks []storedChunk
	blobs  map[string][]byte
}

// snapshotMember snapshots client's state for a transaction of g. Under
// branch selection the settled chunks with the bytes prev stored keep their
// blobs; only new or changed ones are sealed and written.
func (w *Worker) snapshotMember(g *loadedGroup, client string, st MemberState, prev []storedChunk) (memberSnapshot, error) {
	key, err := blobKey(g.tenant, g.groupHex, client)
	if err != nil {
		return memberSnapshot{}, err
	}
	b, ok := st.(*branchState)
	if !ok {
		blob, err := st.Snapshot()
		if err != nil {
			return memberSnapshot{}, err
		}
		return memberSnapshot{key: key, blobs: map[string][]byte{key: blob}}, nil
	}
	head, chunks, err := b.snapshotSplit()
	if err != nil {
		return memberSnapshot{}, err
	}
	s := memberSnapshot{key: key, blobs: map[string][]byte{key: head}}
	for i, plain := range chunks {
		if i < len(prev) && bytes.Equal(prev[i].plain, plain) {
			s.chunks = append(s.chunks, storedChunk{key: prev[i].key, plain: plain})
			continue
		}
		sealed, err := b.vault.SealState(plain)
		if err != nil {
			return memberSnapshot{}, fmt.Errorf("seal settled chunk: %w", err)
		}
		k, err := blobKey(g.tenant, g.groupHex, client)
		if err != nil {
			return memberSnapshot{}, err
		}
		s.chunks = append(s.chunks, storedChunk{key: k, plain: plain})
		s.blobs[k] = sealed
	}
	return s, nil
}

// loadChunks reads and opens the chunk blobs keys name.
func (w *Worker) loadChunks(ctx context.Context, keys []string) ([]storedChunk, error) {
	e, ok := w.cfg.MLS.(EngineMLS)
	if len(keys) > 0 && !ok {
		return nil, errBranchSelectionMLS
	}
	out := make([]storedChunk, 0, len(keys))
	for _, k := range keys {
		b, err := w.getBlob(ctx, k)
		if err != nil {
			return nil, fmt.Errorf("load settled chunk: %w", err)
		}
		plain, err := e.Vault.OpenState(b)
		if err != nil {
			return nil, fmt.Errorf("open settled chunk: %w", err)
		}
		out = append(out, storedChunk{key: k, plain: plain})
	}
	return out, nil
}

// settleRemovals drops the convergence state of every Retained member
// once input reaches max_rewind_commits epochs past its removal: a branch
// forking before the removal is then outside the rollback horizon, so no
// winner can bring the member back (Marmot convergence.md, "Eligibility").
func (p marmot) settleRemovals(t *txn, msg []byte) {
	c, err := engine.Classify(msg)
	if err != nil || !c.HasEpoch {
		return
	}
	for _, m := range t.g.following() {
		if m.Retained && c.Epoch >= m.RemovedEpoch+convergence.V1.MaxRewindCommits {
			m.Retained, m.RemovedEpoch = false, 0
			delete(t.members, m.ClientID)
			t.groupChanged = true
		}
	}
}

// forkState emits conversation.fork_detected when the member's fork state
// becomes forked (convergence.Group.Forked), once: the member remembers
// it was told until the state is no longer forked.
func forkState(t *txn, m *hostedMember, cg *convergence.Group) {
	switch forked := cg.Forked(); {
	case forked && !m.Forked:
		m.Forked = true
		cause := binary.BigEndian.AppendUint64([]byte("forked:"), cg.TipEpoch())
		t.emit(m.ClientID, cause, project.ForkDetected(t.g.GroupID))
	case !forked && m.Forked:
		m.Forked = false
	}
}

// maxPastKeys bounds the past group event keys a group keeps (pastKeys).
const maxPastKeys = 32

// pastKeys adds to the retained states' keys the stored keys of past epochs
// whose inputs convergence still remembers (those 2·max_rewind_commits
// below the anchor, convergence's prune), at most maxPastKeys of them,
// newest first. A hosted member's own message comes back through ingest
// sealed with its epoch's key, after the outbound consumer's ack wait when
// an ingest died holding it: by then commits may have moved the retained
// states past its epoch, and without the key ingest could never peel it
// (transport_deferred for good, its outcome never written; issue 26 chaos).
// Peeled, it is the duplicate convergence remembers.
func pastKeys(keys, stored []epochKey, anchor uint64) []epochKey {
	floor := uint64(0)
	if horizon := 2 * convergence.V1.MaxRewindCommits; anchor > horizon {
		floor = anchor - horizon
	}
	n := 0
	for _, k := range slices.Backward(stored) {
		if n == maxPastKeys || k.Epoch < floor {
			break
		}
		if !slices.ContainsFunc(keys, func(e epochKey) bool { return bytes.Equal(e.Key, k.Key) }) {
			keys = append(keys, k)
			n++
		}
	}
	return keys
}

// settle brings the group-level state in line with the group's view:
// every following member is in it or waits to join it, the canonical epoch
// is its tip's, the candidate keys are those of every retained state (so
// ingest peels sealed input of any candidate branch) and of the past
// epochs whose inputs convergence still remembers (pastKeys), and Due is
// the next pass deadline.
func (p marmot) settle(t *txn) error {
	var due int64
	var keys []epochKey
	var anchor uint64
	cg, err := p.active(t)
	if err != nil {
		return err
	}
	if cg != nil {
		t.g.Epoch, anchor = cg.TipEpoch(), cg.AnchorEpoch()
		if _, frozen := cg.Frozen(); frozen {
			due = 1 // apply at once
		} else if d, ok := cg.Deadline(); ok {
			due = d.UnixMilli()
		}
		for _, st := range cg.Retained() {
			k, err := st.GroupEventKey()
			if err != nil {
				continue
			}
			if !slices.ContainsFunc(keys, func(e epochKey) bool { return bytes.Equal(e.Key, k[:]) }) {
				keys = append(keys, epochKey{Epoch: st.Epoch(), Key: slices.Clone(k[:])})
			}
		}
	}
	t.g.Due = due
	// The stored keys are sealed: compared opened, and a stored set that
	// does not open (sealed under another key, or unsealed) is replaced.
	stored, err := openKeys(p.vault, t.g.Keys)
	if err == nil {
		keys = pastKeys(keys, stored, anchor)
	}
	slices.SortStableFunc(keys, func(a, b epochKey) int { return cmpU64(a.Epoch, b.Epoch) })
	if err == nil && slices.EqualFunc(keys, stored, func(a, b epochKey) bool { return a.Epoch == b.Epoch && bytes.Equal(a.Key, b.Key) }) {
		return nil
	}
	if t.g.Keys, err = sealKeys(p.vault, keys); err != nil {
		return err
	}
	t.groupChanged = true
	return nil
}
