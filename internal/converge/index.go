package converge

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/converge/project"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// The message index is stored, not held: every message a group holds has
// an entry on <checkpoint subject>.m.<message id hex> in FABRIC_EVENTS,
// written in the atomic batch of the transaction that indexed it, behind
// the same fence as its checkpoint (never ahead of it, never by a worker
// that lost the group). No bound of memory decides what a reply, a
// deletion or an expiry finds (EVENT-021, PROC-037, META-063). An entry
// is replaced by a rollup of its subject; a message deleted, expired or
// withdrawn is removed by a rollup with an empty body that expires a
// second later, so the subject is empty: an absent entry is a message the
// group does not hold.
//
// Expiry is found without reading every entry: each transaction appends
// one page per disappearing-messages duration, its entries sorted by
// expiry, on <checkpoint subject>.x.<seconds>. Within one duration, pages
// follow stream time, so each is a queue read from its head
// (groupState.Expiry). The first page written after a queue consumed every
// stored page rolls up its subject, removing the consumed ones: converge
// purges nothing (issue 27, its user may not).
const (
	entryToken = "m"
	pageToken  = "x"
	// removedTTL is how long the empty rollup that removes an entry stays.
	removedTTL = "1s"
)

// expiryEntry is one message of an expiry page.
type expiryEntry struct {
	ID        []byte `msgpack:"id"`
	ExpiresAt int64  `msgpack:"expires_at"`
}

// expiryQueue is where the cleanup pass stands in the pages of one
// duration.
type expiryQueue struct {
	Secs uint64 `msgpack:"secs"`
	// Seq is the stream sequence the next page is read from (the page
	// being consumed, or a later one); Offset counts the entries of that
	// page already consumed.
	Seq    uint64 `msgpack:"seq"`
	Offset int    `msgpack:"offset,omitempty"`
	// Head is the earliest expiry the queue may hold (unix ms), 0 when it
	// holds none.
	Head int64 `msgpack:"head,omitempty"`
}

// legacySecs names the queue of the entries of an index stored before
// version 3, whose durations are not known: one page sorted by expiry.
const legacySecs = 0

// indexWrites are the index changes of one transaction, by message id: an
// entry to store, or nil to remove it; and the expiry entries to append,
// by duration, with the durations whose queue holds no page before them
// (drained: their page rolls up the subject).
type indexWrites struct {
	entries map[string]*storedMessage
	order   []string
	pages   map[uint64][]expiryEntry
	drained map[uint64]bool
}

func (x *indexWrites) set(id []byte, s *storedMessage) {
	if x.entries == nil {
		x.entries = map[string]*storedMessage{}
	}
	k := string(id)
	if _, ok := x.entries[k]; !ok {
		x.order = append(x.order, k)
	}
	x.entries[k] = s
}

// size is how many messages the writes add to a batch.
func (x *indexWrites) size() int { return len(x.order) + len(x.pages) }

// indexedID reports whether id can have an entry: message ids are SHA-256
// hashes; a reference of any other length names nothing the group holds.
func indexedID(id []byte) bool { return len(id) == sha256.Size }

// message finds what the group holds under id: this transaction's writes,
// then those of transactions whose batches are not known stored yet, then
// the stored index. nil when it holds no such message. A read that fails
// fails the transaction (t.err).
func (t *txn) message(id []byte) *storedMessage {
	if !indexedID(id) {
		return nil
	}
	k := string(id)
	if s, ok := t.ix.entries[k]; ok {
		return s
	}
	for i := len(t.g.unstored) - 1; i >= 0; i-- {
		if s, ok := t.g.unstored[i].entries[k]; ok {
			return s
		}
	}
	if s, ok := t.fetched[k]; ok {
		return s
	}
	if t.read == nil {
		return nil
	}
	s, err := t.read(id)
	if err != nil {
		t.fail(err)
		return nil
	}
	return s
}

// prefetchReads bounds the index reads prefetch has in flight.
const prefetchReads = 32

