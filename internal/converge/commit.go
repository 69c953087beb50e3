package converge

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// transact runs body over a group and commits its result: state blobs
// first, then the events and the checkpoint in one fenced atomic batch,
// then the outcome records and the group's KV entries. body sees the group
// as of its newest checkpoint (an input at or below its input_seq is done:
// exactly once, EVENT-001) and reports whether it changed anything; nothing
// changed commits nothing. A lost fence reloads the group and runs body
// again.
func (w *Worker) transact(ctx context.Context, part *partition, tenant, groupHex string, body func(context.Context, *txn, *loadedGroup) (bool, error)) error {
	key := tenant + "." + groupHex
	for attempt := 0; attempt < commitAttempts; attempt++ {
		g, err := w.load(ctx, part, tenant, groupHex)
		if err != nil {
			return err
		}
		t := w.newTxn(ctx, tenant, g)
		changed, err := body(ctx, t, g)
		if err == nil {
			err = t.err
		}
		if err != nil || !changed {
			delete(part.groups, key) // the body may have moved ratchets
			return err
		}
		next, events, ix, written, err := w.prepare(ctx, g, t)
		if err != nil {
			delete(part.groups, key)
			w.purge(ctx, written)
			return err
		}
		var ckSeq uint64
		if w.fits(events, ix) {
			ckSeq, err = commitBatch(ctx, w.js, w.cfg.MaxBatch, tenant, groupHex, g.ckSeq, next, events, ix)
		} else {
			var first []*nats.Msg
			var more []string
			first, more, err = w.spill(ctx, tenant, groupHex, &next, events, ix)
			written = append(written, more...)
			if err != nil {
				delete(part.groups, key)
				w.purge(ctx, written)
				return err
			}
			ckSeq, err = commitBatch(ctx, w.js, w.cfg.MaxBatch, tenant, groupHex, g.ckSeq, next, nil, first)
		}
		err = w.cfg.hooks.onBatchAck(t.name, err)
		delete(part.groups, key)
		if duplicate(err) {
			// A duplicate event id: the fence moved when an earlier
			// attempt stored this batch; else another write stored
			// those events, which no retry mends (handleRun).
			if seq, _, cerr := bus.LastCheckpoint(ctx, w.js, tenant, groupHex); cerr == nil && seq != g.ckSeq {
				err = fmt.Errorf("%w: %w", ErrFenced, err)
			}
		}
		if err != nil && !errors.Is(err, ErrFenced) {
			// The batch may have been stored even so (a lost ack): the
			// blobs stay, for the checkpoint that may name them.
			return err
		}
		if err != nil {
			w.metrics.Fenced.Inc()
			w.purge(ctx, w.unnamed(ctx, tenant, groupHex, written))
			continue
		}
		w.metrics.Batches.WithLabelValues("1").Inc()
		// When what follows the batch fails (an outcome record, the
		// group's entries), the group is loaded again from its
		// checkpoint: an input's retry finds the transaction done and
		// publishes them again; for a cleanup pass, the load does.
		ow, err := w.committed(ctx, part, g, t, next, ckSeq, events)
		if err != nil {
			delete(part.groups, key)
			return err
		}
		if lg := part.groups[key]; lg != nil {
			if err := w.drain(ctx, part, lg); err != nil {
				return err
			}
		}
		if err := ow.await(ctx); err != nil {
			delete(part.groups, key)
			return err
		}
		return nil
	}
	return fmt.Errorf("converge: transaction fenced %d times", commitAttempts)
}

// newTxn starts a transaction over a loaded group.
func (w *Worker) newTxn(ctx context.Context, tenant string, g *loadedGroup) *txn {
	return &txn{
		tenant: tenant, g: g.state, members: g.members, chunks: maps.Clone(g.chunks),
		dirty: map[string]bool{}, ratchet: map[string]bool{}, now: w.cfg.Now().UnixMilli(), mls: w.cfg.MLS, dir: w.dir,
		read: func(id []byte) (*storedMessage, error) {
			return w.readEntry(ctx, tenant, g.groupHex, id)
		},
	}
}

