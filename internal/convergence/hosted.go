package convergence

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// This file lets one view serve all of a group's hosted members
// (docs/shared-state.md, Step 1): every hosted member admits the same
// inputs in the same order, so one set of candidate branches, one
// selection and one set of outcomes serve them all. A node holds one
// engine state, whose own member is the carrier, and the private part of
// every other hosted member at it (engine.MemberKeys, O(log N)): a commit
// is replayed once and every member's keys follow it (engine.State
// ProcessAs, TreeShape.FollowCommit), an app message decrypts once.

// Errors of a view of several hosted members.
var (
	// ErrNoMember: the id names no hosted member at the canonical tip.
	ErrNoMember = errors.New("convergence: no such hosted member at the tip")
	// ErrNoNode: no retained state is the joined state's epoch.
	ErrNoNode = errors.New("convergence: no retained state of the joined epoch")
	// ErrNoFollower: only its own committer, without the state that made
	// it, could follow the commit.
	ErrNoFollower = errors.New("convergence: no hosted member can follow the commit")
	// errOwnEcho: the message's sender is the only hosted member.
	errOwnEcho = errors.New("convergence: own message of the only hosted member")
)

// maxPending bounds the own commits remembered per node, as
// engine.State does.
const maxPending = 8

// ownCommit is a hosted member's own commit made at a node, not yet come
// back: the committer's state that made it holds the state after it.
type ownCommit struct {
	id        engine.MessageID
	committer string
	state     *engine.State
}

// NewHosted starts one view for several hosted members from their own
// states of one canonical epoch (their joins), by member id. The first id
// in order is the carrier; the others keep only their private parts.
func NewHosted(p Policy, hosted map[string]*engine.State) (*Group, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	ids := sortedKeys(hosted)
	if len(ids) == 0 {
		return nil, errors.New("convergence: no hosted member")
	}
	first := hosted[ids[0]]
	if first == nil {
		return nil, errors.New("convergence: nil hosted state")
	}
	root := &node{epoch: first.Epoch(), state: first, carrier: ids[0], roster: ids, keys: map[string]*engine.MemberKeys{},
		proposals: map[string]ID{}, witnesses: map[string]bool{}}
	leaves := map[uint32]bool{}
	for _, id := range ids {
		st := hosted[id]
		if st == nil || st.Epoch() != first.Epoch() || !bytes.Equal(st.EpochAuthenticator(), first.EpochAuthenticator()) {
			return nil, fmt.Errorf("convergence: hosted member %s is not at the first one's epoch", id)
		}
		k, err := st.MemberKeys()
		if err != nil {
			return nil, err
		}
		if leaves[k.Leaf] {
			return nil, fmt.Errorf("convergence: hosted member %s shares a leaf", id)
		}
		leaves[k.Leaf] = true
		root.keys[id] = k
	}
	return newGroup(p, root), nil
}

// Hosted returns the hosted members at the canonical tip, sorted.
func (g *Group) Hosted() []string { return slices.Clone(g.tip.roster) }

// StateOf returns a standalone copy of hosted member id's state at the
// canonical tip (O(N)): the state it would hold on its own.
func (g *Group) StateOf(id string) (*engine.State, error) {
	n := g.tip
	if _, ok := slices.BinarySearch(n.roster, id); !ok || n.state == nil {
		return nil, ErrNoMember
	}
	if id == n.carrier {
		return n.state.Clone()
	}
	return n.state.As(n.keys[id])
}

// Commit makes an own commit of hosted member id at the canonical tip
// (engine.State.Commit on its state, StateOf) and remembers the state that
// made it: when the commit comes back, its committer's keys follow from
// it, as its own view's would.
func (g *Group) Commit(id string, inst *engine.Installation, req engine.CommitRequest) (*engine.Outgoing, error) {
	st, err := g.StateOf(id)
	if err != nil {
		return nil, err
	}
	out, err := st.Commit(inst, req)
	if err != nil {
		return nil, err
	}
	n := g.tip
	n.pending = append(n.pending, ownCommit{id: out.Result.MessageID, committer: id, state: st})
	if len(n.pending) > maxPending {
		n.pending = slices.Delete(n.pending, 0, 1)
	}
	return out, nil
}

