package converge

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// partition is the state of one owned partition: its loaded groups and when
// each group next has messages to expire.
type partition struct {
	id     int
	groups map[string]*loadedGroup // by <tenant>.<group>
	expiry map[string]int64        // by <tenant>.<group>
	// expiryDirty is set when expiry changed since it was last saved.
	expiryDirty bool
	// resident is len(groups) as last added to Metrics.Resident.
	resident int
}

// expiryKey is the fabric-converge key of a partition's expiry index: which
// groups have messages awaiting the cleanup pass, and from when. It is a
// hint that lets a new owner find them without input; each group's
// checkpoint stays the authority.
func expiryKey(p int) string { return "EXPIRY." + strconv.Itoa(p) }

func (w *Worker) loadExpiry(ctx context.Context, part *partition) {
	e, err := w.conv.Get(ctx, expiryKey(part.id))
	if err != nil {
		return
	}
	var idx map[string]int64
	if schema.UnmarshalMsgpack(e.Value(), &idx) != nil {
		return
	}
	for k, at := range idx {
		if _, _, ok := splitGroupKey(k); ok && at > 0 {
			part.expiry[k] = at
		}
	}
}

func (w *Worker) saveExpiry(ctx context.Context, part *partition) {
	if !part.expiryDirty {
		return
	}
	idx := map[string]int64{}
	for k, at := range part.expiry {
		if at > 0 {
			idx[k] = at
		}
	}
	b, err := msgpack.Marshal(idx)
	if err != nil {
		return
	}
	if _, err := w.conv.Put(ctx, expiryKey(part.id), b); err != nil {
		w.log.Debug("converge: save expiry index", "err", err)
		return
	}
	part.expiryDirty = false
}

// due reports whether a group of the partition fell due after the last
// cleanup round (at since) and by now: a convergence pass is applied at its
// deadline, not a cleanup interval later. A due time a round already saw
// (its transaction failed or changed nothing) waits for the next interval.
func (p *partition) due(since, now time.Time) bool {
	n := p.nextDue(since)
	return n != 0 && n <= now.UnixMilli()
}

// nextDue is the earliest due time of the partition's groups after since
// (unix ms), or 0.
func (p *partition) nextDue(since time.Time) int64 {
	var next int64
	for _, at := range p.expiry {
		if at > since.UnixMilli() && (next == 0 || at < next) {
			next = at
		}
	}
	return next
}

// wait is how long a fetch may wait for input: at most limit, and no longer
// than the partition's next due time, so the partition goroutine is the
// timer of its groups' passes.
func (p *partition) wait(since, now time.Time, limit time.Duration) time.Duration {
	n := p.nextDue(since)
	if n == 0 {
		return limit
	}
	return min(max(time.UnixMilli(n).Sub(now), minFetchWait), limit)
}

// An input that fails for an infrastructure reason (a store unreachable,
// a blob missing) is retried in order, first after minRetryBackoff, then
// after twice the wait before, up to maxRetryBackoff; it shows in
// fabric_converge_input_retries_total and fabric_converge_stalled_partitions.
const (
	minRetryBackoff = 100 * time.Millisecond
	maxRetryBackoff = 30 * time.Second
)

// minFetchWait is the shortest fetch wait, so a due time that a failing
// transaction keeps in the past does not spin the partition.
const minFetchWait = 50 * time.Millisecond

// dueBy reports whether a group of the partition is due at or before at.
func (p *partition) dueBy(at time.Time) bool {
	for _, x := range p.expiry {
		if x > 0 && x <= at.UnixMilli() {
			return true
		}
	}
	return false
}

func (p *partition) setExpiry(key string, at int64) {
	if p.expiry[key] != at {
		p.expiry[key] = at
		p.expiryDirty = true
	}
	if at == 0 {
		delete(p.expiry, key)
	}
}

// loadedGroup is a group as of its newest checkpoint.
type loadedGroup struct {
	tenant, groupHex string
	ck               checkpoint
	ckSeq            uint64
	state            *groupState
	members          map[string]MemberState
	// chunks are the settled chunks stored for each member, as
	// ck.MemberChunks names them.
	chunks map[string][]storedChunk
	// used is when the group was last loaded or committed (Config.Now).
	used time.Time
}