// prepare writes the state blobs of a transaction and builds its checkpoint,
// its events and the messages of its index writes. Nothing it writes is
// current until the checkpoint commits; it returns the keys it wrote, so a
// failed commit can remove them.
func (w *Worker) prepare(ctx context.Context, g *loadedGroup, t *txn) (checkpoint, []bus.Event, []*nats.Msg, []string, error) {
	next := checkpoint{InputSeq: g.ck.InputSeq, Txn: t.name, Members: map[string]string{}, Outcomes: t.notes, Consumed: t.consumed, Worker: w.cfg.WorkerID}
	if t.inputSeq != 0 {
		next.InputSeq = t.inputSeq
	}
	var save []string
	for _, id := range t.storedStates() {
		bk, ok := g.ck.Members[id]
		dirty := t.dirty[id] || !ok
		if m := t.g.Members[id]; m != nil && !dirty && t.ratchet[id] {
			// A ratchet advance alone may wait: an older snapshot ratchets
			// forward to any later message (RFC 9420 section 9.1).
			m.Unsaved++
			dirty = m.Unsaved >= w.cfg.SnapshotEvery
		}
		if dirty {
			if m := t.g.Members[id]; m != nil {
				m.Unsaved = 0
			}
			save = append(save, id)
			continue
		}
		next.Members[id] = bk
		if keys := g.ck.MemberChunks[id]; len(keys) > 0 {
			next.setMemberChunks(id, keys)
		}
	}
	// Members' snapshots are independent of each other: taken and sealed
	// in parallel (a member of a large group takes about a millisecond).
	snaps := make([]memberSnapshot, len(save))
	errs := make([]error, len(save))
	parallel(len(save), func(i int) {
		c := save[i]
		if snaps[i], errs[i] = w.snapshotMember(g, c, t.members[c], t.chunks[c]); errs[i] != nil {
			errs[i] = fmt.Errorf("snapshot member: %w", errs[i])
		}
	})
	if err := errors.Join(errs...); err != nil {
		return checkpoint{}, nil, nil, nil, err
	}
	blobs := make(map[string][]byte, len(save)+1)
	for i, id := range save {
		s := snaps[i]
		next.Members[id] = s.key
		maps.Copy(blobs, s.blobs)
		if len(s.chunks) > 0 {
			t.chunks[id] = s.chunks
			keys := make([]string, len(s.chunks))
			for k, c := range s.chunks {
				keys[k] = c.key
			}
			next.setMemberChunks(id, keys)
		} else {
			delete(t.chunks, id)
		}
	}
	t.stampLeaves()
	// The group state goes last: the loop above counts unsaved ratchets.
	sb, err := t.g.encode()
	if err != nil {
		return checkpoint{}, nil, nil, nil, err
	}
	if next.State, err = blobKey(g.tenant, g.groupHex, ""); err != nil {
		return checkpoint{}, nil, nil, nil, err
	}
	blobs[next.State] = sb
	ix, err := indexMsgs(g.tenant, g.groupHex, &t.ix)
	if err != nil {
		return checkpoint{}, nil, nil, nil, err
	}
	rd, err := w.readableMsgs(ctx, g, t)
	if err != nil {
		return checkpoint{}, nil, nil, nil, err
	}
	ix = append(ix, rd...)
	// Outbound messages and operation records are stored with the
	// checkpoint, behind the same fence: sent exactly once (issue 19).
	ix = append(ix, t.out...)
	written, parts, err := w.putBlobs(ctx, blobs)
	if err != nil {
		return checkpoint{}, nil, nil, written, err
	}
	for _, k := range next.named() {
		if n := g.ck.Parts[k]; n > 0 && parts[k] == 0 {
			parts[k] = n // a blob kept from the checkpoint before
		}
	}
	if len(parts) > 0 {
		next.Parts = parts
	}
	next.NextExpiry = t.g.nextDue(w.cfg.SelfUpdateAfter)
	// A group that becomes hosted is made known to ingest before its
	// events are (EVENT-010): input sent right after conversation.joined
	// must not meet a group ingest does not know. The record carries the
	// fence's sequence, so the record written after the commit replaces it.
	if len(g.ck.Members) == 0 && len(t.g.active()) > 0 {
		if err := w.publishGroup(ctx, g.tenant, g.groupHex, t.g, g.ckSeq); err != nil {
			return checkpoint{}, nil, nil, written, err
		}
	}
	dmKey := dmConversationKey(t.g.components())
	events := make([]bus.Event, 0, t.events.len())
	for e := range t.events.all() {
		ev := bus.Event{
			Tenant:        g.tenant,
			ClientID:      e.Client,
			ID:            eventID(g.tenant, e.Client, e.Cause, e.Index),
			Event:         &e.Event.ClientEvent,
			ReferencesOwn: e.Event.ReferencesOwn,
		}
		if _, names := ev.Event.GroupID(); names && dmKey != nil {
			ev.ConversationKey = dmKey
		}
		events = append(events, ev)
	}
	if t.ix.size() > 0 {
		// Read by the next transactions until the batch is stored.
		t.g.unstored = append(t.g.unstored, &t.ix)
	}
	return next, events, ix, written, nil
}

