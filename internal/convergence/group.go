package convergence

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Input is one protocol input of the group: a commit, a proposal or an
// application message that passed the branch-independent gate.
type Input struct {
	// ID is SHA-256 of Data.
	ID ID
	// Class is ClassCommit, ClassProposal or ClassApplication.
	Class schema.InputClass
	// Data is the MLSMessage bytes.
	Data []byte
}

// Outcome is an input's current convergence outcome. A terminal rejection
// during candidate construction (invalid_signature, authorization_failed
// once the parent is identified) has a Category and no Disposition.
type Outcome struct {
	ID           ID
	Class        schema.InputClass
	Disposition  schema.Disposition
	Category     schema.Category
	NamedOutcome schema.NamedOutcome
}

// Rejected reports whether the outcome is a terminal rejection.
func (o Outcome) Rejected() bool { return o.Disposition == "" && o.Category != "" }

// AppliedCommit is one commit the selected branch applied, in branch order.
type AppliedCommit struct {
	ID          ID
	SourceEpoch uint64
	// Result is what the commit changed (membership, components, privilege).
	Result *engine.HandshakeResult
	// State is the resulting state; nil when the commit removed the hosted
	// member (Result.RemovedSelf). In a view of several hosted members it
	// is the shared state, whose own member is one of them (StateOf gives
	// a member's own), and nil only when it removed every one.
	State *engine.State
	// Proposals are the proposals the commit consumed by reference.
	Proposals []ID
	// Removed are the hosted members the commit left without keys: those
	// it removed and a committer whose own commit came back without the
	// state that made it (docs/shared-state.md, Step 1).
	Removed []string
	// Hosted are the hosted members at State, sorted; shared, not to be
	// changed. A removed member that a winning branch brings back is in it.
	Hosted []string
}

// Delivery is an app payload to hand to the application: its MLS
// application message decrypts on the selected branch inside the window.
type Delivery struct {
	ID     ID
	Epoch  uint64
	Sender engine.Member
	// Generation is the message's place in its sender's ratchet of the
	// epoch: the sender's send order.
	Generation uint32
	Payload    []byte // the app payload; internal/apppayload decodes it
	// Recipients are the hosted members it is for: those of its epoch's
	// node (joined at or before it, not removed by then) but its sender,
	// decrypted once for all of them (docs/shared-state.md). A view made
	// by New hosts one member, named "".
	Recipients []string
}

// Superseded is a previously applied commit that branch selection replaced
// (the extension event fabric.commit_superseded).
type Superseded struct {
	ID    ID
	Epoch uint64 // the epoch it had produced
}

// Result is what one call changed, as plain values the caller turns into
// outcome records and events, in this order: Superseded and Withdrawn
// (what no longer holds), Applied, Delivered.
type Result struct {
	// Duplicate is set when the input was already admitted; nothing changed.
	Duplicate bool
	// ForkDetected is set when Marmot fork detection moved the group from
	// Stable to Recovering: a divergent edge the open pass will resolve.
	// It is not the events spec's fork state (Group.Forked).
	ForkDetected bool
	// Applied are the commits the selected branch applied, oldest first.
	Applied []AppliedCommit
	// Superseded are applied commits that lost, oldest first.
	Superseded []Superseded
	// Delivered are app payloads to deliver, in canonical order
	// (canonicalOrder): by epoch, a message after the one it references,
	// else by sender leaf and send order; never by id or arrival. A
	// delivery of epoch e comes before the applied commit of source
	// epoch e, which was made after it.
	Delivered []Delivery
	// Withdrawn are delivered app payloads now invalidated
	// (fabric.message_invalidated).
	Withdrawn []ID
	// Outcomes are the inputs whose current outcome changed, by id.
	Outcomes []Outcome
}

func (r *Result) merge(o Result) {
	r.ForkDetected = r.ForkDetected || o.ForkDetected
	r.Applied = append(r.Applied, o.Applied...)
	r.Superseded = append(r.Superseded, o.Superseded...)
	r.Delivered = append(r.Delivered, o.Delivered...)
	r.Withdrawn = append(r.Withdrawn, o.Withdrawn...)
	r.Outcomes = append(r.Outcomes, o.Outcomes...)
}

