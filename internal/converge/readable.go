package converge

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/converge/project"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// The readable state of the group (internal/bus/readmodel, docs/read-api.md)
// is written in the transaction's own atomic batch, beside its events, so
// a read issued once an event arrived sees the change (EVENT-010): each
// delivered message's record (content sealed under the tenant's key) and
// the pointer from its id; a message deleted, expired or withdrawn has
// its record replaced by one without content; the conversation record of
// every client the transaction emitted to; and the group's members when
// anything but a message changed.

// readWrites are the readable records of one transaction.
type readWrites struct {
	msgs []readMsg
	// clients are the clients whose conversation records are written, in
	// the order they were touched; allActive adds every active member
	// (a message was delivered), of the group's groupMembers.
	clients      []string
	touched      map[string]bool
	allActive    bool
	groupMembers int
	members      bool
}

// readMsg is one message record to write; plain is the content to seal,
// pointer whether the id's pointer is written too (a new delivery).
type readMsg struct {
	rec     readmodel.Message
	plain   []byte
	pointer bool
}

// size is how many messages the records add to the batch: a client's
// conversation record, and a DM's sibling record, each message's record and
// pointer, the roster.
func (r *readWrites) size() int {
	n := 2 * len(r.clients)
	if r.allActive {
		n = 2 * r.groupMembers
	}
	for _, m := range r.msgs {
		n++
		if m.pointer {
			n++
		}
	}
	if r.members {
		n++
	}
	return n
}

// touch notes a client the transaction emitted to: its conversation
// record is written again.
func (r *readWrites) touch(client string) {
	if !r.touched[client] {
		if r.touched == nil {
			r.touched = map[string]bool{}
		}
		r.touched[client] = true
		r.clients = append(r.clients, client)
	}
}

// record keeps a delivered message's record.
func (t *txn) record(s storedMessage, ct *schema.ContentTypeID, plaintext []byte) {
	if !indexedID(s.ID) {
		return
	}
	t.rd.msgs = append(t.rd.msgs, readMsg{rec: readmodel.Message{
		N: s.N, ID: s.ID, GroupID: t.g.GroupID, SenderInboxID: s.SenderInboxID, SenderInstallation: s.SenderInstallation,
		Seq: s.Seq, SentAt: s.At, ExpiresAt: s.ExpiresAt, State: readmodel.StateDelivered, ContentType: ct,
	}, plain: plaintext, pointer: true})
	// The group's activity is every member's, its sender's too, which
	// gets no event of its own message.
	t.rd.allActive, t.rd.groupMembers = true, len(t.g.Members)
}

// retire replaces a message's record by one without its content: deleted
// (by), expired or invalidated by a rollback. The content is gone from
// storage, not hidden.
func (t *txn) retire(s *storedMessage, state readmodel.MessageState, by string) {
	if s.N == 0 {
		return // indexed before records were kept: it has none
	}
	rec := readmodel.Message{
		N: s.N, ID: s.ID, GroupID: t.g.GroupID, SenderInboxID: s.SenderInboxID, SenderInstallation: s.SenderInstallation,
		Seq: s.Seq, SentAt: s.At, ExpiresAt: s.ExpiresAt, State: state, DeletedBy: by,
	}
	for i := range t.rd.msgs {
		if t.rd.msgs[i].rec.N == s.N {
			t.rd.msgs[i].rec, t.rd.msgs[i].plain = rec, nil
			return
		}
	}
	t.rd.msgs = append(t.rd.msgs, readMsg{rec: rec})
}