// unnamed returns the keys of written that the group's newest checkpoint
// does not name: after a lost fence they belong to no state.
func (w *Worker) unnamed(ctx context.Context, tenant, groupHex string, written []string) []string {
	ck, _, err := readCheckpoint(ctx, w.js, tenant, groupHex)
	if err != nil {
		return nil // unsure: keep them
	}
	var out []string
	named := ck.named()
	for _, k := range written {
		if !slices.Contains(named, blobOf(k)) {
			out = append(out, k)
		}
	}
	return out
}

// purge removes state blobs no checkpoint names. It does not wait: a blob
// that stays is only space, never state.
func (w *Worker) purge(ctx context.Context, keys []string) {
	for _, k := range keys {
		m := nats.NewMsg(streams.KVSubject(streams.BucketConverge, k))
		m.Header.Set("KV-Operation", "PURGE")
		m.Header.Set("Nats-Rollup", "sub")
		if _, err := w.js.PublishMsgAsync(m); err != nil {
			w.log.Debug("converge: purge blob", "err", err)
		}
	}
}

// putBlobs writes state blobs to fabric-converge in parallel and waits for
// every acknowledgement. A blob larger than one message may be (a member of
// a large group with thousands of messages in its retained epochs) is
// written as parts, <key>.p0 … <key>.p<n-1>, with a manifest at <key>;
// parts counts them by key. It returns the keys written, parts included,
// also on failure.
func (w *Worker) putBlobs(ctx context.Context, blobs map[string][]byte) (written []string, parts map[string]int, err error) {
	futures := make([]jetstream.PubAckFuture, 0, len(blobs))
	parts = map[string]int{}
	var first error
	put := func(k string, b []byte) bool {
		f, err := w.js.PublishAsync(streams.KVSubject(streams.BucketConverge, k), b)
		if err != nil {
			first = fmt.Errorf("write state blob: %w", err)
			return false
		}
		written = append(written, k)
		futures = append(futures, f)
		return true
	}
write:
	for k, b := range blobs {
		if len(b) <= w.partBytes {
			if !put(k, b) {
				break
			}
			continue
		}
		n := (len(b) + w.partBytes - 1) / w.partBytes
		for i := range n {
			if !put(partKey(k, i), b[i*w.partBytes:min((i+1)*w.partBytes, len(b))]) {
				break write
			}
		}
		if !put(k, append([]byte(blobManifest), strconv.Itoa(n)...)) {
			break
		}
		parts[k] = n
	}
	for _, f := range futures {
		if err := awaitAck(ctx, f); err != nil && first == nil {
			first = fmt.Errorf("write state blob: %w", err)
		}
	}
	return written, parts, first
}

// blobManifest begins the value of a blob stored in parts; the part count
// follows in decimal. No whole blob begins so: a group state is a msgpack
// map, a member state is sealed or branch-prefixed.
const blobManifest = "fabric.blob-parts/1:"

// partKey is the key of part i of the blob at key.
func partKey(key string, i int) string { return key + ".p" + strconv.Itoa(i) }

// blobOf is the blob key a part key belongs to, or key itself.
func blobOf(key string) string {
	i := strings.LastIndex(key, ".p")
	if i < 0 {
		return key
	}
	if _, err := strconv.Atoi(key[i+2:]); err != nil {
		return key
	}
	return key[:i]
}