// node is a retained candidate state: the canonical anchor, or the state a
// commit produced by replay against its parent node.
type node struct {
	id       ID // the commit that produced it; zero for the initial state
	parent   *node
	children []*node // by id
	epoch    uint64
	// state is the node's one state for every hosted member at it, its
	// own member the carrier; nil when no hosted member is left at it.
	state *engine.State
	// carrier is the hosted member whose keys state holds; roster the
	// hosted members at the node, sorted, never changed in place; keys
	// their private parts, the carrier's only once asked (keysOf).
	carrier string
	roster  []string
	keys    map[string]*engine.MemberKeys
	// byLeaf are the roster's members by leaf (hostedAt). A member's leaf
	// does not change while it is in the group and a roster only grows at
	// its node, so it is rebuilt when their sizes differ.
	byLeaf map[uint32]string
	// pending are hosted members' own commits made at the node (Commit);
	// sent their app messages encrypted at it (Encrypt) not yet come back.
	pending []ownCommit
	sent    map[ID]*engine.Application
	// Commit facts for branch order; unset on the root.
	committer  string // inbox id (hex of the 32-byte account id)
	privileged bool
	consumed   []ID
	result     *engine.HandshakeResult // nil after a restore until replayed
	// proposals authenticated at this node, by ProposalRef.
	proposals map[string]ID
	// witnesses are the distinct sender identities of valid app payloads
	// that decrypt at this node.
	witnesses map[string]bool
	// snap is state's last snapshot, taken when state had snapAt changes
	// (engine.State.Changes): Marshal reuses it while nothing decrypted here.
	// Nil at the tip.
	snap   []byte
	snapAt uint64
}

// record is one admitted input and its current outcome.
type record struct {
	in      Input
	epoch   uint64
	hasEp   bool
	out     Outcome
	node    ID // commit: its node; proposal: where it authenticated; app: where it decrypts
	hasNode bool
	// app messages:
	sender    engine.Member
	gen       uint32 // the sender's ratchet generation
	payload   []byte
	delivered bool
	terminal  bool // rejected or stale for good; never retried
	queued    bool // admitted after a cutoff, not yet processed
	frozen    bool // settled: held in a chunk, not in Group.live
}

// pass is an open convergence pass.
type pass struct {
	start, last time.Time
	base        uint64 // pass_base_epoch
	divergent   bool   // a divergent edge or witness joined: Recovering
	frozen      bool
	batch       []ID // frozen batch membership, sorted
}

// Cutoff is a frozen pass: the caller persists it (with the group) so a
// restart resolves exactly this batch.
type Cutoff struct {
	Start     time.Time
	BaseEpoch uint64
	Batch     []ID
}

// Group is the convergence state of one group for its hosted members: one
// view, whose node states are shared by every hosted member at them
// (docs/shared-state.md, Step 1). It is not safe for concurrent use.
type Group struct {
	policy    Policy
	nodes     map[ID]*node
	root      *node // the retained anchor
	tip       *node // the canonical tip
	inputs    map[ID]*record
	live      map[ID]*record // the inputs not settled
	chunks    []*chunk       // the settled inputs, in the order they settled
	queue     []ID           // admitted after the cutoff, in admission order
	size      int            // of the last Marshal
	headSize  int            // of the last MarshalSplit head
	lifecycle Lifecycle
	pass      *pass
}

// New starts convergence from a canonical state (a join, or a restore of
// the canonical tip). The state becomes the retained anchor.
func New(p Policy, canonical *engine.State) (*Group, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	if canonical == nil {
		return nil, errors.New("convergence: nil canonical state")
	}
	root := &node{epoch: canonical.Epoch(), state: canonical, roster: []string{""}, proposals: map[string]ID{}, witnesses: map[string]bool{}}
	return newGroup(p, root), nil
}

func newGroup(p Policy, root *node) *Group {
	return &Group{
		policy:    p,
		nodes:     map[ID]*node{root.id: root},
		root:      root,
		tip:       root,
		inputs:    map[ID]*record{},
		live:      map[ID]*record{},
		lifecycle: Stable,
	}
}

// Lifecycle returns the lifecycle state.
func (g *Group) Lifecycle() Lifecycle { return g.lifecycle }

// Forked reports the conversation's fork state (the events spec's
// conversation.fork_detected): forked when the hosted member is left with
// no branch it can follow, which is Unrecoverable (durability.md: retained
// state inside the horizon is lost, so no pass can select or apply; only a
// verified repair or a new join ends it). A divergent edge is not a fork in
// this sense: the pass resolves it and, where it takes back what was
// applied, reports that as Superseded (docs/convergence.md, "Fork state").
func (g *Group) Forked() bool { return g.lifecycle == Unrecoverable }

