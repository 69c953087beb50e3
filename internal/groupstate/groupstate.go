// Package groupstate holds one group's MLS state once for all of its
// hosted members (docs/shared-state.md). Per group and epoch there is one
// shared [engine.State] (tree, GroupContext, key schedule, secret tree,
// sender-data secret); per hosted member only its private part
// ([engine.MemberKeys]: leaf key and direct-path keys, O(log N)). A commit
// is processed once, as the hosted member whose lowest common ancestor
// with the committer is lowest (one HPKE decapsulation; none when the
// committer is hosted), and every other member's keys follow it in
// O(log N). An application message is decrypted once and delivered to
// every hosted member of its epoch. A Group is safe for concurrent use.
package groupstate

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Errors.
var (
	// ErrNoMember: the id names no hosted member of the group now.
	ErrNoMember = errors.New("groupstate: no such hosted member")
	// ErrEpoch: a joined state is not the group's epoch.
	ErrEpoch = errors.New("groupstate: joined state is not the group's current epoch")
	// ErrEnded: no hosted member is left in the group.
	ErrEnded = errors.New("groupstate: no hosted member left")
	// ErrNoFollower: a commit came back that only its own committer, a
	// hosted member without the state that made it, could follow.
	ErrNoFollower = errors.New("groupstate: no hosted member can follow the commit")
)

// Config tunes a Group.
type Config struct {
	// KeepEpochs is how many past epochs stay open for late application
	// messages (RFC 9420 §14); 0 deletes an epoch's secrets as soon as a
	// commit leaves it (RFC 9420 §9.2).
	KeepEpochs int
}

// maxPending bounds the own commits remembered per epoch, as
// engine.State does.
const maxPending = 8

// Group is one group's state for all of its hosted members.
type Group struct {
	mu     sync.Mutex
	cfg    Config
	shared *engine.State // its own member is the carrier
	// carrier is the hosted member whose keys shared holds.
	carrier string
	members map[string]*member
	byLeaf  map[uint32]string // current hosted members by leaf
	roster  []string          // current hosted members, sorted
	past    []*pastEpoch      // oldest first
	pending []*pendingCommit  // own commits of this epoch
}

// member is one hosted member's private part.
type member struct {
	keys   *engine.MemberKeys
	joined uint64
}

// pastEpoch is an epoch a commit left, kept for late messages.
type pastEpoch struct {
	e      *engine.PastEpoch
	roster []string
	byLeaf map[uint32]string
}

// pendingCommit is an own commit of a hosted member not yet come back: the
// committer's state that made it, which holds the state after it.
type pendingCommit struct {
	id        engine.MessageID
	committer string
	state     *engine.State
}

// New returns a group with no hosted member yet.
func New(cfg Config) *Group {
	return &Group{cfg: cfg, members: make(map[string]*member), byLeaf: make(map[uint32]string)}
}

// Join adds a hosted member from its own state of the group's current
// epoch (engine.Installation.Join from a Welcome, or CreateGroup): only
// its private part is kept. The first member's state becomes the shared
// state. id names the member (its installation's client id).
func (g *Group) Join(id string, st *engine.State) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, dup := g.members[id]; dup {
		return fmt.Errorf("groupstate: join: member %s is hosted already", id)
	}
	keys, err := st.MemberKeys()
	if err != nil {
		return fmt.Errorf("groupstate: join: %w", err)
	}
	if g.shared == nil {
		g.shared, g.carrier = st, id
	} else if st.Epoch() != g.shared.Epoch() || !slices.Equal(st.EpochAuthenticator(), g.shared.EpochAuthenticator()) {
		return ErrEpoch
	}
	return g.add(id, keys, st.Epoch())
}

// JoinWelcome joins the hosted member of inst from a Welcome and returns
// the KeyPackage it consumed (the caller removes it once the group is
// stored, as after engine.Installation.Join). A Welcome into the group's
// current epoch is checked once against the held state
// (engine.State.RememberWelcome) and remembered in cache; then only the
// member's private part is derived (engine.Installation.JoinKeys).
// Otherwise the member joins in full (and the cache remembers it for the
// next). pw is the Welcome parsed once (engine.ParseWelcome) for every
// hosted member it adds.
func (g *Group) JoinWelcome(inst *engine.Installation, welcome []byte, pw *engine.ParsedWelcome, cache *engine.WelcomeCache) (keyPackageRef []byte, err error) {
	id := inst.ClientID()
	g.mu.Lock()
	if g.shared != nil {
		wk, ok, err := inst.JoinKeys(pw, cache)
		if err == nil && !ok {
			// A Welcome into the held epoch needs no full join at all.
			if ok, err = g.shared.RememberWelcome(inst, pw, cache); err == nil && ok {
				wk, ok, err = inst.JoinKeys(pw, cache)
			}
		}
		if err != nil {
			g.mu.Unlock()
			return nil, err
		}
		if ok && wk.Epoch == g.shared.Epoch() && g.shared.IsEpoch(wk.Context) {
			defer g.mu.Unlock()
			if err := g.add(id, wk.Keys, wk.Epoch); err != nil {
				return nil, err
			}
			return wk.KeyPackageRef, nil
		}
	}
	g.mu.Unlock()
	st, info, err := inst.Join(welcome, nil, engine.WithWelcomeCache(cache))
	if err != nil {
		return nil, err
	}
	if err := g.Join(id, st); err != nil {
		return nil, err
	}
	return info.KeyPackageRef, nil
}