// getBlob reads a state blob, joining its parts when it was stored in
// parts.
func (w *Worker) getBlob(ctx context.Context, key string) ([]byte, error) {
	e, err := w.conv.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	v := e.Value()
	count, ok := bytes.CutPrefix(v, []byte(blobManifest))
	if !ok {
		return v, nil
	}
	n, err := strconv.Atoi(string(count))
	if err != nil || n < 1 {
		return nil, fmt.Errorf("blob %s: malformed manifest", key)
	}
	var out []byte
	for i := range n {
		p, err := w.conv.Get(ctx, partKey(key, i))
		if err != nil {
			return nil, fmt.Errorf("blob %s part %d: %w", key, i, err)
		}
		out = append(out, p.Value()...)
	}
	return out, nil
}

// committed does what follows a committed batch: the cache, metrics,
// outcome records, the group's KV entries, and garbage collection of the
// blobs the new checkpoint no longer names. None of it affects exactly-once
// emission; a crash here is repaired by the retry of the input. The
// outcome records are sent, not awaited: the caller awaits them, so the
// groups of one shared batch wait together.
func (w *Worker) committed(ctx context.Context, part *partition, g *loadedGroup, t *txn, next checkpoint, ckSeq uint64, events []bus.Event) (*outcomeWrites, error) {
	w.afterCommit(ctx, part, g, t, next, ckSeq, events)
	ow, err := w.outcomes.start(ctx, g.tenant, next.Outcomes)
	if t.groupChanged && err == nil {
		err = w.publishGroup(ctx, g.tenant, g.groupHex, t.g, ckSeq)
	}
	if err == nil {
		err = w.consumeKeyPackages(ctx, g.tenant, next.Consumed)
	}
	return ow, err
}

// consumeKeyPackages retires the KeyPackages a stored transaction's joins
// used (Marmot joining.md steps 11–12). An error leaves the input not
// done: its retry finds them in the checkpoint and retires them again.
func (w *Worker) consumeKeyPackages(ctx context.Context, tenant string, kps []consumedKeyPackage) error {
	for _, kp := range kps {
		if err := w.dir.consumeKeyPackage(ctx, tenant, kp.ClientID, kp.Ref); err != nil {
			return err
		}
	}
	return nil
}

// afterCommit does what follows a committed batch except the outcome records and
// the group's KV entries: the cache, metrics, and garbage collection of the
// blobs the new checkpoint no longer names.
func (w *Worker) afterCommit(ctx context.Context, part *partition, g *loadedGroup, t *txn, next checkpoint, ckSeq uint64, events []bus.Event) {
	key := g.tenant + "." + g.groupHex
	t.g.unstored = slices.DeleteFunc(t.g.unstored, func(x *indexWrites) bool { return x == &t.ix })
	part.remember(key, &loadedGroup{tenant: g.tenant, groupHex: g.groupHex, ck: next, ckSeq: ckSeq, state: t.g, members: t.members, chunks: t.chunks, used: w.cfg.Now()})
	part.setExpiry(key, next.NextExpiry)
	for _, e := range events {
		w.metrics.Events.WithLabelValues(string(e.Event.Kind)).Inc()
	}
	for _, n := range t.notes {
		w.metrics.disposition(n)
	}
	var stale []string
	drop := func(k string) {
		stale = append(stale, k)
		for i := range g.ck.Parts[k] {
			stale = append(stale, partKey(k, i))
		}
	}
	named := next.named()
	for _, k := range g.ck.named() {
		if !slices.Contains(named, k) {
			drop(k)
		}
	}
	w.purge(ctx, stale)
}

// publishOutcomes publishes outcome records and waits for them.
func (w *Worker) publishOutcomes(ctx context.Context, tenant string, notes []outcomeNote) error {
	ow, err := w.outcomes.start(ctx, tenant, notes)
	if err != nil {
		return err
	}
	return ow.await(ctx)
}