// Tip returns the canonical state; nil once a commit removed the hosted
// member.
func (g *Group) Tip() *engine.State { return g.tip.state }

// TipProposals returns the proposals (MLS bytes) that authenticated at the
// canonical state and no commit consumed yet, in ProposalRef order: what
// the hosted member's own next commit includes by reference (a leave
// request, GMOD-031).
func (g *Group) TipProposals() [][]byte {
	var out [][]byte
	for _, ref := range slices.Sorted(maps.Keys(g.tip.proposals)) {
		if r := g.inputs[g.tip.proposals[ref]]; r != nil && len(r.in.Data) > 0 {
			out = append(out, r.in.Data)
		}
	}
	return out
}

// TipEpoch returns the canonical epoch.
func (g *Group) TipEpoch() uint64 { return g.tip.epoch }

// AnchorEpoch returns the epoch of the retained anchor.
func (g *Group) AnchorEpoch() uint64 { return g.root.epoch }

// Retained returns every retained candidate state, by epoch then commit id:
// ingest peels sealed input with their group event keys (DESIGN §3).
func (g *Group) Retained() []*engine.State {
	var out []*engine.State
	for _, n := range g.sortedNodes() {
		if n.state != nil {
			out = append(out, n.state)
		}
	}
	return out
}

// Outcome returns an input's current outcome.
func (g *Group) Outcome(id ID) (Outcome, bool) {
	r, ok := g.inputs[id]
	if !ok || r.queued {
		return Outcome{}, false
	}
	return r.out, true
}

// Deadline returns when the open pass closes: the earlier of quiescence
// after the last selection-relevant input and the absolute pass deadline.
func (g *Group) Deadline() (time.Time, bool) {
	p := g.pass
	if p == nil || p.frozen {
		return time.Time{}, false
	}
	q := p.last.Add(g.policy.SettlementQuiescence)
	if d := p.start.Add(g.policy.MaxConvergencePass); d.Before(q) {
		q = d
	}
	return q, true
}

// Frozen returns the cutoff of a frozen pass awaiting Apply.
func (g *Group) Frozen() (Cutoff, bool) {
	if g.pass == nil || !g.pass.frozen {
		return Cutoff{}, false
	}
	return g.cutoff(), true
}

func (g *Group) cutoff() Cutoff {
	return Cutoff{Start: g.pass.start, BaseEpoch: g.pass.base, Batch: slices.Clone(g.pass.batch)}
}

// Admit retains one input and processes it against the retained states:
// candidate edges by replay, witnesses by decryption. While a pass is frozen
// the input waits for the next pass. now is the caller's monotonic time.
func (g *Group) Admit(in Input, now time.Time) (Result, error) {
	var res Result
	switch in.Class {
	case schema.ClassCommit, schema.ClassProposal, schema.ClassApplication:
	default:
		return res, ErrClass
	}
	if engine.NewMessageID(in.Data) != in.ID {
		return res, ErrID
	}
	if _, ok := g.inputs[in.ID]; ok {
		res.Duplicate = true
		return res, nil
	}
	r := &record{in: Input{ID: in.ID, Class: in.Class, Data: slices.Clone(in.Data)}}
	r.out = Outcome{ID: in.ID, Class: in.Class}
	g.inputs[in.ID] = r
	g.live[in.ID] = r
	if g.lifecycle == Unrecoverable || (g.pass != nil && g.pass.frozen) {
		r.queued = true
		g.queue = append(g.queue, in.ID)
		return res, nil
	}
	g.process(r, now, &res)
	return res, nil
}

// process classifies r, processes it and retries deferred input to a fixed
// point.
func (g *Group) process(r *record, now time.Time, res *Result) {
	c, err := engine.Classify(r.in.Data)
	if err != nil {
		g.reject(r, engine.CategoryOf(err), res)
		return
	}
	r.epoch, r.hasEp = c.Epoch, c.HasEpoch
	if !c.HasEpoch || c.Class != r.in.Class {
		g.reject(r, schema.CategoryInvalidEncoding, res)
		return
	}
	if g.try(r, now, res) {
		g.retry(now, res)
	}
}

