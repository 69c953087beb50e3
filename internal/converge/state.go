package converge

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Bounds of what one group's state keeps.
const (
	// maxRollbacks bounds the rollback counts a group keeps: far more than
	// the commits and messages inside the rollback horizon.
	maxRollbacks = 1024
)

// stateVersion is the version of the group state blob format. Version 3
// keeps no message index: it is stored entry by entry (index.go).
// Versions 2 (the index's full chunks in blobs of their own) and 1 (the
// whole index inline) are read still, and their index migrated.
const stateVersion = 3

// groupState is one group's canonical state as converge keeps it, beside
// each hosted member's engine state (kept in blobs of their own).
type groupState struct {
	V       int    `msgpack:"v"`
	Tenant  string `msgpack:"tenant"`
	GroupID []byte `msgpack:"group_id"`
	// Epoch is the canonical epoch.
	Epoch uint64 `msgpack:"epoch"`
	// Components is the canonical components extension body; nil before
	// any member joined.
	Components []byte `msgpack:"components"`
	// Members are the hosted members, by client id, removed ones included.
	Members map[string]*hostedMember `msgpack:"members"`
	// LeaveRequests are the inboxes that published a leave request (a
	// Remove proposal of their own leaf) and are still members (EVENT-006).
	LeaveRequests []string `msgpack:"leave_requests,omitempty"`
	// Messages and MessageBase are the message index of a version 1 or 2
	// state, oldest first, and the ordinal of its first entry: read, and
	// moved into the stored index (index.go).
	Messages    []storedMessage `msgpack:"messages,omitempty"`
	MessageBase uint64          `msgpack:"message_base,omitempty"`
	// Expiry are the expiry queues of the stored index, by duration.
	Expiry []expiryQueue `msgpack:"expiry,omitempty"`
	// sorted are Members in client id order (byClientID).
	sorted []*hostedMember
	// unstored are the index writes of transactions whose batches are not
	// known stored yet, oldest first: a pipelined transaction reads them
	// before the stream.
	unstored []*indexWrites
	// Keys are the candidate group event keys, oldest first, each sealed
	// under the master key (groupkeys.go).
	Keys []epochKey `msgpack:"keys,omitempty"`
	// Due is when a hosted member's convergence pass is next due (unix ms,
	// stream time); 0 when none is open.
	Due int64 `msgpack:"due,omitempty"`
	// Rollbacks count, per commit or message id, how often branch
	// selection took it back (superseded or withdrawn), oldest first, at
	// most maxRollbacks: the count is part of the cause of its events, so a
	// commit applied again, or a message delivered again, after a rollback
	// gets new event ids.
	Rollbacks []rollback `msgpack:"rollbacks,omitempty"`
	// LastSeq and LastTime are the newest input branch selection admitted:
	// a payload a pass delivers later is indexed with them.
	LastSeq  uint64 `msgpack:"last_seq,omitempty"`
	LastTime int64  `msgpack:"last_time,omitempty"`
	// Delivered is the newest delivery number (readable.go).
	Delivered uint64 `msgpack:"delivered,omitempty"`
	// OwnCommits are the hosted members' own commits on the outbound
	// stream whose operations wait for their outcome (operate.go).
	OwnCommits []ownCommit `msgpack:"own_commits,omitempty"`
	// AcceptedCommits are own commits accepted while a winning branch
	// may still supersede them (superseded.go).
	AcceptedCommits []ownCommit `msgpack:"accepted_commits,omitempty"`
	// Waiting are the sends and leave requests of clients whose own
	// commit is pending, and the commit operations of clients whose lost
	// commit is retried, in input order (operate.go).
	Waiting []waitingOp `msgpack:"waiting,omitempty"`
	// RosterInboxes and RosterInstallations count the canonical roster
	// when it was last written (readable.go).
	RosterInboxes       int `msgpack:"roster_inboxes,omitempty"`
	RosterInstallations int `msgpack:"roster_installations,omitempty"`
}