// Encrypt encrypts payload as an application message of the canonical tip
// from hosted member id, signed by inst, on the tip's one secret tree
// (engine.State.EncryptAs): the leaf's sending generation moves in the
// tree every hosted member shares, so it is never used twice (RFC 9420
// §9.1). The tip remembers the message: when it comes back it is the
// others' delivery, not its sender's (its own view's own echo, issue 19).
func (g *Group) Encrypt(id string, inst *engine.Installation, payload []byte) ([]byte, error) {
	n := g.tip
	if _, ok := slices.BinarySearch(n.roster, id); !ok || n.state == nil {
		return nil, ErrNoMember
	}
	msg, gen, err := n.state.EncryptAs(inst, leafOf(n, id), payload)
	if err != nil {
		return nil, err
	}
	sender, _ := n.state.Member(leafOf(n, id))
	if n.sent == nil {
		n.sent = map[ID]*engine.Application{}
	}
	mid := engine.NewMessageID(msg)
	n.sent[mid] = &engine.Application{MessageID: mid, Epoch: n.epoch, Sender: sender, Generation: gen, Payload: slices.Clone(payload)}
	return msg, nil
}

// open decrypts an app message at n: once for every hosted member at it,
// or, for one a hosted member sent (Encrypt), from what it sent. One sent
// by the only hosted member at n is its own echo, as its own view says.
func (n *node) open(id ID, msg []byte) (*engine.Application, error) {
	if app, ok := n.sent[id]; ok {
		delete(n.sent, id)
		if len(n.roster) == 1 {
			return nil, &engine.Error{Op: "decrypt", Category: schema.CategoryOwnEcho, Err: errOwnEcho}
		}
		return app, nil
	}
	return n.state.Decrypt(msg)
}

// Join adds a hosted member to the view from its own state (a join by
// Welcome): its keys at the retained node of that state's epoch, and at
// the nodes retained below it by replaying their commits as it, so a
// Welcome that arrives after later commits still joins. A member joined
// on a branch that loses has no keys on the selected one.
func (g *Group) Join(id string, st *engine.State) error {
	var at *node
	for _, n := range g.candidates(st.Epoch()) {
		if bytes.Equal(n.state.EpochAuthenticator(), st.EpochAuthenticator()) {
			at = n
		}
	}
	if at == nil {
		return ErrNoNode
	}
	k, err := st.MemberKeys()
	if err != nil {
		return err
	}
	if err := g.host(at, id, k); err != nil {
		return err
	}
	for _, c := range at.children {
		g.joinBelow(c, id, k)
	}
	return nil
}

// JoinWelcome joins hosted member id, whose installation is inst, from a
// Welcome with only its keys (docs/shared-state.md, Joining): when the
// Welcome names the epoch of a retained node, it is checked once against
// that node's state (engine.State.RememberWelcome) and remembered in
// cache, then only the member's leaf key and path keys are derived
// (engine.Installation.JoinKeys), in O(log N), with no state built. The
// member is hosted at that node and followed into the nodes below it, as
// Join does. pw is the Welcome parsed once (engine.ParseWelcome) for every
// member it adds. ok is false, and g unchanged, when no retained node
// holds the Welcome's epoch or a check fails: the caller joins in full
// (Join), which gives the verdict.
func (g *Group) JoinWelcome(id string, inst *engine.Installation, pw *engine.ParsedWelcome, cache *engine.WelcomeCache) (info *engine.JoinInfo, ok bool, err error) {
	if inst == nil || pw == nil || cache == nil {
		return nil, false, nil
	}
	wk, ok, err := inst.JoinKeys(pw, cache)
	if err != nil {
		return nil, false, err
	}
	if !ok {
		// Not remembered: check it once against the retained state of its
		// epoch, trying the tip's first.
		for i, n := range append([]*node{g.tip}, g.sortedNodes()...) {
			if n.state == nil || i > 0 && n == g.tip {
				continue
			}
			if ok, err = n.state.RememberWelcome(inst, pw, cache); err != nil {
				return nil, false, err
			}
			if ok {
				if wk, ok, err = inst.JoinKeys(pw, cache); err != nil {
					return nil, false, err
				}
				break
			}
		}
	}
	at := g.welcomed(wk)
	if !ok || at == nil {
		return nil, false, nil
	}
	adder, present := at.state.Member(wk.Adder)
	if !present {
		return nil, false, nil
	}
	set, found, err := at.state.Components()
	if err != nil {
		return nil, false, err
	}
	if err := g.host(at, id, wk.Keys); err != nil {
		return nil, false, err
	}
	for _, c := range at.children {
		g.joinBelow(c, id, wk.Keys)
	}
	return &engine.JoinInfo{GroupID: wk.GroupID, Epoch: wk.Epoch, Adder: adder, Components: set, HasComponents: found,
		KeyPackageRef: wk.KeyPackageRef}, true, nil
}

