package groupstate

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/fabric-mls/fabric/internal/engine"
)

// Snapshot is a group's state at rest: the shared state once, without any
// member's private keys, and each hosted member's private part apart, so
// a member's part can be stored, sealed or dropped on its own. Past epochs
// are not in it: after a restore, late messages of an epoch before the
// snapshot's are stale (docs/shared-state.md).
type Snapshot struct {
	V int `json:"v"`
	// Shared is engine.State.SharedSnapshot of the shared state; Carrier
	// names the member whose keys restore it.
	Shared  []byte           `json:"shared"`
	Carrier string           `json:"carrier"`
	Members []MemberSnapshot `json:"members"`
	// Pending are the own commits of the epoch not yet come back.
	Pending []PendingSnapshot `json:"pending,omitempty"`
}

// MemberSnapshot is one hosted member's private part.
type MemberSnapshot struct {
	ID     string             `json:"id"`
	Joined uint64             `json:"joined"`
	Keys   *engine.MemberKeys `json:"keys"`
}

// PendingSnapshot is an own commit not yet come back: its committer's
// state (engine.State.Snapshot, which holds the state after it).
type PendingSnapshot struct {
	ID        []byte `json:"id"`
	Committer string `json:"committer"`
	State     []byte `json:"state"`
}

// ErrBadSnapshot: the bytes are no group snapshot.
var ErrBadSnapshot = errors.New("groupstate: bad snapshot")

// Snapshot returns the group's state at rest. It holds secrets: seal the
// parts (engine.Vault.SealState) before they leave the process.
func (g *Group) Snapshot() (*Snapshot, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shared == nil {
		return nil, ErrEnded
	}
	shared, err := g.shared.SharedSnapshot()
	if err != nil {
		return nil, fmt.Errorf("groupstate: snapshot: %w", err)
	}
	s := &Snapshot{V: 1, Shared: shared, Carrier: g.carrier}
	for _, id := range g.roster {
		m := g.members[id]
		s.Members = append(s.Members, MemberSnapshot{ID: id, Joined: m.joined, Keys: m.keys.Clone()})
	}
	for _, p := range g.pending {
		b, err := p.state.Snapshot()
		if err != nil {
			return nil, fmt.Errorf("groupstate: snapshot: %w", err)
		}
		s.Pending = append(s.Pending, PendingSnapshot{ID: slices.Clone(p.id[:]), Committer: p.committer, State: b})
	}
	return s, nil
}

// Marshal encodes the snapshot as one blob: a cold restore of the group
// is one read.
func (s *Snapshot) Marshal() ([]byte, error) { return json.Marshal(s) }

// UnmarshalSnapshot decodes Marshal's bytes.
func UnmarshalSnapshot(b []byte) (*Snapshot, error) {
	var s Snapshot
	if err := json.Unmarshal(b, &s); err != nil || s.V != 1 {
		return nil, ErrBadSnapshot
	}
	return &s, nil
}

// Restore rebuilds a group from its snapshot: the shared state restored
// once (as its carrier, engine.RestoreAs, which checks it), the members'
// parts taken as they are.
func Restore(s *Snapshot, cfg Config) (*Group, error) {
	g := New(cfg)
	i := slices.IndexFunc(s.Members, func(m MemberSnapshot) bool { return m.ID == s.Carrier })
	if i < 0 {
		return nil, ErrBadSnapshot
	}
	shared, err := engine.RestoreAs(s.Shared, s.Members[i].Keys)
	if err != nil {
		return nil, fmt.Errorf("groupstate: restore: %w", err)
	}
	g.shared, g.carrier = shared, s.Carrier
	for _, m := range s.Members {
		if m.Keys == nil {
			return nil, ErrBadSnapshot
		}
		if _, dup := g.members[m.ID]; dup {
			return nil, ErrBadSnapshot
		}
		if _, taken := g.byLeaf[m.Keys.Leaf]; taken {
			return nil, ErrBadSnapshot
		}
		if _, ok := shared.Member(m.Keys.Leaf); !ok {
			return nil, ErrBadSnapshot
		}
		g.members[m.ID] = &member{keys: m.Keys.Clone(), joined: m.Joined}
		g.byLeaf[m.Keys.Leaf] = m.ID
		g.roster = append(g.roster, m.ID)
	}
	slices.Sort(g.roster)
	for _, p := range s.Pending {
		if _, ok := g.members[p.Committer]; !ok || len(p.ID) != len(engine.MessageID{}) {
			return nil, ErrBadSnapshot
		}
		st, err := engine.Restore(p.State)
		if err != nil {
			return nil, fmt.Errorf("groupstate: restore: %w", err)
		}
		g.pending = append(g.pending, &pendingCommit{id: engine.MessageID(p.ID), committer: p.Committer, state: st})
	}
	return g, nil
}