// maxCachedGroups bounds the groups a partition keeps loaded; beyond it an
// arbitrary one is dropped and read again from its checkpoint when needed.
const maxCachedGroups = 512

func (p *partition) remember(key string, g *loadedGroup) {
	if _, ok := p.groups[key]; !ok && len(p.groups) >= maxCachedGroups {
		for k := range p.groups {
			delete(p.groups, k)
			break
		}
	}
	p.groups[key] = g
}

// evictIdle drops the groups that nothing loaded or committed for idle
// (their members are restored from the stored state by the next input)
// and brings the resident gauge to the groups that stay. It reports
// whether it dropped any.
func (p *partition) evictIdle(now time.Time, idle time.Duration, resident prometheus.Gauge) bool {
	n := len(p.groups)
	for k, g := range p.groups {
		if now.Sub(g.used) >= idle {
			delete(p.groups, k)
		}
	}
	resident.Add(float64(len(p.groups) - p.resident))
	p.resident = len(p.groups)
	return len(p.groups) < n
}

func (w *Worker) runPartition(ctx context.Context, p int) {
	part := &partition{id: p, groups: map[string]*loadedGroup{}, expiry: map[string]int64{}}
	w.loadExpiry(ctx, part)
	defer func() { w.metrics.Resident.Sub(float64(part.resident)) }()
	defer func() {
		// Hand the index to the next owner even when ctx has ended.
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		w.saveExpiry(sctx, part)
	}()
	var cons jetstream.Consumer
	var seen deliveries
	var restart uint64
	backoff := 100 * time.Millisecond
	// retry is the wait before an input that failed is tried again,
	// doubled on each failure; stalled is set while it has not succeeded.
	retry, stalled := minRetryBackoff, false
	defer func() {
		if stalled {
			w.metrics.Stalled.Dec()
		}
	}()
	lastCleanup := time.Time{}
	for ctx.Err() == nil {
		if cons == nil {
			var err error
			var start uint64
			if cons, start, err = w.resetConsumer(ctx, p, restart); err != nil {
				w.log.Warn("converge: consumer", "partition", p, "err", err)
				sleep(ctx, backoff)
				continue
			}
			seen = deliveries{next: 1, last: start - 1, hooks: w.cfg.hooks}
			restart = 0
		}
		fetched := w.cfg.Now()
		batch, err := cons.Fetch(w.cfg.hooks.fetchSize(), jetstream.FetchMaxWait(part.wait(lastCleanup, w.cfg.Now(), w.cfg.CleanupInterval)))
		if err != nil {
			cons = nil
			sleep(ctx, backoff)
			continue
		}
		seen.taken = 0
		msgs := batch.Messages()
		open := true
		// carry is a message a pipelined run pulled but did not take (of
		// another group): the first of the next pending.
		var carry jetstream.Msg
		// pull hands a pipelined run the next message of this fetch as it
		// arrives, until stop is closed; a message take refuses is carried.
		pull := func(take func(jetstream.Msg) bool, stop <-chan struct{}) bool {
			if carry != nil || !open {
				return false
			}
			var m jetstream.Msg
			var ok bool
			// An input already here is taken even when stop is closed.
			select {
			case m, ok = <-msgs:
			default:
				select {
				case m, ok = <-msgs:
				case <-stop:
					return false
				}
			}
			if !ok {
				open = false
				return false
			}
			if !seen.take(m) {
				return false
			}
			if !take(m) {
				carry = m
				return false
			}
			return true
		}
		for open || carry != nil {
			first := carry
			carry = nil
			if first == nil {
				m, ok := <-msgs
				if !ok {
					break
				}
				if !seen.take(m) {
					continue // after a gap: redelivered in order
				}
				first = m
			}
			// Take what has already arrived too, so a group's consecutive
			// inputs share one transaction and one atomic batch.
			pending := []jetstream.Msg{first}
		drain:
			for len(pending) < fetchBatch {
				select {
				case m, ok := <-msgs:
					if !ok {
						open = false
						break drain
					}
					if !seen.take(m) {
						break drain
					}
					pending = append(pending, m)
				default:
					break drain
				}
			}
			if restart != 0 {
				continue // drain the rest of a batch after a failure
			}
			restart = w.handle(ctx, part, pending, pull)
			if ctx.Err() != nil {
				return
			}
		}
		fetchErr := batch.Error()
		if restart != 0 {
			cons = nil
			w.metrics.Retries.Inc()
			if !stalled {
				stalled = true
				w.metrics.Stalled.Inc()
			}
			sleep(ctx, retry)
			retry = min(2*retry, maxRetryBackoff)
			continue
		}
		now := w.cfg.Now()
		cleanup := now.Sub(lastCleanup) >= w.cfg.CleanupInterval || part.due(lastCleanup, now)
		var clock time.Time
		if cleanup {
			clock = seen.clock(fetched, now, fetchErr)
			if seen.resume == 0 && part.dueBy(clock) {
				clock = confirmReceived(ctx, cons, &seen, clock)
			}
		}
		if seen.resume != 0 {
			w.log.Warn("converge: a delivery went missing; delivering again from the input after the last received", "partition", p, "from", seen.resume)
			w.metrics.LostDeliveries.Inc()
			cons, restart = nil, seen.resume
			continue
		}
		if stalled {
			stalled = false
			w.metrics.Stalled.Dec()
		}
		retry = minRetryBackoff
		if cleanup {
			lastCleanup = clock
			w.cleanup(ctx, part, clock)
		}
		w.saveExpiry(ctx, part)
		now = w.cfg.Now()
		w.release.poll(now, part.evictIdle(now, w.cfg.IdleAfter, w.metrics.Resident))
	}
}