// try processes one record and reports whether it created state that
// deferred input may need (a node or a stored proposal).
func (g *Group) try(r *record, now time.Time, res *Result) bool {
	switch r.in.Class {
	case schema.ClassCommit:
		return g.tryCommit(r, now, res)
	case schema.ClassProposal:
		return g.tryProposal(r, res)
	default:
		g.tryApp(r, now, res)
		return false
	}
}

// retry reprocesses deferred, unattached input until nothing changes:
// deferred input is retried when the state it waits for arrives.
func (g *Group) retry(now time.Time, res *Result) {
	for progress := true; progress; {
		progress = false
		for _, r := range g.sortedLive() {
			if r.terminal || r.queued || r.hasNode || r.out.Disposition != schema.DispositionDeferred || !r.hasEp {
				continue
			}
			if g.try(r, now, res) {
				progress = true
			}
		}
	}
}

// candidates returns the retained nodes at an epoch with a live state.
func (g *Group) candidates(epoch uint64) []*node {
	var out []*node
	for _, n := range g.sortedNodes() {
		if n.epoch == epoch && n.state != nil {
			out = append(out, n)
		}
	}
	return out
}

// unplaced gives a record that no retained state authenticates its
// outcome: stale when it is older than the anchor or when only a fork from
// below the anchor could hold its parent, else deferred while the parent
// may still arrive.
func (g *Group) unplaced(r *record, res *Result) {
	switch {
	case r.epoch < g.root.epoch:
		named := schema.NamedOutcome("")
		if r.in.Class == schema.ClassCommit {
			named = schema.BeyondAnchor
		}
		g.stale(r, named, res)
	case r.epoch == g.root.epoch:
		// Only the anchor is retained at its epoch; another parent there
		// forks below the anchor, outside the rollback horizon.
		g.stale(r, "", res)
	default:
		g.set(r, schema.DispositionDeferred, "", "", res)
	}
}

func (g *Group) tryCommit(r *record, now time.Time, res *Result) bool {
	if r.epoch < g.root.epoch {
		g.unplaced(r, res)
		return false
	}
	refs, err := engine.ConsumedProposalRefs(r.in.Data)
	if err != nil {
		g.reject(r, categoryOr(err, schema.CategoryInvalidEncoding), res)
		return false
	}
	for _, n := range g.candidates(r.epoch) {
		parent, known := g.identify(n, r.in.Data)
		if known && !parent {
			continue // another epoch's secrets: not this parent
		}
		child, err := g.replay(n, r.in.Data, refs, known)
		if !known && notParent(err) {
			continue
		}
		if errors.Is(err, errMissingProposal) {
			g.set(r, schema.DispositionDeferred, "", "", res)
			return false
		}
		if err != nil {
			// The parent is identified; a failure now is terminal.
			g.reject(r, categoryOr(err, schema.CategoryInvalidEncoding), res)
			return false
		}
		child.id, child.parent, child.epoch = r.in.ID, n, n.epoch+1
		child.committer, child.privileged = child.result.Sender.InboxID, child.result.Privileged
		child.proposals, child.witnesses = map[string]ID{}, map[string]bool{}
		g.attach(child)
		r.node, r.hasNode = child.id, true
		g.set(r, schema.DispositionDeferred, "", "", res)
		g.relevant(now, g.divergent(child), res)
		return true
	}
	g.unplaced(r, res)
	return false
}

var errMissingProposal = errors.New("convergence: a referenced proposal is not retained at the parent")

// replay processes commit bytes against node n with the proposals it
// references, without touching n, and returns the child node's state,
// hosted members, result and consumed proposals. identified says n's
// membership key already authenticated the commit.
func (g *Group) replay(n *node, commit []byte, refs [][]byte, identified bool) (*node, error) {
	parent := n.state
	var consumed []ID
	missing := false
	for _, ref := range refs {
		pid, ok := n.proposals[string(ref)]
		if !ok {
			missing = true
			break
		}
		consumed = append(consumed, pid)
	}
	if missing && identified {
		return nil, errMissingProposal
	}
	if !missing {
		for _, pid := range consumed {
			next, _, err := parent.ProcessHandshake(g.inputs[pid].in.Data)
			if err != nil {
				return nil, fmt.Errorf("convergence: stored proposal: %w", err)
			}
			parent = next
		}
	}
	child, err := g.follow(n, parent, commit)
	if err != nil {
		if missing && !notParent(err) {
			return nil, errMissingProposal
		}
		return nil, err
	}
	if child.result.Class != schema.ClassCommit {
		return nil, &engine.Error{Op: "replay", Category: schema.CategoryInvalidEncoding, Err: ErrClass}
	}
	child.consumed = consumed
	return child, nil
}