// publishGroup writes the group's fabric-groups record and, when it is the
// newest, its candidate group event keys in fabric-group-keys, sealed (the
// format bus.SealGroupKeys defines). A group with no hosted member
// following it (active, or removed and still Retained) has neither, so
// ingest answers its input with unknown_group.
func (w *Worker) publishGroup(ctx context.Context, tenant, groupHex string, g *groupState, ckSeq uint64) error {
	key, err := subject.GroupKey(tenant, groupHex)
	if err != nil {
		return err
	}
	rec := bus.GroupRecord{DMConversationKey: dmConversationKey(g.components()), CheckpointSeq: ckSeq}
	// A removed member still Retained follows the group: ingest keeps
	// routing its input, a winning branch may bring the member back.
	for _, m := range g.following() {
		rec.Members = append(rec.Members, m.ClientID)
	}
	var rev uint64
	e, err := w.groupsKV.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		return fmt.Errorf("read group record: %w", err)
	default:
		var old bus.GroupRecord
		if schema.UnmarshalMsgpack(e.Value(), &old) == nil && old.CheckpointSeq >= ckSeq {
			return nil
		}
		rev = e.Revision()
	}
	if len(rec.Members) == 0 {
		if rev != 0 {
			if err := w.groupsKV.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil && !isConflict(err) {
				return fmt.Errorf("delete group record: %w", err)
			}
		}
		if err := w.keysKV.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("delete group keys: %w", err)
		}
		return nil
	}
	b, err := msgpack.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode group record: %w", err)
	}
	if rev == 0 {
		_, err = w.groupsKV.Create(ctx, key, b)
	} else {
		_, err = w.groupsKV.Update(ctx, key, b, rev)
	}
	if isConflict(err) {
		return nil // a newer writer won
	}
	if err != nil {
		return fmt.Errorf("write group record: %w", err)
	}
	opened, err := openKeys(w.vault, g.Keys)
	if err != nil {
		// A state record from before keys were sealed (docs/converge.md):
		// failing would stop the partition; the group's next transaction
		// seals its keys again and writes them.
		w.log.Error("group keys not written", "group", key, "err", err)
		return nil
	}
	keys := make([][32]byte, 0, len(opened))
	for i := len(opened) - 1; i >= 0; i-- { // newest first: tried first
		var k [32]byte
		copy(k[:], opened[i].Key)
		keys = append(keys, k)
	}
	kb, err := bus.SealGroupKeys(w.vault, keys)
	clear(keys)
	if err != nil {
		return err
	}
	if _, err := w.keysKV.Put(ctx, key, kb); err != nil {
		return fmt.Errorf("write group keys: %w", err)
	}
	return nil
}

// dmConversationKey is a DM's conversation key (DMS-009): every group of
// the DM between the same two inboxes has the same one, so a filter naming
// any of them selects all (EVENT-020). SHA-256 of a domain label and the
// two account ids, lower first; nil for a group.
func dmConversationKey(comps components.Set) []byte {
	if comps.Conversation == nil || comps.Conversation.Kind != components.KindDM {
		return nil
	}
	h := sha256.New()
	h.Write([]byte("fabric/dm-conversation/v1"))
	h.Write(comps.Conversation.Members[0][:])
	h.Write(comps.Conversation.Members[1][:])
	return h.Sum(nil)
}

// staged is one group's prepared transaction awaiting a shared batch.
type staged struct {
	run     *groupRun
	g       *loadedGroup
	t       *txn
	next    checkpoint
	events  []bus.Event
	ix      []*nats.Msg
	written []string
	used    int
}

// commitShared commits the first transaction of every group of a fetch in
// shared atomic batches (the inputs of a fetch of one group go through the
// pipeline instead): one batch holds the events and the checkpoint of
// several groups, each checkpoint fenced on its own expected sequence, so
// quiet groups do not pay one batch each. Any failure leaves the groups it
// touched to the per-group path, which reloads them and skips what is done.
func (w *Worker) commitShared(ctx context.Context, part *partition, runs []*groupRun, pull puller) {
	if len(runs) == 1 {
		w.pipeline(ctx, part, runs[0], pull)
		return
	}
	var batch []*staged
	size := 0
	for _, r := range runs {
		s := w.stage(ctx, part, r)
		if s == nil {
			continue
		}
		n := len(s.events) + len(s.ix) + 1
		if size+n > w.cfg.MaxBatch {
			w.flush(ctx, part, batch)
			batch, size = nil, 0
		}
		batch = append(batch, s)
		size += n
	}
	w.flush(ctx, part, batch)
}

