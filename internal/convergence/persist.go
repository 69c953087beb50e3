package convergence

import (
	"bytes"
	"fmt"
	"slices"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// persistVersion is the version of the Marshal format. Version 2 holds
// settled inputs in chunks (pSettled); Unmarshal still reads version 1,
// which holds every input in Inputs.
const persistVersion = 2

// persisted is everything a restart needs (Marmot durability.md): the
// retained candidate states, every admitted input with its bytes (until
// it no longer needs them), its dependencies and its live disposition, the
// lifecycle, and the open or frozen pass with its batch membership.
type persisted struct {
	V         int                  `msgpack:"v"`
	Lifecycle Lifecycle            `msgpack:"lifecycle"`
	Root      []byte               `msgpack:"root"`
	Tip       []byte               `msgpack:"tip"`
	Nodes     []pNode              `msgpack:"nodes"`
	Inputs    []pInput             `msgpack:"inputs"`
	Settled   []msgpack.RawMessage `msgpack:"settled,omitempty"` // each a pSettled
	Queue     [][]byte             `msgpack:"queue,omitempty"`
	Pass      *pPass               `msgpack:"pass,omitempty"`
	Policy    pPolicyMarker        `msgpack:"policy"`
}

// pSettled is one chunk of settled inputs: their shared fields once, then
// their ids, 32 bytes each, and for messages delivered above the anchor
// their payloads and senders by index (From[i] indexes Senders, the
// chunk's distinct senders: at most chunkCap). Its encoding is cached
// until an input joins it, so an epoch's delivered messages are not
// encoded again every time.
type pSettled struct {
	Class       schema.InputClass   `msgpack:"class"`
	Epoch       uint64              `msgpack:"epoch"`
	HasEpoch    bool                `msgpack:"has_epoch,omitempty"`
	Disposition schema.Disposition  `msgpack:"disposition,omitempty"`
	Category    schema.Category     `msgpack:"category,omitempty"`
	Named       schema.NamedOutcome `msgpack:"named,omitempty"`
	Node        []byte              `msgpack:"node,omitempty"`
	Delivered   bool                `msgpack:"delivered,omitempty"`
	Terminal    bool                `msgpack:"terminal,omitempty"`
	IDs         []byte              `msgpack:"ids"`
	Senders     []pSender           `msgpack:"senders,omitempty"`
	From        []byte              `msgpack:"from,omitempty"`
	Gens        []uint32            `msgpack:"gens,omitempty"`
	Payloads    [][]byte            `msgpack:"payloads,omitempty"`
}

// pSender is an engine.Member.
type pSender struct {
	Leaf  uint32 `msgpack:"leaf"`
	Inbox string `msgpack:"inbox"`
	Key   []byte `msgpack:"key"`
}

// pPolicyMarker records the policy values so a restore under another
// policy is refused rather than silently rescored.
type pPolicyMarker struct {
	Rewind, Window, QuorumSenders, QuorumEpochs, Override uint64
	QuiescenceMS, PassMS                                  int64
}

type pNode struct {
	ID         []byte   `msgpack:"id"`
	Parent     []byte   `msgpack:"parent,omitempty"`
	Epoch      uint64   `msgpack:"epoch"`
	State      []byte   `msgpack:"state,omitempty"` // engine snapshot; nil when removed
	Committer  string   `msgpack:"committer,omitempty"`
	Privileged bool     `msgpack:"privileged,omitempty"`
	Consumed   [][]byte `msgpack:"consumed,omitempty"`
	Proposals  [][]byte `msgpack:"proposals,omitempty"` // ref, id pairs flattened
	Witnesses  []string `msgpack:"witnesses,omitempty"`
	// Carrier is the hosted member whose keys State holds; Members the
	// other hosted members at the node, sorted; Pending their own commits
	// made at it, Sent their app messages sent at it not yet come back. A
	// view of one member made by New has none of them.
	Carrier string     `msgpack:"carrier,omitempty"`
	Members []pMember  `msgpack:"members,omitempty"`
	Pending []pPending `msgpack:"pending,omitempty"`
	Sent    []pSent    `msgpack:"sent,omitempty"`
}

// pSent is an app message a hosted member sent at a node (Encrypt), by id.
type pSent struct {
	ID         []byte `msgpack:"id"`
	Leaf       uint32 `msgpack:"leaf"`
	Inbox      string `msgpack:"inbox"`
	Key        []byte `msgpack:"key"`
	Generation uint32 `msgpack:"generation,omitempty"`
	Payload    []byte `msgpack:"payload"`
}

// pMember is a hosted member's private part at a node (engine.MemberKeys),
// its path keys by node index in order.
type pMember struct {
	ID      string   `msgpack:"id"`
	Leaf    uint32   `msgpack:"leaf"`
	LeafKey []byte   `msgpack:"leaf_key"`
	Nodes   []uint32 `msgpack:"nodes,omitempty"`
	Keys    [][]byte `msgpack:"keys,omitempty"`
}

// pPending is an own commit made at a node: its committer's state
// (engine.State.Snapshot, which holds the state after it).
type pPending struct {
	ID        []byte `msgpack:"id"`
	Committer string `msgpack:"committer"`
	State     []byte `msgpack:"state"`
}

type pInput struct {
	ID          []byte              `msgpack:"id"`
	Class       schema.InputClass   `msgpack:"class"`
	Data        []byte              `msgpack:"data,omitempty"`
	Epoch       uint64              `msgpack:"epoch"`
	HasEpoch    bool                `msgpack:"has_epoch,omitempty"`
	Disposition schema.Disposition  `msgpack:"disposition,omitempty"`
	Category    schema.Category     `msgpack:"category,omitempty"`
	Named       schema.NamedOutcome `msgpack:"named,omitempty"`
	Node        []byte              `msgpack:"node,omitempty"`
	SenderLeaf  uint32              `msgpack:"sender_leaf,omitempty"`
	SenderInbox string              `msgpack:"sender_inbox,omitempty"`
	SenderKey   []byte              `msgpack:"sender_key,omitempty"`
	Generation  uint32              `msgpack:"generation,omitempty"`
	Payload     []byte              `msgpack:"payload,omitempty"`
	Delivered   bool                `msgpack:"delivered,omitempty"`
	Terminal    bool                `msgpack:"terminal,omitempty"`
	Queued      bool                `msgpack:"queued,omitempty"`
}

type pPass struct {
	StartNS   int64    `msgpack:"start_ns"`
	LastNS    int64    `msgpack:"last_ns"`
	Base      uint64   `msgpack:"base"`
	Divergent bool     `msgpack:"divergent,omitempty"`
	Frozen    bool     `msgpack:"frozen,omitempty"`
	Batch     [][]byte `msgpack:"batch,omitempty"`
}

func (p Policy) marker() pPolicyMarker {
	return pPolicyMarker{
		Rewind: p.MaxRewindCommits, Window: p.AppPayloadPastEpochLimit,
		QuorumSenders: uint64(p.WitnessQuorumSendersPerEpoch), QuorumEpochs: uint64(p.WitnessQuorumEpochs),
		Override: p.MaxWitnessOverrideDepth, QuiescenceMS: p.SettlementQuiescence.Milliseconds(), PassMS: p.MaxConvergencePass.Milliseconds(),
	}
}

// Marshal serializes the group for durable storage. The bytes hold MLS
// epoch secrets, private keys and decrypted payloads: the caller seals them
// (engine.Vault.SealState) before they leave the process. The encoding is
// deterministic for a given state. Marshal reuses what has not changed
// since it last ran: the snapshot of each retained state other than the
// tip that nothing decrypted at, and the encoding of each chunk of settled
// inputs nothing joined, so its work does not grow with the messages an
// epoch has seen beyond copying their persisted form.
func (g *Group) Marshal() ([]byte, error) {
	return g.marshal(true)
}

// MarshalSplit is Marshal with the settled inputs held apart: head is the
// rest of the group, chunks the encodings of its chunks of settled inputs,
// oldest first. A chunk's encoding stays as it is until an input joins it
// (only the newest chunk of a run takes inputs) or the chunk goes, so a
// caller can store each chunk once, beside a head whose size does not grow
// with the epoch's messages, and store again only the chunks whose bytes
// changed. UnmarshalSplit takes both back. The chunks hold payloads and
// must be sealed like the head.
func (g *Group) MarshalSplit() (head []byte, chunks [][]byte, err error) {
	head, err = g.marshal(false)
	if err != nil {
		return nil, nil, err
	}
	for _, c := range g.chunks {
		chunks = append(chunks, c.enc)
	}
	return head, chunks, nil
}

// marshal encodes the group, with its settled chunks inline or not; either
// way every chunk's encoding is brought up to date.
func (g *Group) marshal(settled bool) ([]byte, error) {
	p := persisted{V: persistVersion, Lifecycle: g.lifecycle, Root: g.root.id[:], Tip: g.tip.id[:], Policy: g.policy.marker()}
	for _, n := range g.sortedNodes() {
		pn := pNode{ID: n.id[:], Epoch: n.epoch, Committer: n.committer, Privileged: n.privileged}
		if n.parent != nil {
			pn.Parent = n.parent.id[:]
		}
		if n.state != nil {
			b := n.snap
			if b == nil || n.snapAt != n.state.Changes() {
				var err error
				if b, err = n.state.Snapshot(); err != nil {
					return nil, fmt.Errorf("convergence: marshal: %w", err)
				}
			}
			// The tip's is not kept: nearly every input changes the tip,
			// and kept it would be a quarter of an idle member's heap.
			n.snap, n.snapAt = nil, 0
			if n != g.tip {
				n.snap, n.snapAt = b, n.state.Changes()
			}
			pn.State = b
		}
		for _, c := range n.consumed {
			pn.Consumed = append(pn.Consumed, c[:])
		}
		for _, ref := range sortedKeys(n.proposals) {
			id := n.proposals[ref]
			pn.Proposals = append(pn.Proposals, []byte(ref), id[:])
		}
		pn.Witnesses = sortedKeys(n.witnesses)
		if err := persistHosted(n, &pn); err != nil {
			return nil, err
		}
		p.Nodes = append(p.Nodes, pn)
	}
	for _, r := range g.sortedLive() {
		pi := pInput{
			ID: r.in.ID[:], Class: r.in.Class, Data: r.in.Data, Epoch: r.epoch, HasEpoch: r.hasEp,
			Disposition: r.out.Disposition, Category: r.out.Category, Named: r.out.NamedOutcome,
			SenderLeaf: r.sender.Leaf, SenderInbox: r.sender.InboxID, SenderKey: r.sender.InstallationKey,
			Generation: r.gen, Payload: r.payload, Delivered: r.delivered, Terminal: r.terminal, Queued: r.queued,
		}
		if r.hasNode {
			pi.Node = r.node[:]
		}
		p.Inputs = append(p.Inputs, pi)
	}
	for _, c := range g.chunks {
		if c.enc == nil {
			b, err := c.encode()
			if err != nil {
				return nil, err
			}
			c.enc = b
		}
		if settled {
			p.Settled = append(p.Settled, c.enc)
		}
	}
	for _, id := range g.queue {
		p.Queue = append(p.Queue, id[:])
	}
	if g.pass != nil {
		pp := &pPass{StartNS: g.pass.start.UnixNano(), LastNS: g.pass.last.UnixNano(), Base: g.pass.base, Divergent: g.pass.divergent, Frozen: g.pass.frozen}
		for _, id := range g.pass.batch {
			pp.Batch = append(pp.Batch, id[:])
		}
		p.Pass = pp
	}
	// Sized like the last result: the bytes are copied once, not regrown.
	var buf bytes.Buffer
	size := &g.size
	if !settled {
		size = &g.headSize
	}
	buf.Grow(*size + *size/8)
	if err := msgpack.NewEncoder(&buf).Encode(&p); err != nil {
		return nil, fmt.Errorf("convergence: marshal: %w", err)
	}
	*size = buf.Len()
	return buf.Bytes(), nil
}

func (c *chunk) encode() ([]byte, error) {
	f := c.fixed
	ps := pSettled{
		Class: f.class, Epoch: f.epoch, HasEpoch: f.hasEp, Disposition: f.out.Disposition, Category: f.out.Category, Named: f.out.NamedOutcome,
		Delivered: f.delivered, Terminal: f.terminal, IDs: make([]byte, 0, len(c.ids)*len(ID{})),
	}
	if f.hasNode {
		ps.Node = f.node[:]
	}
	for _, id := range c.ids {
		ps.IDs = append(ps.IDs, id[:]...)
	}
	for i, m := range c.senders {
		at := slices.IndexFunc(ps.Senders, func(s pSender) bool {
			return s.Leaf == m.Leaf && s.Inbox == m.InboxID && bytes.Equal(s.Key, m.InstallationKey)
		})
		if at < 0 {
			at = len(ps.Senders)
			ps.Senders = append(ps.Senders, pSender{Leaf: m.Leaf, Inbox: m.InboxID, Key: m.InstallationKey})
		}
		ps.From = append(ps.From, byte(at))
		if c.gens[i] != 0 {
			ps.Gens = append(ps.Gens, make([]uint32, i+1-len(ps.Gens))...)
			ps.Gens[i] = c.gens[i]
		}
		ps.Payloads = append(ps.Payloads, c.payloads[i])
	}
	b, err := msgpack.Marshal(&ps)
	if err != nil {
		return nil, fmt.Errorf("convergence: marshal settled inputs: %w", err)
	}
	return b, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Unmarshal restores a group from Marshal bytes under policy p. Malformed
// or inconsistent bytes fail with ErrCorrupt. A retained state whose
// snapshot no longer restores (engine.Restore fails) is storage loss: the
// group comes back Unrecoverable and the inputs that needed that state are
// deferred with MissingRetainedAnchor (retained-history.md, "Late commits").
func Unmarshal(p Policy, b []byte) (g *Group, err error) {
	in, err := decodePersisted(p, b)
	if err != nil {
		return nil, err
	}
	return restore(p, in)
}

// UnmarshalSplit restores a group from MarshalSplit's head and chunks.
func UnmarshalSplit(p Policy, head []byte, chunks [][]byte) (*Group, error) {
	in, err := decodePersisted(p, head)
	if err != nil {
		return nil, err
	}
	if in.V != persistVersion || in.Settled != nil {
		return nil, fmt.Errorf("%w: head of version %d with settled inputs inline", ErrCorrupt, in.V)
	}
	for _, c := range chunks {
		in.Settled = append(in.Settled, c)
	}
	return restore(p, in)
}

// decodePersisted decodes and checks Marshal bytes (or a MarshalSplit head).
func decodePersisted(p Policy, b []byte) (persisted, error) {
	var in persisted
	if err := p.validate(); err != nil {
		return in, err
	}
	dec, err := schema.NewMsgpackDecoder(b)
	if err != nil {
		return in, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	dec.DisallowUnknownFields(true)
	if err := dec.Decode(&in); err != nil {
		return in, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if in.V != persistVersion && (in.V != 1 || in.Settled != nil) {
		return in, fmt.Errorf("%w: version %d", ErrCorrupt, in.V)
	}
	return in, nil
}

// restore rebuilds a group from its decoded persisted form.
func restore(p Policy, in persisted) (g *Group, err error) {
	if in.Policy != p.marker() {
		return nil, fmt.Errorf("%w: persisted under another policy", ErrCorrupt)
	}
	switch in.Lifecycle {
	case Stable, Recovering, Unrecoverable:
	default:
		return nil, fmt.Errorf("%w: lifecycle", ErrCorrupt)
	}
	g = &Group{policy: p, nodes: map[ID]*node{}, inputs: map[ID]*record{}, live: map[ID]*record{}, lifecycle: in.Lifecycle}
	root, rok := toID(in.Root)
	tip, tok := toID(in.Tip)
	if !rok || !tok {
		return nil, fmt.Errorf("%w: root or tip", ErrCorrupt)
	}
	var lost []*node
	parents := map[ID]ID{}
	for _, pn := range in.Nodes {
		id, ok := toID(pn.ID)
		if !ok || g.nodes[id] != nil || len(pn.Proposals)%2 != 0 {
			return nil, fmt.Errorf("%w: node", ErrCorrupt)
		}
		n := &node{id: id, epoch: pn.Epoch, committer: pn.Committer, privileged: pn.Privileged, proposals: map[string]ID{}, witnesses: map[string]bool{}}
		if err := restoreHosted(n, pn); err != nil {
			return nil, err
		}
		if pn.State != nil {
			st, err := engine.Restore(pn.State)
			if err != nil {
				lost = append(lost, n)
			} else if st.Epoch() != pn.Epoch {
				return nil, fmt.Errorf("%w: node epoch", ErrCorrupt)
			} else if id != tip {
				n.snap, n.snapAt = slices.Clone(pn.State), st.Changes()
			}
			n.state = st
		}
		for _, c := range pn.Consumed {
			cid, ok := toID(c)
			if !ok {
				return nil, fmt.Errorf("%w: consumed proposal", ErrCorrupt)
			}
			n.consumed = append(n.consumed, cid)
		}
		for i := 0; i < len(pn.Proposals); i += 2 {
			pid, ok := toID(pn.Proposals[i+1])
			if !ok {
				return nil, fmt.Errorf("%w: proposal", ErrCorrupt)
			}
			n.proposals[string(pn.Proposals[i])] = pid
		}
		for _, w := range pn.Witnesses {
			n.witnesses[w] = true
		}
		if pn.Parent != nil {
			pid, ok := toID(pn.Parent)
			if !ok {
				return nil, fmt.Errorf("%w: parent", ErrCorrupt)
			}
			parents[id] = pid
		}
		g.nodes[id] = n
	}
	for id, pid := range parents {
		n, parent := g.nodes[id], g.nodes[pid]
		if parent == nil || parent.epoch+1 != n.epoch {
			return nil, fmt.Errorf("%w: parent", ErrCorrupt)
		}
		n.parent = parent
		parent.children = append(parent.children, n)
	}
	for _, n := range g.nodes {
		slices.SortFunc(n.children, func(a, b *node) int { return bytes.Compare(a.id[:], b.id[:]) })
	}
	if g.nodes[root] == nil || g.nodes[tip] == nil || g.nodes[root].parent != nil {
		return nil, fmt.Errorf("%w: root or tip", ErrCorrupt)
	}
	g.root, g.tip = g.nodes[root], g.nodes[tip]
	if !g.reaches(g.tip, g.root) || len(parents) != len(g.nodes)-1 {
		return nil, fmt.Errorf("%w: tree", ErrCorrupt)
	}
	for _, pi := range in.Inputs {
		r, err := g.restoreInput(pi)
		if err != nil {
			return nil, err
		}
		if in.V != 1 && g.settled(r) {
			return nil, fmt.Errorf("%w: settled input stored live", ErrCorrupt)
		}
		g.inputs[r.in.ID] = r
		g.live[r.in.ID] = r
	}
	for _, raw := range in.Settled {
		if err := g.restoreChunk(raw); err != nil {
			return nil, err
		}
	}
	if in.V == 1 {
		g.rechunk()
	}
	for _, q := range in.Queue {
		id, ok := toID(q)
		if !ok || g.inputs[id] == nil || !g.inputs[id].queued {
			return nil, fmt.Errorf("%w: queue", ErrCorrupt)
		}
		g.queue = append(g.queue, id)
	}
	if in.Pass != nil {
		pp := in.Pass
		g.pass = &pass{start: time.Unix(0, pp.StartNS), last: time.Unix(0, pp.LastNS), base: pp.Base, divergent: pp.Divergent, frozen: pp.Frozen}
		for _, b := range pp.Batch {
			id, ok := toID(b)
			if !ok {
				return nil, fmt.Errorf("%w: batch", ErrCorrupt)
			}
			g.pass.batch = append(g.pass.batch, id)
		}
	}
	if len(lost) > 0 {
		g.markLost(lost)
	}
	return g, nil
}

func (g *Group) restoreInput(pi pInput) (*record, error) {
	id, ok := toID(pi.ID)
	if !ok || g.inputs[id] != nil {
		return nil, fmt.Errorf("%w: input id", ErrCorrupt)
	}
	switch pi.Class {
	case schema.ClassCommit, schema.ClassProposal, schema.ClassApplication:
	default:
		return nil, fmt.Errorf("%w: input class", ErrCorrupt)
	}
	if (pi.Disposition != "" && !pi.Disposition.Valid()) || (pi.Category != "" && !pi.Category.Valid()) || (pi.Named != "" && !pi.Named.Valid()) {
		return nil, fmt.Errorf("%w: outcome", ErrCorrupt)
	}
	r := &record{
		in: Input{ID: id, Class: pi.Class, Data: pi.Data}, epoch: pi.Epoch, hasEp: pi.HasEpoch,
		out:    Outcome{ID: id, Class: pi.Class, Disposition: pi.Disposition, Category: pi.Category, NamedOutcome: pi.Named},
		sender: engine.Member{Leaf: pi.SenderLeaf, InboxID: pi.SenderInbox, InstallationKey: pi.SenderKey},
		gen:    pi.Generation, payload: pi.Payload, delivered: pi.Delivered, terminal: pi.Terminal, queued: pi.Queued,
	}
	if pi.Node != nil {
		nid, ok := toID(pi.Node)
		if !ok || g.nodes[nid] == nil {
			return nil, fmt.Errorf("%w: input node", ErrCorrupt)
		}
		r.node, r.hasNode = nid, true
	}
	// A decrypted app message (placed at its node) needs no bytes again.
	if !r.terminal && r.in.Data == nil && (r.in.Class != schema.ClassApplication || !r.hasNode) {
		return nil, fmt.Errorf("%w: live input without bytes", ErrCorrupt)
	}
	return r, nil
}

// restoreChunk restores one chunk of settled inputs as Marshal wrote it, so
// its cached encoding stays valid.
func (g *Group) restoreChunk(raw []byte) error {
	var ps pSettled
	dec, err := schema.NewMsgpackDecoder(raw)
	if err != nil {
		return fmt.Errorf("%w: settled inputs: %v", ErrCorrupt, err)
	}
	dec.DisallowUnknownFields(true)
	if err := dec.Decode(&ps); err != nil {
		return fmt.Errorf("%w: settled inputs: %v", ErrCorrupt, err)
	}
	n := len(ps.IDs) / len(ID{})
	if n == 0 || n > chunkCap || len(ps.IDs)%len(ID{}) != 0 || len(ps.Payloads) != len(ps.From) || len(ps.Senders) > len(ps.From) || len(ps.Gens) > len(ps.From) {
		return fmt.Errorf("%w: settled ids", ErrCorrupt)
	}
	c := &chunk{enc: slices.Clone(raw)}
	for i := range n {
		pi := pInput{
			ID: ps.IDs[i*len(ID{}) : (i+1)*len(ID{})], Class: ps.Class, Epoch: ps.Epoch, HasEpoch: ps.HasEpoch,
			Disposition: ps.Disposition, Category: ps.Category, Named: ps.Named, Node: ps.Node,
			Delivered: ps.Delivered, Terminal: ps.Terminal,
		}
		r, err := g.restoreInput(pi)
		if err != nil {
			return err
		}
		if !g.settled(r) {
			return fmt.Errorf("%w: unsettled input stored settled", ErrCorrupt)
		}
		want := 0
		if g.rewindable(r) {
			want = n
		}
		if len(ps.From) != want || (want > 0 && int(ps.From[i]) >= len(ps.Senders)) {
			return fmt.Errorf("%w: settled senders", ErrCorrupt)
		}
		if want > 0 {
			s := ps.Senders[ps.From[i]]
			r.sender, r.payload = engine.Member{Leaf: s.Leaf, InboxID: s.Inbox, InstallationKey: s.Key}, ps.Payloads[i]
			if i < len(ps.Gens) {
				r.gen = ps.Gens[i]
			}
			c.senders, c.gens, c.payloads = append(c.senders, r.sender), append(c.gens, r.gen), append(c.payloads, r.payload)
		}
		r.frozen = true
		if i == 0 {
			c.fixed = fixedOf(r)
		}
		c.ids = append(c.ids, r.in.ID)
		g.inputs[r.in.ID] = r
	}
	g.chunks = append(g.chunks, c)
	return nil
}

// reaches reports whether from descends from to.
func (g *Group) reaches(from, to *node) bool {
	for x := from; x != nil; x = x.parent {
		if x == to {
			return true
		}
	}
	return false
}

// markLost handles retained states that did not restore: inside the
// horizon this is storage loss, so the group is Unrecoverable and the
// inputs needing those states stay deferred as MissingRetainedAnchor.
func (g *Group) markLost(lost []*node) {
	g.lifecycle = Unrecoverable
	lostSet := map[ID]bool{}
	for _, n := range lost {
		lostSet[n.id] = true
	}
	var res Result
	for _, r := range g.sortedRecords() {
		if r.terminal || !r.hasNode {
			continue
		}
		n := g.nodes[r.node]
		needs := lostSet[n.id] || (n.parent != nil && lostSet[n.parent.id])
		if needs && r.out.Disposition != schema.DispositionAccepted {
			g.set(r, schema.DispositionDeferred, schema.CategoryMissingHistory, schema.MissingRetainedAnchor, &res)
		}
	}
}

func toID(b []byte) (ID, bool) {
	var id ID
	if len(b) != len(id) {
		return id, false
	}
	copy(id[:], b)
	return id, true
}