// readableMsgs are the batch messages of a transaction's readable
// records.
func (w *Worker) readableMsgs(ctx context.Context, g *loadedGroup, t *txn) ([]*nats.Msg, error) {
	for e := range t.events.all() {
		if !messageKind(e.Event.ClientEvent.Kind) {
			t.rd.members = true
			break
		}
	}
	if t.rd.allActive {
		for _, m := range t.g.active() {
			t.rd.touch(m.ClientID)
		}
	}
	if len(t.rd.msgs) == 0 && len(t.rd.clients) == 0 {
		return nil, nil
	}
	out := make([]*nats.Msg, 0, t.rd.size())
	put := func(subj string, v any) error {
		m, err := readmodel.RecordMsg(subj, v)
		if err == nil {
			out = append(out, m)
		}
		return err
	}
	// A message's records go after MessageRetention (when set); a new
	// one's subject is new (delivery numbers are not reused; a pointer is
	// repointed only by a delivery after a rollback, and read last), so
	// only a record that replaces one is a rollup.
	putMessage := func(subj string, v any, replaces bool) error {
		m, err := readmodel.RecordMsgTTL(subj, v, w.cfg.MessageRetention, replaces)
		if err == nil {
			out = append(out, m)
		}
		return err
	}
	var sealer *readmodel.Sealer
	for _, m := range t.rd.msgs {
		rec := m.rec
		if m.plain != nil {
			if sealer == nil {
				var err error
				if sealer, err = w.sealers.get(ctx, w, g.tenant); err != nil {
					return nil, err
				}
			}
			if sealer != nil {
				var err error
				if rec.Content, err = sealer.Seal(rec.GroupID, rec.N, m.plain); err != nil {
					return nil, err
				}
			}
		}
		subj, err := readmodel.MessageSubject(g.tenant, g.groupHex, rec.N)
		if err != nil {
			return nil, err
		}
		if err := putMessage(subj, rec, !m.pointer); err != nil {
			return nil, err
		}
		if m.pointer {
			ps, err := readmodel.PointerSubject(g.tenant, rec.ID)
			if err != nil {
				return nil, err
			}
			if err := putMessage(ps, readmodel.Pointer{GroupID: rec.GroupID, N: rec.N}, false); err != nil {
				return nil, err
			}
		}
	}
	inboxes, installations, err := t.roster(g, put)
	if err != nil {
		return nil, err
	}
	comps := t.g.components()
	dmKey := dmConversationKey(comps)
	floor, paused := project.Paused(comps)
	if !paused {
		floor = ""
	}
	for _, c := range t.rd.clients {
		m := t.g.Members[c]
		if m == nil {
			continue
		}
		subj, err := readmodel.ConversationSubject(g.tenant, g.groupHex, c)
		if err != nil {
			return nil, err
		}
		rec := readmodel.Conversation{
			GroupID: t.g.GroupID, ClientID: c, InboxID: m.InboxID, Installation: m.Installation,
			Components: t.g.Components, Epoch: t.g.Epoch, DMKey: dmKey, PausedFloor: floor, Forked: m.Forked,
			Removed: m.Removed, FirstN: m.FirstN, LastN: m.LastN, JoinedSeq: m.JoinedSeq,
			Inboxes: inboxes, Installations: installations, Delivered: t.g.Delivered, Activity: t.now,
		}
		if err := put(subj, rec); err != nil {
			return nil, err
		}
		if dmKey == nil {
			continue
		}
		ss, err := readmodel.SiblingSubject(g.tenant, dmKey, c, g.groupHex)
		if err != nil {
			return nil, err
		}
		if err := put(ss, readmodel.Sibling{GroupID: t.g.GroupID, Removed: m.Removed}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// roster counts the canonical members and, when anything but a message
// changed, writes the group's members record; a transaction of messages
// only uses the counts the group state keeps. The roster is the state of
// the first active member at the canonical epoch.
func (t *txn) roster(g *loadedGroup, put func(string, any) error) (int, int, error) {
	if !t.rd.members && t.g.RosterInboxes > 0 {
		return t.g.RosterInboxes, t.g.RosterInstallations, nil
	}
	var leaves []Leaf
	for _, m := range t.g.active() {
		if st := t.members[m.ClientID]; st != nil && st.Epoch() == t.g.Epoch {
			leaves = st.Leaves()
			break
		}
	}
	if b, ok := t.members[sharedKey].(*branchState); leaves == nil && ok && b.st != nil && b.st.Epoch() == t.g.Epoch {
		leaves = b.Leaves()
	}
	byInbox := map[string][][]byte{}
	for _, l := range leaves {
		byInbox[l.InboxID] = append(byInbox[l.InboxID], l.InstallationKey)
	}
	if t.rd.members && len(leaves) > 0 {
		rec := readmodel.Members{Epoch: t.g.Epoch}
		for _, inbox := range slices.Sorted(maps.Keys(byInbox)) {
			keys := byInbox[inbox]
			slices.SortFunc(keys, func(a, b []byte) int { return slices.Compare(a, b) })
			rec.Members = append(rec.Members, readmodel.Member{InboxID: inbox, Installations: keys})
		}
		subj, err := readmodel.MembersSubject(g.tenant, g.groupHex)
		if err != nil {
			return 0, 0, err
		}
		if err := put(subj, rec); err != nil {
			return 0, 0, err
		}
	}
	t.g.RosterInboxes, t.g.RosterInstallations = len(byInbox), len(leaves)
	return len(byInbox), len(leaves), nil
}

// messageKind reports whether an event kind reports only messages: the
// members record stays as it was.
func messageKind(k schema.EventKind) bool {
	switch k {
	case schema.KindMessageReceived, schema.KindMessageDeleted, schema.KindMessageExpired, schema.KindMessageInvalidated:
		return true
	}
	return false
}

// sealerCacheTTL is how long a tenant's sealer is used before its key is
// read again: a dropped tenant key stops sealing new content within it.
const sealerCacheTTL = 10 * time.Second

// sealers caches each tenant's content sealer.
type sealers struct {
	mu sync.Mutex
	m  map[string]cachedSealer
}

type cachedSealer struct {
	s  *readmodel.Sealer
	at time.Time
}

// get returns the tenant's sealer, making its key when it has none; nil
// without a vault (no content is stored).
func (c *sealers) get(ctx context.Context, w *Worker, tenant string) (*readmodel.Sealer, error) {
	if w.vault == nil {
		return nil, nil
	}
	now := time.Now()
	c.mu.Lock()
	e, ok := c.m[tenant]
	c.mu.Unlock()
	if ok && now.Sub(e.at) < sealerCacheTTL {
		return e.s, nil
	}
	salt, err := readmodel.TenantSalt(ctx, w.dir.kv, tenant, true)
	if err != nil {
		return nil, err
	}
	s, err := readmodel.NewSealer(w.vault, tenant, salt)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]cachedSealer{}
	}
	c.m[tenant] = cachedSealer{s: s, at: now}
	c.mu.Unlock()
	return s, nil
}