// welcomed returns the retained node of a key-only join's epoch, nil when
// there is none.
func (g *Group) welcomed(wk *engine.WelcomeKeys) *node {
	if wk == nil {
		return nil
	}
	for _, n := range g.candidates(wk.Epoch) {
		if n.state.IsEpoch(wk.Context) {
			return n
		}
	}
	return nil
}

// host adds member id with keys k to node n.
func (g *Group) host(n *node, id string, k *engine.MemberKeys) error {
	i, found := slices.BinarySearch(n.roster, id)
	if found {
		return fmt.Errorf("convergence: join: member %s is hosted already", id)
	}
	for _, m := range n.roster {
		if leafOf(n, m) == k.Leaf {
			return fmt.Errorf("convergence: join: leaf %d is hosted already", k.Leaf)
		}
	}
	if n.keys == nil {
		n.keys = map[string]*engine.MemberKeys{}
	}
	n.keys[id] = k
	n.roster = slices.Insert(slices.Clip(n.roster), i, id)
	return nil
}

// joinBelow follows a joining member from c's parent into c by replaying
// c's commit as that member, and on into c's children. Where that fails
// (the commit removes it, or its bytes are gone) it has no keys from c on.
func (g *Group) joinBelow(c *node, id string, k *engine.MemberKeys) {
	r := g.inputs[c.id]
	if r == nil || r.in.Data == nil {
		return
	}
	parent := c.parent.state
	for _, pid := range c.consumed {
		p := g.inputs[pid]
		if p == nil || p.in.Data == nil {
			return
		}
		next, _, err := parent.ProcessHandshake(p.in.Data)
		if err != nil {
			return
		}
		parent = next
	}
	next, _, err := parent.ProcessAs(k, r.in.Data)
	if err != nil || next == nil {
		return
	}
	kc, err := next.MemberKeys()
	if err != nil {
		return
	}
	if c.state == nil {
		c.state, c.carrier = next, id
	}
	if g.host(c, id, kc) != nil {
		return
	}
	for _, d := range c.children {
		g.joinBelow(d, id, kc)
	}
}

// keysOf returns hosted member id's keys at n; the carrier's are read from
// the state once.
func (g *Group) keysOf(n *node, id string) (*engine.MemberKeys, error) {
	if k := n.keys[id]; k != nil {
		return k, nil
	}
	if id != n.carrier || n.state == nil {
		return nil, ErrNoMember
	}
	k, err := n.state.MemberKeys()
	if err != nil {
		return nil, err
	}
	if n.keys == nil {
		n.keys = map[string]*engine.MemberKeys{}
	}
	n.keys[id] = k
	return k, nil
}