// stage loads a group and prepares its first transaction. It returns nil
// when there is nothing to commit (every input already done, marked in
// r.done) or on any failure (left to the per-group path).
func (w *Worker) stage(ctx context.Context, part *partition, r *groupRun) *staged {
	key := r.tenant + "." + r.groupHex
	g, err := w.load(ctx, part, r.tenant, r.groupHex)
	if err != nil {
		return nil
	}
	t := w.newTxn(ctx, r.tenant, g)
	used, applied, err := w.applyRun(ctx, t, g, r.ins)
	if err != nil || !applied {
		delete(part.groups, key)
		if err == nil {
			r.done = used
		}
		return nil
	}
	next, events, ix, written, err := w.prepare(ctx, g, t)
	if err != nil || !w.fits(events, ix) {
		// One batch too large is the per-group path's to split.
		delete(part.groups, key)
		w.purge(ctx, written)
		return nil
	}
	return &staged{run: r, g: g, t: t, next: next, events: events, ix: ix, written: written, used: used}
}

// flush commits staged transactions in one atomic batch.
func (w *Worker) flush(ctx context.Context, part *partition, batch []*staged) {
	if len(batch) == 0 {
		return
	}
	start := time.Now()
	seqs, err := w.commitMany(ctx, batch)
	switch {
	case errors.Is(err, ErrFenced):
		w.metrics.Fenced.Inc()
	case err == nil && len(batch) > 1:
		w.metrics.Batches.WithLabelValues("many").Inc()
	case err == nil:
		w.metrics.Batches.WithLabelValues("1").Inc()
	}
	writes := make([]*outcomeWrites, len(batch))
	for i, s := range batch {
		delete(part.groups, s.g.tenant+"."+s.g.groupHex)
		if err != nil {
			if errors.Is(err, ErrFenced) {
				w.purge(ctx, w.unnamed(ctx, s.g.tenant, s.g.groupHex, s.written))
			}
			continue
		}
		ow, cerr := w.committed(ctx, part, s.g, s.t, s.next, seqs[i], s.events)
		if cerr != nil {
			continue // the per-group path republishes
		}
		writes[i] = ow
	}
	// The outcome records of every group were sent; wait for them together.
	for i, s := range batch {
		if writes[i] == nil || writes[i].await(ctx) != nil {
			continue // the per-group path republishes
		}
		s.run.done = s.used
		for range s.used {
			w.metrics.Latency.Observe(time.Since(start).Seconds())
		}
	}
}

// commitMany stores several groups' events and checkpoints as one atomic
// batch, each group's checkpoint after its events and fenced on the
// sequence that group's worker loaded. It returns each checkpoint's stream
// sequence.
func (w *Worker) commitMany(ctx context.Context, batch []*staged) ([]uint64, error) {
	if len(batch) == 1 {
		s := batch[0]
		seq, err := commitBatch(ctx, w.js, w.cfg.MaxBatch, s.g.tenant, s.g.groupHex, s.g.ckSeq, s.next, s.events, s.ix)
		return []uint64{seq}, err
	}
	var b bus.Batch
	pos := make([]int, len(batch))
	for i, s := range batch {
		if err := b.AddEvents(s.events); err != nil {
			return nil, err
		}
		b.AddMsgs(s.ix...)
		body, err := encodeCheckpoint(s.next)
		if err != nil {
			return nil, err
		}
		ck, err := bus.CheckpointMsg(bus.Checkpoint{Tenant: s.g.tenant, GroupID: s.g.groupHex, Data: body, ExpectedSeq: s.g.ckSeq})
		if err != nil {
			return nil, err
		}
		pos[i] = b.Len()
		b.AddMsgs(ck)
	}
	last, _, err := b.Publish(ctx, w.js)
	if err != nil {
		if fencedErr(err) {
			return nil, fmt.Errorf("%w: %w", ErrFenced, err)
		}
		return nil, fmt.Errorf("commit shared batch: %w", err)
	}
	first := last - uint64(b.Len()) + 1
	seqs := make([]uint64, len(batch))
	for i := range batch {
		seqs[i] = first + uint64(pos[i])
	}
	return seqs, nil
}