// hostedMember is a hosted client's membership of the group.
type hostedMember struct {
	ClientID     string `msgpack:"client_id"`
	InboxID      string `msgpack:"inbox_id"`
	Installation []byte `msgpack:"installation"`
	// JoinedSeq is the input sequence at which the member joined: it holds
	// the messages after it.
	JoinedSeq uint64 `msgpack:"joined_seq"`
	// Removed is set once a commit removed the member's leaf; it then has
	// no engine state and takes no more input, but while Retained.
	Removed bool `msgpack:"removed,omitempty"`
	// Retained is set while a removal is inside the rollback horizon: the
	// member's convergence state is kept and takes input, so a winning
	// branch that keeps the member brings it back (conversation.joined,
	// JOIN-042). RemovedEpoch is the epoch the removal produced; input of
	// max_rewind_commits epochs later settles the removal.
	Retained     bool   `msgpack:"retained,omitempty"`
	RemovedEpoch uint64 `msgpack:"removed_epoch,omitempty"`
	// Adder is the inbox that added the member (JOIN-025): a rejoin after
	// a rollback names it again (EVENT-023).
	Adder string `msgpack:"adder,omitempty"`
	// Unsaved counts the decryptions since the member's engine state was
	// last written (Config.SnapshotEvery).
	Unsaved int `msgpack:"unsaved,omitempty"`
	// Forked is set once the member's client was told its fork state
	// became forked (conversation.fork_detected).
	Forked bool `msgpack:"forked,omitempty"`
	// Applied counts the events each recently applied commit caused for
	// the member, newest last, so a commit that branch selection
	// supersedes names the events it withdraws (fabric.commit_superseded).
	Applied []attributed `msgpack:"applied,omitempty"`
	// LastN is the group's newest delivery number when the member was
	// removed: the last message it holds.
	LastN uint64 `msgpack:"last_n,omitempty"`
	// FirstN is the first delivery number after the member joined: no
	// message before it is the member's.
	FirstN uint64 `msgpack:"first_n,omitempty"`
	// LeafAt is when the member's leaf was last renewed (unix ms, by
	// converge's clock): the transaction it first appears in, then each
	// accepted own commit (a commit carries the committer's new path).
	// SelfUpdateAsked is when converge last ran a scheduled self-update
	// for it (Config.SelfUpdateAfter).
	LeafAt          int64 `msgpack:"leaf_at,omitempty"`
	SelfUpdateAsked int64 `msgpack:"self_update_asked,omitempty"`
}

// attributed is how many events one applied commit caused for a member.
type attributed struct {
	Commit []byte `msgpack:"commit"`
	Events int    `msgpack:"events"`
}

// maxAttributed bounds a member's Applied: a commit can be superseded only
// while it is inside the rollback horizon (max_rewind_commits = 5 epochs).
const maxAttributed = 16

// noteApplied records the events an applied commit caused for m.
func (m *hostedMember) noteApplied(commit []byte, events int) {
	m.Applied = slices.DeleteFunc(m.Applied, func(a attributed) bool { return bytes.Equal(a.Commit, commit) })
	m.Applied = append(m.Applied, attributed{Commit: slices.Clone(commit), Events: events})
	if len(m.Applied) > maxAttributed {
		m.Applied = slices.Delete(m.Applied, 0, len(m.Applied)-maxAttributed)
	}
}

// attributedEvents returns how many events an applied commit caused for m.
func (m *hostedMember) attributedEvents(commit []byte) int {
	for _, a := range m.Applied {
		if bytes.Equal(a.Commit, commit) {
			return a.Events
		}
	}
	return 0
}

// tookCommit reports whether m's events were made for an applied commit.
func (m *hostedMember) tookCommit(commit []byte) bool {
	return slices.ContainsFunc(m.Applied, func(a attributed) bool { return bytes.Equal(a.Commit, commit) })
}

// storedMessage is one application message in the index.
type storedMessage struct {
	ID                 []byte `msgpack:"id"`
	SenderInboxID      string `msgpack:"sender_inbox_id"`
	SenderInstallation []byte `msgpack:"sender_installation"`
	Seq                uint64 `msgpack:"seq"`
	ExpiresAt          int64  `msgpack:"expires_at,omitempty"`
	// N is the message's delivery number, the subject of its readable
	// record (readable.go); 0 for one indexed before records were kept.
	N uint64 `msgpack:"n,omitempty"`
	// At is when it was sent (stream time, unix ms).
	At int64 `msgpack:"at,omitempty"`
	// Deleted marks a deleted message in a version 1 or 2 index; the
	// stored index has no entry for one.
	Deleted bool `msgpack:"deleted,omitempty"`
}

// rollback is how often one commit or message was taken back.
type rollback struct {
	ID []byte `msgpack:"id"`
	N  uint32 `msgpack:"n"`
}

// generation is how often id was taken back.
func (g *groupState) generation(id []byte) uint32 {
	for _, r := range g.Rollbacks {
		if bytes.Equal(r.ID, id) {
			return r.N
		}
	}
	return 0
}

// rollBack counts one more rollback of id, keeping maxRollbacks ids.
func (g *groupState) rollBack(id []byte) {
	for i := range g.Rollbacks {
		if bytes.Equal(g.Rollbacks[i].ID, id) {
			g.Rollbacks[i].N++
			return
		}
	}
	g.Rollbacks = append(g.Rollbacks, rollback{ID: slices.Clone(id), N: 1})
	if len(g.Rollbacks) > maxRollbacks {
		g.Rollbacks = slices.Delete(g.Rollbacks, 0, len(g.Rollbacks)-maxRollbacks)
	}
}