// deliveries checks that the worker receives every delivery of its
// partition's consumer, in order. The server counts a message delivered
// once it sends it; one lost on the way (a NATS node shut down under the
// pull, a fetch that ended as it arrived) comes back only after AckWait,
// behind later inputs of its group, where the checkpoint's input_seq would
// take it for done and it would never be applied (EVENT-001). A gap in the
// consumer sequence ends the fetch there; the consumer is made again from
// the input after the last one received.
type deliveries struct {
	next   uint64 // the consumer sequence expected next
	last   uint64 // the stream sequence of the last delivery received
	resume uint64 // set at a gap: the stream sequence to deliver from again
	hooks  *hooks
	// taken counts the deliveries of the current fetch; lastTime is the
	// stream time of the last delivery received.
	taken    int
	lastTime time.Time
}

// clock is the stream time a cleanup round after a fetch may act at: every
// input stored before it has been received. For a fetch that ended
// without filling, that is when it was asked for (anything stored before
// was delivered to it); for a full one, or one that failed, the stream
// time of the last input received. A convergence pass is cut off at its
// deadline in stream time, so the inputs it holds are those stored before
// the deadline however far behind the partition runs: a round at the
// worker's clock would cut off a pass while inputs stored before its
// deadline still wait behind a full fetch, or arrived as the fetch ended
// (docs/converge.md, "Passes without input").
func (d *deliveries) clock(fetched, now time.Time, fetchErr error) time.Time {
	ended := fetchErr == nil || errors.Is(fetchErr, jetstream.ErrNoMessages) || errors.Is(fetchErr, nats.ErrTimeout) || errors.Is(fetchErr, context.DeadlineExceeded)
	at := d.lastTime
	if d.taken < d.hooks.fetchSize() && ended && fetched.After(at) {
		at = fetched
	}
	if now.Before(at) {
		return now
	}
	return at
}

// confirmReceived asks the consumer, before a cleanup round acts at clock,
// whether the worker has received everything: a delivery lost at the tail
// of the input (a fetch the client gave up on as the server answered it)
// has no later delivery to reveal its gap, and would come back only after
// AckWait while its pass is cut off without it. A loss sets seen.resume;
// input stored but not yet delivered, or no answer, moves the clock back
// to the last input received.
func confirmReceived(ctx context.Context, cons jetstream.Consumer, seen *deliveries, clock time.Time) time.Time {
	info, err := cons.Info(ctx)
	switch {
	case err != nil:
		return seen.lastTime
	case info.Delivered.Consumer >= seen.next:
		seen.resume = seen.last + 1
	case info.NumPending > 0:
		return seen.lastTime
	}
	return clock
}