// prefetch reads the stored entries of ids at once, for message to find:
// the cleanup pass reads one entry per message it expires, and one after
// another they would cost a round trip each. The stored index does not
// change under a transaction but by its own writes, which message reads
// first.
func (t *txn) prefetch(ids [][]byte) error {
	if t.read == nil {
		return nil
	}
	out := make([]*storedMessage, len(ids))
	errs := make([]error, len(ids))
	sem := make(chan struct{}, prefetchReads)
	var wg sync.WaitGroup
	for i, id := range ids {
		if !indexedID(id) {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i], errs[i] = t.read(id)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if t.fetched == nil {
		t.fetched = map[string]*storedMessage{}
	}
	for i, id := range ids {
		t.fetched[string(id)] = out[i]
	}
	return nil
}

// fail records the first error of a read the transaction depends on.
func (t *txn) fail(err error) {
	if t.err == nil {
		t.err = err
	}
}

// index stores a delivered message; secs is its disappearing-messages
// duration, 0 for none.
func (t *txn) index(s storedMessage, secs uint64) {
	if !indexedID(s.ID) {
		return
	}
	t.ix.set(s.ID, &s)
	if s.ExpiresAt == 0 {
		return
	}
	if t.ix.pages == nil {
		t.ix.pages, t.ix.drained = map[uint64][]expiryEntry{}, map[uint64]bool{}
	}
	q := t.g.queue(secs)
	if _, ok := t.ix.pages[secs]; !ok && q.Head == 0 && !t.unstoredPage(secs) {
		t.ix.drained[secs] = true
	}
	t.ix.pages[secs] = append(t.ix.pages[secs], expiryEntry{ID: s.ID, ExpiresAt: s.ExpiresAt})
	if q.Head == 0 || s.ExpiresAt < q.Head {
		q.Head = s.ExpiresAt
	}
}

// unstoredPage reports whether a transaction whose batch is not known
// stored yet appends a page of duration secs: its queue holds that page,
// whatever its head says.
func (t *txn) unstoredPage(secs uint64) bool {
	for _, x := range t.g.unstored {
		if _, ok := x.pages[secs]; ok {
			return true
		}
	}
	return false
}

// unindex removes a message from the index: deleted, expired or withdrawn.
func (t *txn) unindex(id []byte) {
	if indexedID(id) {
		t.ix.set(id, nil)
	}
}

// queue returns the expiry queue of a duration, made when missing.
func (g *groupState) queue(secs uint64) *expiryQueue {
	for i := range g.Expiry {
		if g.Expiry[i].Secs == secs {
			return &g.Expiry[i]
		}
	}
	g.Expiry = append(g.Expiry, expiryQueue{Secs: secs, Seq: 1})
	slices.SortFunc(g.Expiry, func(a, b expiryQueue) int { return cmp.Compare(a.Secs, b.Secs) })
	return g.queue(secs)
}

// indexMsgs are the batch messages that store a transaction's index
// writes, in the order they were made.
func indexMsgs(tenant, groupHex string, x *indexWrites) ([]*nats.Msg, error) {
	if x.size() == 0 {
		return nil, nil
	}
	ck, err := subject.Checkpoint(tenant, groupHex)
	if err != nil {
		return nil, err
	}
	out := make([]*nats.Msg, 0, x.size())
	for _, k := range x.order {
		m := nats.NewMsg(ck + "." + entryToken + "." + hex.EncodeToString([]byte(k)))
		m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
		if s := x.entries[k]; s != nil {
			if m.Data, err = msgpack.Marshal(s); err != nil {
				return nil, fmt.Errorf("encode index entry: %w", err)
			}
			m.Header.Set(jetstream.MsgTTLHeader, streams.CheckpointTTL)
		} else {
			m.Header.Set(jetstream.MsgTTLHeader, removedTTL)
		}
		out = append(out, m)
	}
	for _, secs := range slices.Sorted(maps.Keys(x.pages)) {
		page := x.pages[secs]
		slices.SortStableFunc(page, func(a, b expiryEntry) int { return cmp.Compare(a.ExpiresAt, b.ExpiresAt) })
		m := nats.NewMsg(pageSubject(ck, secs))
		if m.Data, err = msgpack.Marshal(page); err != nil {
			return nil, fmt.Errorf("encode expiry page: %w", err)
		}
		m.Header.Set(jetstream.MsgTTLHeader, streams.CheckpointTTL)
		if x.drained[secs] {
			m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
		}
		out = append(out, m)
	}
	return out, nil
}

func pageSubject(ck string, secs uint64) string {
	return ck + "." + pageToken + "." + strconv.FormatUint(secs, 10)
}

// readEntry reads a message's stored index entry; nil when there is none.
func (w *Worker) readEntry(ctx context.Context, tenant, groupHex string, id []byte) (*storedMessage, error) {
	ck, err := subject.Checkpoint(tenant, groupHex)
	if err != nil {
		return nil, err
	}
	seq, b, err := bus.ReadMsg(ctx, w.js, ck+"."+entryToken+"."+hex.EncodeToString(id), 0)
	if err != nil {
		return nil, fmt.Errorf("read index entry: %w", err)
	}
	if seq == 0 || len(b) == 0 {
		return nil, nil
	}
	return decodeEntry(b)
}

func decodeEntry(b []byte) (*storedMessage, error) {
	var s storedMessage
	if err := schema.UnmarshalMsgpack(b, &s); err != nil {
		return nil, fmt.Errorf("decode index entry: %w", err)
	}
	return &s, nil
}

// decodePage reads an expiry page; its entries must be sorted by expiry,
// as the cleanup pass reads them.
func decodePage(b []byte) ([]expiryEntry, error) {
	var page []expiryEntry
	if err := schema.UnmarshalMsgpack(b, &page); err != nil {
		return nil, fmt.Errorf("decode expiry page: %w", err)
	}
	if !slices.IsSortedFunc(page, func(a, b expiryEntry) int { return cmp.Compare(a.ExpiresAt, b.ExpiresAt) }) {
		return nil, errors.New("decode expiry page: not sorted by expiry")
	}
	return page, nil
}

// readPage reads the first expiry page of a duration at or after sequence
// from; seq 0 when there is none.
func (w *Worker) readPage(ctx context.Context, tenant, groupHex string, secs, from uint64) ([]expiryEntry, uint64, error) {
	ck, err := subject.Checkpoint(tenant, groupHex)
	if err != nil {
		return nil, 0, err
	}
	seq, b, err := bus.ReadMsg(ctx, w.js, pageSubject(ck, secs), max(from, 1))
	if err != nil || seq == 0 {
		return nil, 0, err
	}
	page, err := decodePage(b)
	if err != nil {
		return nil, 0, err
	}
	return page, seq, nil
}

// expire is the cleanup pass under disappearing messages (META-063): every
// message whose expiry has passed is removed from the index, with
// message.expired for each member that holds it. It stops before the
// transaction's batch would hold more than budget messages; what is left
// stays due.
func (t *txn) expire(read func(secs, from uint64) ([]expiryEntry, uint64, error), budget int) (bool, error) {
	expired := false
	per := len(t.g.active()) + 1
	for i := range t.g.Expiry {
		q := &t.g.Expiry[i]
		for q.Head != 0 && q.Head <= t.now {
			page, seq, err := read(q.Secs, q.Seq)
			if err != nil {
				return expired, err
			}
			if seq == 0 {
				q.Head, q.Offset = 0, 0
				break
			}
			if seq != q.Seq {
				q.Seq, q.Offset = seq, 0
			}
			var due [][]byte
			for _, e := range page[q.Offset:] {
				if e.ExpiresAt > t.now || t.size()+per*(len(due)+1) > budget {
					break
				}
				due = append(due, e.ID)
			}
			if err := t.prefetch(due); err != nil {
				return expired, err
			}
			for q.Offset < len(page) && page[q.Offset].ExpiresAt <= t.now {
				if t.size()+per > budget {
					return expired, nil
				}
				e := page[q.Offset]
				q.Offset++
				s := t.message(e.ID)
				if t.err != nil {
					return expired, t.err
				}
				// A message deleted before, or delivered again since
				// with another expiry, is not this entry's.
				if s == nil || s.ExpiresAt != e.ExpiresAt {
					continue
				}
				t.retire(s, readmodel.StateExpired, "")
				t.unindex(e.ID)
				expired = true
				cause := append([]byte("expired:"), e.ID...)
				for _, m := range t.g.active() {
					if m.holds(s) {
						t.emit(m.ClientID, cause, project.Expired(t.g.GroupID, e.ID))
					}
				}
			}
			if q.Offset < len(page) {
				q.Head = page[q.Offset].ExpiresAt
				break
			}
			q.Seq, q.Offset = seq+1, 0
			next, nseq, err := read(q.Secs, q.Seq)
			if err != nil {
				return expired, err
			}
			q.Head = 0
			if nseq != 0 && len(next) > 0 {
				q.Head = next[0].ExpiresAt
			}
		}
	}
	return expired, nil
}

// size is how many messages the transaction's batch holds so far, its
// checkpoint aside.
func (t *txn) size() int { return t.events.len() + t.ix.size() + t.rd.size() }

// The index before version 3 was kept whole in the group state, its full
// chunks of messageChunkLen entries in blobs of their own (checkpoint
// Chunks). It is still read, and moved into the stored index (migrate)
// before the group's first transaction.
const messageChunkLen = 128

// messageChunk is the stored form of one full chunk of a version 2 index.
type messageChunk struct {
	First    uint64          `msgpack:"first"`
	Messages []storedMessage `msgpack:"messages"`
}

// chunkRef names the blob of chunk N of a version 2 index.
type chunkRef struct {
	N   uint64 `msgpack:"n"`
	Key string `msgpack:"key"`
}

// loadLegacyIndex puts the chunks refs names back in front of the inline
// entries of g, a version 2 group state as stored; get reads a blob.
func (g *groupState) loadLegacyIndex(refs []chunkRef, get func(key string) ([]byte, error)) error {
	if len(refs) == 0 {
		return nil
	}
	first := g.MessageBase / messageChunkLen
	var msgs []storedMessage
	for i, r := range refs {
		c := first + uint64(i)
		if r.N != c {
			return fmt.Errorf("load message index: chunk %d where %d belongs", r.N, c)
		}
		b, err := get(r.Key)
		if err != nil {
			return fmt.Errorf("load message chunk %d: %w", c, err)
		}
		var mc messageChunk
		if err := schema.UnmarshalMsgpack(b, &mc); err != nil {
			return fmt.Errorf("decode message chunk %d: %w", c, err)
		}
		end := mc.First + uint64(len(mc.Messages))
		if mc.First < c*messageChunkLen || mc.First > max(c*messageChunkLen, g.MessageBase) || end != (c+1)*messageChunkLen {
			return fmt.Errorf("decode message chunk %d: holds ordinals %d to %d", c, mc.First, end)
		}
		msgs = append(msgs, mc.Messages[max(g.MessageBase, mc.First)-mc.First:]...)
	}
	g.Messages = append(msgs, g.Messages...)
	return nil
}

// migrateIndex stores the entries of a group state's version 2 index (its
// Messages, read whole) and one expiry page of those awaiting expiry, and
// leaves the state without them. Each write expects its subject empty, so
// a second migration of the same state (a crash before its transaction
// committed) or a worker that lost the group writes nothing over what a
// later transaction stored.
func (w *Worker) migrateIndex(ctx context.Context, tenant, groupHex string, g *groupState) error {
	if len(g.Messages) == 0 {
		return nil
	}
	ck, err := subject.Checkpoint(tenant, groupHex)
	if err != nil {
		return err
	}
	var page []expiryEntry
	var futures []jetstream.PubAckFuture
	put := func(subj string, v any) error {
		m := nats.NewMsg(subj)
		b, err := msgpack.Marshal(v)
		if err != nil {
			return fmt.Errorf("migrate index: %w", err)
		}
		m.Data = b
		m.Header.Set(jetstream.MsgTTLHeader, streams.CheckpointTTL)
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
		f, err := w.js.PublishMsgAsync(m)
		if err != nil {
			return fmt.Errorf("migrate index: %w", err)
		}
		futures = append(futures, f)
		return nil
	}
	for _, s := range g.Messages {
		if s.Deleted || !indexedID(s.ID) {
			continue
		}
		if err := put(ck+"."+entryToken+"."+hex.EncodeToString(s.ID), s); err != nil {
			return err
		}
		if s.ExpiresAt != 0 {
			page = append(page, expiryEntry{ID: s.ID, ExpiresAt: s.ExpiresAt})
		}
	}
	if len(page) > 0 {
		slices.SortStableFunc(page, func(a, b expiryEntry) int { return cmp.Compare(a.ExpiresAt, b.ExpiresAt) })
		if err := put(pageSubject(ck, legacySecs), page); err != nil {
			return err
		}
		g.queue(legacySecs).Head = page[0].ExpiresAt
	}
	for _, f := range futures {
		if err := awaitAck(ctx, f); err != nil {
			var apiErr *jetstream.APIError
			if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
				return fmt.Errorf("migrate index: %w", err)
			}
		}
	}
	g.Messages, g.MessageBase = nil, 0
	return nil
}