// epochKey is a group event key of one epoch; in the state record Key is
// sealed.
type epochKey struct {
	Epoch uint64 `msgpack:"epoch"`
	Key   []byte `msgpack:"key"`
}

func newGroupState(tenant string, groupID []byte) *groupState {
	return &groupState{V: stateVersion, Tenant: tenant, GroupID: groupID, Members: map[string]*hostedMember{}}
}

func (g *groupState) encode() ([]byte, error) {
	g.V = stateVersion
	b, err := msgpack.Marshal(g)
	if err != nil {
		return nil, fmt.Errorf("encode group state: %w", err)
	}
	return b, nil
}

func decodeGroupState(b []byte) (*groupState, error) {
	var g groupState
	if err := schema.UnmarshalMsgpack(b, &g); err != nil {
		return nil, fmt.Errorf("decode group state: %w", err)
	}
	if g.V < 1 || g.V > stateVersion {
		return nil, fmt.Errorf("decode group state: unknown version %d", g.V)
	}
	if g.Members == nil {
		g.Members = map[string]*hostedMember{}
	}
	for id, m := range g.Members {
		if m == nil || m.ClientID != id {
			return nil, errors.New("decode group state: member entry does not match its client id")
		}
	}
	return &g, nil
}

// clone returns a deep copy, so a failed transaction leaves the cached state
// untouched.
func (g *groupState) clone() (*groupState, error) {
	b, err := g.encode()
	if err != nil {
		return nil, err
	}
	return decodeGroupState(b)
}

// active returns the members that take input, in client id order so that
// processing and event ids do not depend on map order.
func (g *groupState) active() []*hostedMember {
	all := g.byClientID()
	out := make([]*hostedMember, 0, len(all))
	for _, m := range all {
		if !m.Removed {
			out = append(out, m)
		}
	}
	return out
}

// byClientID returns Members in client id order. A member is never taken
// out of Members (a removed one stays, Removed set), so the order is kept
// while their number is the same: this runs several times per input, for
// every hosted member.
func (g *groupState) byClientID() []*hostedMember {
	if len(g.sorted) != len(g.Members) {
		g.sorted = g.sorted[:0]
		for _, id := range slices.Sorted(maps.Keys(g.Members)) {
			g.sorted = append(g.sorted, g.Members[id])
		}
	}
	return g.sorted
}

// host makes m the hosted member of its client id, in place of any earlier
// one of that id.
func (g *groupState) host(m *hostedMember) {
	g.Members[m.ClientID] = m
	g.sorted = nil
}

// following returns the members whose convergence state takes input: the
// active ones, then the removed ones still Retained, each in client id
// order.
func (g *groupState) following() []*hostedMember {
	out := g.active()
	for _, m := range g.byClientID() {
		if m.Removed && m.Retained {
			out = append(out, m)
		}
	}
	return out
}

func (g *groupState) leaveRequested(inbox string) bool {
	return slices.Contains(g.LeaveRequests, inbox)
}

func (g *groupState) addLeaveRequest(inbox string) {
	if !g.leaveRequested(inbox) {
		g.LeaveRequests = append(g.LeaveRequests, inbox)
		slices.Sort(g.LeaveRequests)
	}
}

// holds reports whether member m holds message s: it was sent after m
// joined, or by m itself.
func (m *hostedMember) holds(s *storedMessage) bool {
	return s.Seq > m.JoinedSeq || bytes.Equal(s.SenderInstallation, m.Installation)
}

// nextExpiry is when the group next needs a pass without input: the
// earliest head of its expiry queues or a due convergence pass, or 0.
func (g *groupState) nextExpiry() int64 {
	next := g.Due
	for _, q := range g.Expiry {
		if q.Head != 0 && (next == 0 || q.Head < next) {
			next = q.Head
		}
	}
	return next
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// blobKey names a fresh fabric-converge key for a state blob of the group:
// <tenant>.<group>.s.<nonce> for the group state, <tenant>.<group>.m.
// <client>.<nonce> for a member's engine state. The nonce makes every write
// its own key, so a blob that a checkpoint names is never overwritten by a
// worker that lost the fence.
func blobKey(tenant string, groupHex string, client string) (string, error) {
	if client == "" {
		return freshKey(tenant, groupHex, "s")
	}
	return freshKey(tenant, groupHex, "m", client)
}

// freshKey is <tenant>.<parts…>.<nonce>, a key no other write uses.
func freshKey(tenant string, parts ...string) (string, error) {
	var n [12]byte
	if _, err := rand.Read(n[:]); err != nil {
		return "", fmt.Errorf("blob nonce: %w", err)
	}
	return subject.Key(tenant, append(parts, hex.EncodeToString(n[:]))...)
}