// take reports whether m is the delivery expected next. After a gap it
// refuses every message of the fetch.
func (d *deliveries) take(m jetstream.Msg) bool {
	if d.resume != 0 {
		return false
	}
	if !d.hooks.delivered(m) {
		return false // lost on the way: the worker never sees it
	}
	meta, err := m.Metadata()
	if err != nil {
		d.next++
		return true // handle drops it as malformed
	}
	if meta.Sequence.Consumer != d.next {
		d.resume = d.last + 1
		return false
	}
	d.next++
	d.taken++
	d.last = meta.Sequence.Stream
	d.lastTime = meta.Timestamp
	return true
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// groupRun is the inputs of one group among the messages of one fetch, in
// stream order.
type groupRun struct {
	tenant, groupHex string
	ins              []input
	msgs             []jetstream.Msg
	// done counts the inputs a shared batch finished.
	done int
}

// handle processes fetched input messages: each group's in stream order,
// exactly once, behind the fence, and acknowledges them. It returns 0, or
// the stream sequence to redeliver from after a failure.
func (w *Worker) handle(ctx context.Context, part *partition, msgs []jetstream.Msg, pull puller) uint64 {
	var runs []*groupRun
	byGroup := map[string]*groupRun{}
	for _, msg := range msgs {
		in, tenant, groupHex, err := parseInput(msg)
		if err != nil {
			w.log.Warn("converge: malformed input dropped", "err", err)
			_ = msg.Ack()
			continue
		}
		key := tenant + "." + groupHex
		r := byGroup[key]
		if r == nil {
			r = &groupRun{tenant: tenant, groupHex: groupHex}
			byGroup[key] = r
			runs = append(runs, r)
		}
		r.ins = append(r.ins, in)
		r.msgs = append(r.msgs, msg)
	}
	w.commitShared(ctx, part, runs, pull)
	var restart uint64
	for _, r := range runs {
		// What the shared batch did not finish goes group by group.
		done, err := r.done, error(nil)
		if done < len(r.ins) {
			var n int
			n, err = w.handleRun(ctx, part, r.tenant, r.groupHex, r.ins[done:])
			done += n
		}
		for _, m := range r.msgs[:done] {
			_ = m.Ack()
		}
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("converge: input failed; retrying in order", "partition", part.id, "err", err)
			}
			if seq := r.ins[done].Seq; restart == 0 || seq < restart {
				restart = seq
			}
		}
	}
	return restart
}

// parseInput reads an input message as ingest publishes it.
func parseInput(msg jetstream.Msg) (input, string, string, error) {
	meta, err := msg.Metadata()
	if err != nil {
		return input{}, "", "", fmt.Errorf("input metadata: %w", err)
	}
	subj, err := subject.ParseStoredInput(msg.Subject())
	if err != nil {
		return input{}, "", "", err
	}
	// The subject's message id is checked lowercase hex of a SHA-256.
	id, _ := hex.DecodeString(subj.MessageIDHex)
	// Ingest's inputs carry the id only in the subject; an input that also
	// names it in a header (an operation) must name the same.
	if h := msg.Headers().Get(bus.HeaderMessageID); h != "" && h != subj.MessageIDHex {
		return input{}, "", "", errors.New("input message id header does not match its subject")
	}
	return input{
		Seq:       meta.Sequence.Stream,
		Class:     schema.InputClass(msg.Headers().Get(bus.HeaderClass)),
		MessageID: id,
		Data:      msg.Data(),
		Time:      meta.Timestamp.UnixMilli(),
	}, subj.Tenant, subj.GroupHex, nil
}

// maxTxnInputs bounds the inputs of one transaction.
const maxTxnInputs = 64

// txnName names the transaction that ends with the input at seq.
func txnName(seq uint64) string { return "in:" + strconv.FormatUint(seq, 10) }