// add adds a hosted member of the current epoch.
func (g *Group) add(id string, keys *engine.MemberKeys, epoch uint64) error {
	if _, dup := g.members[id]; dup {
		return fmt.Errorf("groupstate: join: member %s is hosted already", id)
	}
	g.members[id] = &member{keys: keys, joined: epoch}
	g.byLeaf[keys.Leaf] = id
	// A Delivery holds the roster it was made with: a new one is a copy.
	i, _ := slices.BinarySearch(g.roster, id)
	g.roster = slices.Insert(slices.Clip(g.roster), i, id)
	return nil
}

// Epoch returns the current epoch.
func (g *Group) Epoch() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shared == nil {
		return 0
	}
	return g.shared.Epoch()
}

// Members returns the current hosted members, sorted.
func (g *Group) Members() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.roster)
}

// Keys returns a copy of a hosted member's private part.
func (g *Group) Keys(id string) (*engine.MemberKeys, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m, ok := g.members[id]
	if !ok {
		return nil, false
	}
	return m.keys.Clone(), true
}

// Shared returns the shared state. It is the group's own: read it only
// (its public part), under no concurrent call on g.
func (g *Group) Shared() *engine.State {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.shared
}

// StateOf returns a standalone copy of a hosted member's full state
// (O(N)): the state that member would hold on its own.
func (g *Group) StateOf(id string) (*engine.State, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m, ok := g.members[id]
	if !ok {
		return nil, ErrNoMember
	}
	return g.shared.As(m.keys)
}

// Outcome is what a handshake message did to the group.
type Outcome struct {
	Result *engine.HandshakeResult
	// Removed are the hosted members the commit removed.
	Removed []string
	// Lost is a hosted committer whose own commit came back without the
	// state that made it (Commit on another process): its new leaf and
	// path secrets are its own, so its keys cannot follow and it is
	// dropped from the group; its standalone state, if any, still holds.
	Lost string
}

// ProcessHandshake applies a proposal or a commit of the current epoch
// once for every hosted member.
func (g *Group) ProcessHandshake(msg []byte) (*Outcome, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shared == nil {
		return nil, ErrEnded
	}
	c, err := engine.Classify(msg)
	if err != nil {
		return nil, err
	}
	if c.Class != schema.ClassCommit {
		next, res, err := g.shared.ProcessHandshake(msg)
		if err != nil {
			return nil, err
		}
		g.shared = next
		return &Outcome{Result: res}, nil
	}
	return g.commit(c.MessageID, msg)
}

// commit processes a commit once: as its committer's state when a hosted
// member made it, else as the hosted member lowest under the committer.
func (g *Group) commit(id engine.MessageID, msg []byte) (*Outcome, error) {
	var (
		next      *engine.State
		res       *engine.HandshakeResult
		err       error
		carrier   string
		committer uint32
	)
	if i := slices.IndexFunc(g.pending, func(p *pendingCommit) bool { return p.id == id }); i >= 0 {
		p := g.pending[i]
		carrier, committer = p.committer, g.members[p.committer].keys.Leaf
		if next, res, err = p.state.ProcessHandshake(msg); err != nil {
			return nil, err
		}
	} else {
		plan, err := g.shared.PlanCommit(msg)
		if err != nil {
			return nil, err
		}
		committer = plan.Committer
		if carrier = g.carrierFor(plan); carrier == "" {
			// The only hosted member committed, and its state after the
			// commit is not here: no hosted member can follow it.
			return nil, &engine.Error{Op: "process commit", Category: schema.CategoryMissingHistory, Err: ErrNoFollower}
		}
		if next, res, err = g.shared.ProcessAs(g.members[carrier].keys, msg); err != nil {
			return nil, err
		}
	}
	out := &Outcome{Result: res}
	removed := make(map[uint32]bool, len(res.RemovedLeaves))
	for _, m := range res.RemovedLeaves {
		removed[m.Leaf] = true
	}
	g.keepPast()
	if next == nil { // the carrier was removed: so is every hosted member
		out.Removed = slices.Clone(g.roster)
		g.dropAll()
		return out, nil
	}
	shape, err := next.TreeShape()
	if err != nil {
		return nil, err
	}
	after, err := next.MemberKeysIn(shape)
	if err != nil {
		return nil, err
	}
	before := g.members[carrier].keys
	for _, id := range g.roster {
		m := g.members[id]
		switch {
		case removed[m.keys.Leaf]:
			out.Removed = append(out.Removed, id)
		case m.keys.Leaf == committer && id != carrier:
			out.Lost = id
		case id == carrier:
			m.keys = after
		default:
			m.keys = shape.FollowCommit(m.keys, committer, before, after)
		}
	}
	gone := out.Removed
	if out.Lost != "" {
		gone = append(slices.Clone(gone), out.Lost)
	}
	for _, id := range gone {
		delete(g.byLeaf, g.members[id].keys.Leaf)
		delete(g.members, id)
	}
	g.roster = slices.DeleteFunc(slices.Clone(g.roster), func(id string) bool { return g.members[id] == nil })
	g.shared, g.carrier, g.pending = next, carrier, nil
	return out, nil
}