func (g *Group) tryProposal(r *record, res *Result) bool {
	if r.epoch < g.root.epoch {
		g.unplaced(r, res)
		return false
	}
	for _, n := range g.candidates(r.epoch) {
		parent, known := g.identify(n, r.in.Data)
		if known && !parent {
			continue
		}
		_, hr, err := n.state.ProcessHandshake(r.in.Data)
		if !known && notParent(err) {
			continue
		}
		if err != nil {
			g.reject(r, categoryOr(err, schema.CategoryInvalidEncoding), res)
			return false
		}
		if hr.Class != schema.ClassProposal {
			g.reject(r, schema.CategoryInvalidEncoding, res)
			return false
		}
		n.proposals[string(hr.ProposalRef)] = r.in.ID
		r.node, r.hasNode = n.id, true
		g.set(r, schema.DispositionDeferred, "", "", res)
		return true
	}
	g.unplaced(r, res)
	return false
}

func (g *Group) tryApp(r *record, now time.Time, res *Result) {
	if r.epoch < g.root.epoch {
		g.unplaced(r, res)
		return
	}
	for _, n := range g.candidates(r.epoch) {
		app, err := n.open(r.in.ID, r.in.Data)
		if engine.CategoryOf(err) == schema.CategoryOwnEcho {
			// The member's own message, encrypted on this state: its key
			// is used, and it is accounted for already (issue 19).
			g.reject(r, schema.CategoryOwnEcho, res)
			return
		}
		if err != nil {
			continue // undecryptable here is no evidence of anything
		}
		if _, err := apppayload.Decode(app.Payload); err != nil {
			// Decryption alone is no witness; the payload must decode.
			g.reject(r, schema.CategoryInvalidEncoding, res)
			return
		}
		r.node, r.hasNode = n.id, true
		r.sender, r.gen, r.payload = app.Sender, app.Generation, app.Payload
		// A message decrypts on one branch only, once: its bytes are never
		// needed again.
		r.in.Data = nil
		counted := n.witnesses[app.Sender.InboxID] || len(n.witnesses) >= g.policy.WitnessQuorumSendersPerEpoch
		n.witnesses[app.Sender.InboxID] = true
		if !counted && !g.canonical(n) {
			// A bounded witness score of a candidate changed.
			g.relevant(now, g.divergent(n), res)
		}
		g.decideApp(r, res)
		return
	}
	if r.epoch > g.tip.epoch {
		// A future epoch stays deferred until a branch can decrypt it.
		g.set(r, schema.DispositionDeferred, "", "", res)
		return
	}
	g.unplaced(r, res)
}

// decideApp gives a decrypted app message its outcome against the current
// canonical branch.
func (g *Group) decideApp(r *record, res *Result) {
	n := g.nodes[r.node]
	switch {
	case !g.canonical(n) && g.pass != nil:
		// A candidate witness until the pass applies a branch.
		g.set(r, schema.DispositionDeferred, "", "", res)
	case !g.canonical(n):
		// It decrypts only on a losing branch.
		if r.delivered {
			r.delivered = false
			res.Withdrawn = append(res.Withdrawn, r.in.ID)
		}
		g.set(r, schema.DispositionInvalidated, "", "", res)
	case g.tip.epoch-r.epoch > g.policy.AppPayloadPastEpochLimit:
		if !r.delivered {
			g.stale(r, "", res)
		}
	case g.lifecycle == Recovering:
		if !r.delivered {
			g.set(r, schema.DispositionDeferred, "", "", res) // no delivery while Recovering
		}
	default:
		g.set(r, schema.DispositionAccepted, "", "", res)
		if !r.delivered {
			r.delivered = true
			res.Delivered = append(res.Delivered, Delivery{
				ID: r.in.ID, Epoch: r.epoch, Sender: r.sender, Generation: r.gen, Payload: slices.Clone(r.payload),
				Recipients: g.recipients(n, r.sender),
			})
		}
	}
	g.freezeIfSettled(r)
}