// handleRun applies a group's inputs, in order, in as few transactions as
// fit one atomic batch each. It returns how many inputs are done.
func (w *Worker) handleRun(ctx context.Context, part *partition, tenant, groupHex string, ins []input) (int, error) {
	done := 0
	// solo: one input per transaction, to find the one whose batch the
	// server refuses (unpublishable, duplicate).
	solo := false
	// marks bounds the inputs marked to fail (each mark is followed by a
	// transaction that fails it, so more means failing it fails).
	marks := 0
	for done < len(ins) {
		start := time.Now()
		var used int
		end := len(ins)
		if solo {
			end = done + 1
		}
		err := w.transact(ctx, part, tenant, groupHex, func(ctx context.Context, t *txn, g *loadedGroup) (bool, error) {
			var applied bool
			var err error
			used, applied, err = w.applyRun(ctx, t, g, ins[done:end])
			return applied, err
		})
		switch {
		case err == nil && used > 0:
			w.failed.forget(tenant, groupHex, ins[done+used-1].Seq)
		case err == nil:
		case marks > 2*len(ins):
			return done, err
		case errors.Is(err, errInputFailed):
			marks++
			continue // marked: the next transaction fails it
		case (unpublishable(err) || duplicate(err)) && !solo:
			solo = true
			continue
		case unpublishable(err) || duplicate(err):
			marks++
			why := inputFailure{reason: failUnpublishable, cat: schema.CategoryTransportRejected, err: err}
			if duplicate(err) {
				why = inputFailure{reason: failDuplicate, cat: schema.CategoryDuplicate, err: err}
			}
			w.log.Error("converge: an input's batch can never be stored; it fails terminally", "reason", why.reason,
				"tenant", tenant, "group", groupHex, "seq", ins[done].Seq, "class", ins[done].Class, "err", err)
			w.markFailed(failedKey{tenant, groupHex, ins[done].Seq}, why)
			continue
		default:
			return done, err
		}
		for range used {
			w.metrics.Latency.Observe(time.Since(start).Seconds())
		}
		done += used
	}
	return done, nil
}

// applyRun applies a group's inputs to t in order, skipping those the
// checkpoint already holds, for as long as they fit one transaction. It
// returns how many inputs it consumed and whether it applied any.
func (w *Worker) applyRun(ctx context.Context, t *txn, g *loadedGroup, ins []input) (used int, applied bool, err error) {
	for _, in := range ins {
		if in.Seq <= g.ck.InputSeq {
			// Done before, by this worker before a crash or by another;
			// the outcomes of the checkpoint's own transaction may not
			// have been published yet.
			if g.ck.Txn == txnName(in.Seq) {
				if err := w.republish(ctx, g); err != nil {
					return used, applied, err
				}
			}
			used++
			continue
		}
		if applied && (used >= maxTxnInputs || t.size()+eventBudget(t) > w.cfg.MaxBatch-1) {
			break
		}
		if err := w.apply(ctx, t, g, in); err != nil {
			return used, applied, err
		}
		if t.err != nil {
			return used, applied, t.err
		}
		t.inputSeq, t.name = in.Seq, txnName(in.Seq)
		applied = true
		used++
	}
	return used, applied, nil
}

// eventBudget is the most batch messages one more input can add: a commit
// can give every active member a removal, a membership, a metadata and a
// pause event; a message, index writes.
func eventBudget(t *txn) int { return 4*len(t.g.active()) + 4 }

// republish publishes the outcome records and group entries of a group's
// newest transaction again.
func (w *Worker) republish(ctx context.Context, g *loadedGroup) error {
	if err := w.publishOutcomes(ctx, g.tenant, g.ck.Outcomes); err != nil {
		return err
	}
	if err := w.publishGroup(ctx, g.tenant, g.groupHex, g.state, g.ckSeq); err != nil {
		return err
	}
	return w.consumeKeyPackages(ctx, g.tenant, g.ck.Consumed)
}

// cleanupTxn begins the name of a cleanup transaction (checkpoint.Txn).
const cleanupTxn = "exp:"

// cleanupRounds bounds the transactions one group gets in one cleanup
// round: a convergence pass is cut off in one and applied in the next. An
// expiry that does not fit one transaction goes on for as long as it
// expires messages.
const cleanupRounds = 2