// follow processes a commit once for every hosted member at n, parent
// being n's state with the commit's proposals applied, and returns the
// child node's state, hosted members and result. A view of one member
// processes it as that member's own state always did.
func (g *Group) follow(n *node, parent *engine.State, commit []byte) (*node, error) {
	var (
		carrier string
		next    *engine.State
		hr      *engine.HandshakeResult
		err     error
	)
	i := -1
	if len(n.pending) > 0 {
		id := engine.NewMessageID(commit)
		i = slices.IndexFunc(n.pending, func(p ownCommit) bool { return p.id == id })
	}
	switch {
	case i >= 0:
		// A hosted member's own commit: the state after it is its own.
		carrier = n.pending[i].committer
		next, hr, err = n.pending[i].state.ProcessHandshake(commit)
	case len(n.roster) <= 1:
		carrier = n.carrier
		next, hr, err = parent.ProcessHandshake(commit)
	default:
		plan, perr := parent.PlanCommit(commit)
		if perr != nil {
			return nil, perr
		}
		if carrier = g.carrierFor(n, plan); carrier == "" {
			return nil, &engine.Error{Op: "replay", Category: schema.CategoryMissingHistory, Err: ErrNoFollower}
		}
		if carrier == n.carrier {
			next, hr, err = parent.ProcessHandshake(commit)
		} else {
			next, hr, err = parent.ProcessAs(n.keys[carrier], commit)
		}
	}
	if err != nil {
		return nil, err
	}
	c := &node{carrier: carrier, result: hr}
	if next == nil { // it removed every hosted member at n
		return c, nil
	}
	if len(n.roster) <= 1 {
		c.state, c.roster = next, n.roster
		return c, nil
	}
	shape, err := next.TreeShape()
	if err != nil {
		return nil, err
	}
	after, err := next.MemberKeysIn(shape)
	if err != nil {
		return nil, err
	}
	before, err := g.keysOf(n, carrier)
	if err != nil {
		return nil, err
	}
	removed := make(map[uint32]bool, len(hr.RemovedLeaves))
	for _, m := range hr.RemovedLeaves {
		removed[m.Leaf] = true
	}
	c.state, c.keys = next, make(map[string]*engine.MemberKeys, len(n.roster))
	// Indexed by leaf here, in the commit's O(H) work, so a message at c
	// finds a hosted sender in O(1) (hostedAt).
	c.byLeaf = make(map[uint32]string, len(n.roster))
	committer := hr.Sender.Leaf
	for _, m := range n.roster {
		k := n.keys[m]
		if m == n.carrier {
			if k, err = g.keysOf(n, m); err != nil {
				return nil, err
			}
		}
		switch {
		case removed[k.Leaf]:
			continue
		case m == carrier:
			c.keys[m] = after
		case k.Leaf == committer:
			// Its own commit came back without the state that made it:
			// its new leaf and path secrets are its own, lost here.
			continue
		default:
			c.keys[m] = shape.FollowCommit(k, committer, before, after)
		}
		c.roster = append(c.roster, m)
		c.byLeaf[c.keys[m].Leaf] = m
	}
	return c, nil
}

// carrierFor picks the hosted member at n to process a commit as: one the
// commit keeps, not its committer, whose lowest common ancestor with the
// committer is lowest, so every other member's re-keyed path nodes are
// on its path (engine.TreeShape.FollowCommit). When the commit removes
// every such member, any one but the committer; "" when there is none.
func (g *Group) carrierFor(n *node, plan *engine.CommitPlan) string {
	best, level, other := "", 1<<30, ""
	for _, id := range n.roster {
		leaf := leafOf(n, id)
		if leaf == plan.Committer {
			continue
		}
		if other == "" {
			other = id
		}
		if slices.Contains(plan.Removed, leaf) {
			continue
		}
		if l := engine.LCALevel(leaf, plan.Committer); l < level {
			best, level = id, l
		}
	}
	if best == "" {
		return other
	}
	return best
}

// leafOf returns hosted member id's leaf at n, which has a state.
func leafOf(n *node, id string) uint32 {
	if id == n.carrier {
		return n.state.OwnLeaf()
	}
	return n.keys[id].Leaf
}

// recipients returns the hosted members at n but the sender: the roster
// itself, shared, unless the sender is hosted. It is O(1) but for the
// copy that drops a hosted sender: an app message is opened once for
// every hosted member.
func (g *Group) recipients(n *node, sender engine.Member) []string {
	if n.state == nil {
		return nil
	}
	if id, ok := n.hostedAt(sender.Leaf); ok {
		i := slices.Index(n.roster, id)
		return slices.Delete(slices.Clone(n.roster), i, i+1)
	}
	return slices.Clip(n.roster)
}

// hostedAt returns the hosted member at leaf of n, which has a state.
func (n *node) hostedAt(leaf uint32) (string, bool) {
	if len(n.byLeaf) != len(n.roster) {
		n.byLeaf = make(map[uint32]string, len(n.roster))
		for _, id := range n.roster {
			n.byLeaf[leafOf(n, id)] = id
		}
	}
	id, ok := n.byLeaf[leaf]
	return id, ok
}