// carrierFor picks the hosted member to process a commit as: one the
// commit keeps, not the committer (mls-go cannot process a member's own
// commit), whose lowest common ancestor with the committer is lowest, so
// every other member's new path keys are on its path. When the commit
// removes every such member, any member: the commit is then authorized
// and seen to remove it, and the group has no hosted member left.
func (g *Group) carrierFor(plan *engine.CommitPlan) string {
	best, level := "", 1<<30
	for _, id := range g.roster {
		leaf := g.members[id].keys.Leaf
		if leaf == plan.Committer || slices.Contains(plan.Removed, leaf) {
			continue
		}
		if l := engine.LCALevel(leaf, plan.Committer); l < level {
			best, level = id, l
		}
	}
	if best != "" {
		return best
	}
	for _, id := range g.roster {
		if g.members[id].keys.Leaf != plan.Committer {
			return id
		}
	}
	return ""
}

// keepPast moves the current epoch to the past ones (or drops it).
func (g *Group) keepPast() {
	if g.cfg.KeepEpochs <= 0 {
		g.past = nil
		return
	}
	byLeaf := make(map[uint32]string, len(g.byLeaf))
	for l, id := range g.byLeaf {
		byLeaf[l] = id
	}
	g.past = append(g.past, &pastEpoch{e: g.shared.PastEpoch(), roster: slices.Clone(g.roster), byLeaf: byLeaf})
	if n := len(g.past) - g.cfg.KeepEpochs; n > 0 {
		clear(g.past[:n])
		g.past = g.past[n:]
	}
}

// dropAll ends the group: no hosted member is left.
func (g *Group) dropAll() {
	g.shared, g.carrier, g.pending, g.roster = nil, "", nil, nil
	clear(g.members)
	clear(g.byLeaf)
}

// Delivery is an application message decrypted once for the hosted members
// of its epoch.
type Delivery struct {
	App *engine.Application
	// Echo is the hosted member that sent it, if any: its own message
	// came back, and it is not delivered to it.
	Echo   string
	roster []string
}

// Each calls f for every hosted member the message is for: the hosted
// members of its epoch (joined at or before it, not removed by then)
// but its sender.
func (d *Delivery) Each(f func(id string)) {
	for _, id := range d.roster {
		if id != d.Echo {
			f(id)
		}
	}
}

// Recipients returns the members Each calls f for.
func (d *Delivery) Recipients() []string {
	out := make([]string, 0, len(d.roster))
	d.Each(func(id string) { out = append(out, id) })
	return out
}

// Decrypt decrypts an application message once for every hosted member of
// its epoch: the current one, or a past one still kept (Config).
func (g *Group) Decrypt(msg []byte) (*Delivery, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, err := engine.Classify(msg)
	if err != nil {
		return nil, err
	}
	if g.shared != nil && c.Epoch >= g.shared.Epoch() {
		app, err := g.shared.Decrypt(msg)
		if err != nil {
			return nil, err
		}
		return &Delivery{App: app, Echo: g.byLeaf[app.Sender.Leaf], roster: g.roster}, nil
	}
	for _, p := range g.past {
		if p.e.Epoch() == c.Epoch {
			app, err := p.e.Decrypt(msg)
			if err != nil {
				return nil, err
			}
			return &Delivery{App: app, Echo: p.byLeaf[app.Sender.Leaf], roster: p.roster}, nil
		}
	}
	if g.shared == nil {
		return nil, ErrEnded
	}
	return nil, &engine.Error{Op: "decrypt", Category: schema.CategoryStaleEpoch, Err: engine.ErrWrongEpoch}
}

// Encrypt encrypts payload as an application message of the current epoch
// from hosted member id, signed by inst, on the shared secret tree.
func (g *Group) Encrypt(id string, inst *engine.Installation, payload []byte) ([]byte, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m, ok := g.members[id]
	if !ok {
		return nil, ErrNoMember
	}
	msg, _, err := g.shared.EncryptAs(inst, m.keys.Leaf, payload)
	return msg, err
}

// Commit makes an own commit of hosted member id (engine.State.Commit on
// that member's state); the group moves when it comes back through
// ProcessHandshake.
func (g *Group) Commit(id string, inst *engine.Installation, req engine.CommitRequest) (*engine.Outgoing, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m, ok := g.members[id]
	if !ok {
		return nil, ErrNoMember
	}
	st, err := g.shared.As(m.keys)
	if err != nil {
		return nil, err
	}
	out, err := st.Commit(inst, req)
	if err != nil {
		return nil, err
	}
	g.pending = append(g.pending, &pendingCommit{id: out.Result.MessageID, committer: id, state: st})
	if len(g.pending) > maxPending {
		g.pending = slices.Delete(g.pending, 0, 1)
	}
	return out, nil
}