// cleanup runs what is due without input over the owned groups: the
// disappearing-messages pass (META-063), under branch selection the
// convergence passes whose deadline has passed, and the scheduled
// self-updates (selfupdate.go).
func (w *Worker) cleanup(ctx context.Context, part *partition, clock time.Time) {
	now := clock.UnixMilli()
	pol := w.policy()
	for _, key := range slices.Sorted(maps.Keys(part.expiry)) {
		tenant, groupHex, ok := splitGroupKey(key)
		if !ok {
			part.setExpiry(key, 0)
			continue
		}
		for round := 0; ; round++ {
			at := part.expiry[key]
			if at == 0 || at > now {
				break
			}
			expired := false
			err := w.transact(ctx, part, tenant, groupHex, func(ctx context.Context, t *txn, _ *loadedGroup) (bool, error) {
				t.now, t.name = now, cleanupTxn+strconv.FormatInt(now, 10)+"."+strconv.Itoa(round)
				var err error
				expired, err = t.expire(func(secs, from uint64) ([]expiryEntry, uint64, error) {
					return w.readPage(ctx, tenant, groupHex, secs, from)
				}, w.cfg.MaxBatch-1)
				if err != nil {
					return false, err
				}
				ticked, err := pol.tick(ctx, t)
				if err != nil {
					return false, err
				}
				updated, err := pol.selfUpdates(ctx, t, w.cfg.SelfUpdateAfter)
				return expired || ticked || updated, err
			})
			if err != nil {
				w.log.Warn("converge: cleanup pass failed", "err", err)
				// Still due, even when its batch was stored and moved the
				// due time: the next round loads the group from its
				// checkpoint and publishes what follows the batch.
				part.setExpiry(key, at)
				break
			}
			if expired {
				w.metrics.Expirations.Inc()
			}
			if part.groups[key] == nil {
				break // nothing changed: the group keeps its due time
			}
			if !expired && round+1 >= cleanupRounds {
				break
			}
		}
	}
}

func splitGroupKey(key string) (tenant, groupHex string, ok bool) {
	for i := 0; i < len(key); i++ {
		if key[i] == '.' {
			return key[:i], key[i+1:], true
		}
	}
	return "", "", false
}

// load returns the group as of its newest checkpoint: from the partition's
// cache, or read again (after a fence loss, or the first time).
func (w *Worker) load(ctx context.Context, part *partition, tenant, groupHex string) (*loadedGroup, error) {
	key := tenant + "." + groupHex
	if g, ok := part.groups[key]; ok {
		g.used = w.cfg.Now()
		if err := w.drain(ctx, part, g); err != nil {
			return nil, err
		}
		return g, nil
	}
	ck, seq, err := readCheckpoint(ctx, w.js, tenant, groupHex)
	if err != nil {
		return nil, err
	}
	g := &loadedGroup{tenant: tenant, groupHex: groupHex, ck: ck, ckSeq: seq, members: map[string]MemberState{}, chunks: map[string][]storedChunk{}, used: w.cfg.Now()}
	if seq == 0 {
		gid, err := hex.DecodeString(groupHex)
		if err != nil {
			return nil, fmt.Errorf("group id: %w", err)
		}
		g.state = newGroupState(tenant, gid)
	} else {
		b, err := w.getBlob(ctx, ck.State)
		if err != nil {
			return nil, fmt.Errorf("load group state: %w", err)
		}
		if g.state, err = decodeGroupState(b); err != nil {
			return nil, err
		}
		if err := g.state.loadLegacyIndex(ck.Chunks, func(key string) ([]byte, error) { return w.getBlob(ctx, key) }); err != nil {
			return nil, err
		}
		if err := w.migrateIndex(ctx, tenant, groupHex, g.state); err != nil {
			return nil, err
		}
		for client, bk := range ck.Members {
			b, err := w.getBlob(ctx, bk)
			if err != nil {
				return nil, fmt.Errorf("load member state: %w", err)
			}
			chunks, err := w.loadChunks(ctx, ck.MemberChunks[client])
			if err != nil {
				return nil, fmt.Errorf("load member state: %w", err)
			}
			st, err := w.restoreMember(ctx, Client{Tenant: tenant, ClientID: client}, b, chunks)
			if err != nil {
				return nil, fmt.Errorf("restore member state: %w", err)
			}
			g.members[client] = st
			if len(chunks) > 0 {
				g.chunks[client] = chunks
			}
		}
	}
	part.remember(key, g)
	part.setExpiry(key, ck.NextExpiry)
	if err := w.drain(ctx, part, g); err != nil {
		return nil, err
	}
	// A cleanup pass has no input that is delivered again: when its ack
	// was lost or its worker died after the batch, only this load
	// publishes its outcome records and the group's entries (a new
	// epoch's group key, without which ingest defers the group's input).
	// Publishing them again is idempotent.
	if strings.HasPrefix(g.ck.Txn, cleanupTxn) {
		if err := w.republish(ctx, g); err != nil {
			delete(part.groups, key)
			return nil, err
		}
	}
	return g, nil
}