// relevant records selection-relevant input: it opens a pass, or restarts
// quiescence of the open one; a divergent edge or witness makes it a
// recovery (fork detection).
func (g *Group) relevant(now time.Time, divergent bool, res *Result) {
	if g.pass == nil {
		g.pass = &pass{start: now, base: g.tip.epoch}
	}
	g.pass.last = now
	if divergent && !g.pass.divergent {
		g.pass.divergent = true
		if g.lifecycle == Stable {
			g.lifecycle = Recovering
			res.ForkDetected = true
			// Delivery pauses: nothing new is delivered until apply.
		}
	}
}

// canonical reports whether n is on the canonical path.
func (g *Group) canonical(n *node) bool {
	for x := g.tip; x != nil; x = x.parent {
		if x == n {
			return true
		}
		if x.epoch < n.epoch {
			return false
		}
	}
	return false
}

// divergent reports whether n is a fork rather than linear advancement: it
// is off the canonical path and either diverged below the tip or shares a
// parent with a competing edge (convergence.md, "Fork detection").
func (g *Group) divergent(n *node) bool {
	x := n
	for x != nil && !g.canonical(x) {
		if x.parent != nil && len(x.parent.children) > 1 {
			return true
		}
		x = x.parent
	}
	return x != nil && x != n && x != g.tip
}

func (g *Group) attach(child *node) {
	p := child.parent
	p.children = append(p.children, child)
	slices.SortFunc(p.children, func(a, b *node) int { return bytes.Compare(a.id[:], b.id[:]) })
	g.nodes[child.id] = child
}

func (g *Group) sortedNodes() []*node {
	out := slices.Collect(maps.Values(g.nodes))
	slices.SortFunc(out, func(a, b *node) int {
		if c := cmp.Compare(a.epoch, b.epoch); c != 0 {
			return c
		}
		return bytes.Compare(a.id[:], b.id[:])
	})
	return out
}

func (g *Group) sortedRecords() []*record { return sortByID(slices.Collect(maps.Values(g.inputs))) }

// sortedLive returns the inputs not settled, by id: the only ones a retry,
// a redecision or Marshal's live list has to look at.
func (g *Group) sortedLive() []*record { return sortByID(slices.Collect(maps.Values(g.live))) }

func sortByID(out []*record) []*record {
	slices.SortFunc(out, func(a, b *record) int { return bytes.Compare(a.in.ID[:], b.in.ID[:]) })
	return out
}

// set changes r's current outcome, reporting a change.
func (g *Group) set(r *record, d schema.Disposition, c schema.Category, n schema.NamedOutcome, res *Result) {
	o := Outcome{ID: r.in.ID, Class: r.in.Class, Disposition: d, Category: c, NamedOutcome: n}
	if o == r.out {
		return
	}
	r.out = o
	res.Outcomes = append(res.Outcomes, o)
}

func (g *Group) reject(r *record, c schema.Category, res *Result) {
	if c == "" {
		c = schema.CategoryInvalidEncoding
	}
	r.terminal = true
	r.in.Data = nil
	g.set(r, "", c, "", res)
	g.freezeIfSettled(r)
}

func (g *Group) stale(r *record, named schema.NamedOutcome, res *Result) {
	r.terminal = true
	r.in.Data = nil
	r.payload = nil
	g.set(r, schema.DispositionStale, schema.CategoryStaleEpoch, named, res)
	g.freezeIfSettled(r)
}

// identify reports whether n's epoch secrets authenticate msg (its
// membership tag, engine.State.Authenticates), which makes n the message's
// candidate parent. known is false when that cannot be told: the sender is
// not a member and carries no tag, or the bytes do not decode; replay then
// decides.
func (g *Group) identify(n *node, msg []byte) (parent, known bool) {
	ok, err := n.state.Authenticates(msg)
	if err != nil {
		return false, false
	}
	return ok, true
}

// notParent is the fallback when no membership tag identified the parent:
// a sender signature covers the parent's GroupContext, so a state of another
// branch fails it just as a bad signature would; that identifies no parent,
// so it is not terminal (errors.md: the input stays deferred while its
// parent may still arrive).
func notParent(err error) bool {
	return errors.Is(err, engine.ErrNotAuthenticated) || engine.CategoryOf(err) == schema.CategoryInvalidSignature
}

func categoryOr(err error, c schema.Category) schema.Category {
	if cat := engine.CategoryOf(err); cat != "" {
		return cat
	}
	return c
}