// left returns the hosted members at n's parent that are not at n.
func left(n *node) []string {
	var out []string
	for _, id := range n.parent.roster {
		if _, ok := slices.BinarySearch(n.roster, id); !ok {
			out = append(out, id)
		}
	}
	return out
}

// persistHosted writes n's hosted members (the carrier's keys are in its
// state's snapshot) and own commits into pn.
func persistHosted(n *node, pn *pNode) error {
	if n.state == nil {
		return nil
	}
	pn.Carrier = n.carrier
	for _, id := range n.roster {
		if id == n.carrier {
			continue
		}
		k := n.keys[id]
		pm := pMember{ID: id, Leaf: k.Leaf, LeafKey: k.LeafKey}
		for _, at := range slices.Sorted(maps.Keys(k.Path)) {
			pm.Nodes, pm.Keys = append(pm.Nodes, at), append(pm.Keys, k.Path[at])
		}
		pn.Members = append(pn.Members, pm)
	}
	for _, p := range n.pending {
		b, err := p.state.Snapshot()
		if err != nil {
			return fmt.Errorf("convergence: marshal: %w", err)
		}
		pn.Pending = append(pn.Pending, pPending{ID: p.id[:], Committer: p.committer, State: b})
	}
	for _, id := range slices.SortedFunc(maps.Keys(n.sent), func(a, b ID) int { return bytes.Compare(a[:], b[:]) }) {
		a := n.sent[id]
		pn.Sent = append(pn.Sent, pSent{ID: id[:], Leaf: a.Sender.Leaf, Inbox: a.Sender.InboxID, Key: a.Sender.InstallationKey, Generation: a.Generation, Payload: a.Payload})
	}
	return nil
}

// restoreHosted reads n's hosted members and own commits back from pn; a
// node with no state has none.
func restoreHosted(n *node, pn pNode) error {
	if pn.State == nil {
		if pn.Carrier != "" || pn.Members != nil || pn.Pending != nil || pn.Sent != nil {
			return fmt.Errorf("%w: hosted members of a node without state", ErrCorrupt)
		}
		return nil
	}
	n.carrier, n.roster = pn.Carrier, []string{pn.Carrier}
	leaves := map[uint32]bool{}
	for i, pm := range pn.Members {
		if pm.ID == pn.Carrier || (i > 0 && pm.ID <= pn.Members[i-1].ID) || len(pm.Nodes) != len(pm.Keys) || leaves[pm.Leaf] {
			return fmt.Errorf("%w: hosted member", ErrCorrupt)
		}
		leaves[pm.Leaf] = true
		k := &engine.MemberKeys{Leaf: pm.Leaf, LeafKey: pm.LeafKey, Path: make(map[uint32][]byte, len(pm.Nodes))}
		for i, at := range pm.Nodes {
			k.Path[at] = pm.Keys[i]
		}
		if n.keys == nil {
			n.keys = map[string]*engine.MemberKeys{}
		}
		n.keys[pm.ID] = k
		n.roster = append(n.roster, pm.ID)
	}
	slices.Sort(n.roster)
	for _, pp := range pn.Pending {
		id, ok := toID(pp.ID)
		if _, hosted := slices.BinarySearch(n.roster, pp.Committer); !ok || !hosted {
			return fmt.Errorf("%w: own commit", ErrCorrupt)
		}
		st, err := engine.Restore(pp.State)
		if err != nil {
			return fmt.Errorf("%w: own commit: %v", ErrCorrupt, err)
		}
		n.pending = append(n.pending, ownCommit{id: engine.MessageID(id), committer: pp.Committer, state: st})
	}
	for _, ps := range pn.Sent {
		id, ok := toID(ps.ID)
		if !ok || n.sent[id] != nil {
			return fmt.Errorf("%w: sent message", ErrCorrupt)
		}
		if n.sent == nil {
			n.sent = map[ID]*engine.Application{}
		}
		n.sent[id] = &engine.Application{MessageID: id, Epoch: n.epoch, Generation: ps.Generation, Payload: ps.Payload,
			Sender: engine.Member{Leaf: ps.Leaf, InboxID: ps.Inbox, InstallationKey: ps.Key}}
	}
	return nil
}
