package converge

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/eventbus"
	"github.com/fabric-mls/fabric/internal/ingest"
	"github.com/fabric-mls/fabric/internal/streams"
	"github.com/fabric-mls/fabric/internal/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Defaults of Config.
const (
	DefaultLeaseTTL        = 6 * time.Second
	DefaultCleanupInterval = time.Second
	// fetchBatch is how many inputs one pull asks for.
	fetchBatch = 64
	// commitAttempts bounds the retries of one transaction that lost the
	// fence to an earlier attempt or another worker.
	commitAttempts = 5
	// pruneEvery is how many checkpoints a group gets between prunes of
	// its superseded ones.
	pruneEvery = 32
)

// Config configures a Worker.
type Config struct {
	// JS reaches the provisioned streams and buckets (package streams).
	JS jetstream.JetStream
	// MLS runs the hosted members' MLS state (EngineMLS).
	MLS MLS
	// WorkerID names this worker in leases: [A-Za-z0-9_-]{1,64}, unique
	// among running workers.
	WorkerID string
	// Partitions are the input partitions this worker may own; all of
	// them when empty.
	Partitions []int
	// LeaseTTL is how long a partition lease lasts without renewal; a
	// dead worker's partitions are taken within LeaseTTL plus a third of
	// it. DefaultLeaseTTL when zero.
	LeaseTTL time.Duration
	// CleanupInterval is how often the disappearing-messages cleanup pass
	// runs over owned groups. DefaultCleanupInterval when zero.
	CleanupInterval time.Duration
	// SnapshotEvery is how many decryptions a member's engine state may
	// advance before it is written again; handshakes always write it. 1
	// (the default) writes every ratchet step, so no consumed message key
	// is ever at rest; a larger value trades that forward secrecy at rest
	// for throughput in groups with many hosted members, and a restart then
	// ratchets forward from the older snapshot.
	SnapshotEvery int
	// Metrics receives measurements; a fresh unregistered set when nil.
	Metrics *Metrics
	// Logger receives diagnostics; slog.Default when nil.
	Logger *slog.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Worker is one converge process's share of the work: it owns some input
// partitions, consumes each in stream order and commits each group's
// transactions behind the group's checkpoint fence.
type Worker struct {
	cfg      Config
	js       jetstream.JetStream
	log      *slog.Logger
	metrics  *Metrics
	leases   *leases
	inStream jetstream.Stream
	outcomes outcomes
	conv     jetstream.KeyValue
	groupsKV jetstream.KeyValue
	keysKV   jetstream.KeyValue
	dir      kvDirectory

	mu      sync.Mutex
	running map[int]*partitionRun
	ready   bool
}

// partitionRun is an owned partition's consuming goroutine.
type partitionRun struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// New checks cfg and opens the streams and buckets the worker needs.
func New(ctx context.Context, cfg Config) (*Worker, error) {
	if cfg.JS == nil || cfg.MLS == nil {
		return nil, errors.New("converge: JS and MLS are required")
	}
	if err := validWorkerID(cfg.WorkerID); err != nil {
		return nil, err
	}
	if len(cfg.Partitions) == 0 {
		for p := range subject.Partitions {
			cfg.Partitions = append(cfg.Partitions, p)
		}
	}
	for _, p := range cfg.Partitions {
		if p < 0 || p >= subject.Partitions {
			return nil, fmt.Errorf("converge: partition %d out of range", p)
		}
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.CleanupInterval <= 0 {
		cfg.CleanupInterval = DefaultCleanupInterval
	}
	if cfg.SnapshotEvery <= 0 {
		cfg.SnapshotEvery = 1
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	w := &Worker{cfg: cfg, js: cfg.JS, log: cfg.Logger, metrics: cfg.Metrics, running: map[int]*partitionRun{}}
	var err error
	if w.inStream, err = cfg.JS.Stream(ctx, streams.StreamInput); err != nil {
		return nil, fmt.Errorf("converge: stream %s: %w", streams.StreamInput, err)
	}
	out, err := cfg.JS.Stream(ctx, streams.StreamOutcomes)
	if err != nil {
		return nil, fmt.Errorf("converge: stream %s: %w", streams.StreamOutcomes, err)
	}
	w.outcomes = outcomes{js: cfg.JS, stream: out}
	for name, dst := range map[string]*jetstream.KeyValue{
		streams.BucketConverge: &w.conv, streams.BucketGroups: &w.groupsKV, streams.BucketGroupKeys: &w.keysKV, streams.BucketClients: &w.dir.kv,
	} {
		if *dst, err = cfg.JS.KeyValue(ctx, name); err != nil {
			return nil, fmt.Errorf("converge: bucket %s: %w", name, err)
		}
	}
	w.leases = newLeases(w.conv, cfg.WorkerID, cfg.LeaseTTL)
	w.leases.now = cfg.Now
	return w, nil
}

func validWorkerID(id string) error {
	if id == "" || len(id) > 64 {
		return errors.New("converge: worker id must be 1 to 64 characters")
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return errors.New("converge: worker id may hold only letters, digits, '-' and '_'")
		}
	}
	return nil
}

// Owned returns the partitions this worker owns now, sorted.
func (w *Worker) Owned() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]int, 0, len(w.running))
	for p := range w.running {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Ready reports an error until the worker has balanced its leases once.
func (w *Worker) Ready(context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.ready {
		return errors.New("converge: leases not yet balanced")
	}
	return nil
}

// Run owns partitions until ctx ends: it renews its leases, takes free or
// expired ones up to its fair share, gives up extras, and runs one consuming
// goroutine per owned partition. On return every partition goroutine has
// stopped and the leases are released, so another worker takes over at
// once (graceful drain).
func (w *Worker) Run(ctx context.Context) error {
	tick := time.NewTicker(w.cfg.LeaseTTL / 3)
	defer tick.Stop()
	defer w.stopAll()
	for {
		if err := w.balance(ctx); err != nil && ctx.Err() == nil {
			w.log.Warn("converge: lease balance failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// stopAll stops every partition and releases its lease.
func (w *Worker) stopAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	owned := w.Owned()
	w.stop(owned...)
	for _, p := range owned {
		if err := w.leases.release(ctx, p); err != nil {
			w.log.Warn("converge: release lease", "partition", p, "err", err)
		}
	}
	if err := w.leases.retire(ctx); err != nil {
		w.log.Warn("converge: retire worker", "err", err)
	}
	w.metrics.Owned.Set(0)
}

func (w *Worker) balance(ctx context.Context) error {
	if err := w.leases.heartbeat(ctx); err != nil {
		return err
	}
	for _, p := range w.Owned() {
		ok, err := w.leases.renew(ctx, p)
		if err != nil {
			return err
		}
		if !ok {
			w.log.Warn("converge: partition lease lost", "partition", p)
			w.stop(p)
		}
	}
	n, err := w.leases.liveWorkers(ctx)
	if err != nil {
		return err
	}
	share := (len(w.cfg.Partitions) + n - 1) / n
	owned := w.Owned()
	if len(owned) > share {
		extra := owned[share:]
		w.stop(extra...)
		for _, p := range extra {
			if err := w.leases.release(ctx, p); err != nil {
				return err
			}
		}
	}
	// Start the scan at a worker-specific offset, so workers starting
	// together do not all race for the same partitions.
	h := fnv.New32a()
	h.Write([]byte(w.cfg.WorkerID))
	off := int(h.Sum32() % uint32(len(w.cfg.Partitions)))
	for i := 0; i < len(w.cfg.Partitions) && len(w.Owned()) < share; i++ {
		p := w.cfg.Partitions[(off+i)%len(w.cfg.Partitions)]
		if w.owns(p) {
			continue
		}
		ok, err := w.leases.tryAcquire(ctx, p)
		if err != nil {
			return err
		}
		if ok {
			w.start(ctx, p)
		}
	}
	w.metrics.Owned.Set(float64(len(w.Owned())))
	w.updateLag(ctx)
	w.mu.Lock()
	w.ready = true
	w.mu.Unlock()
	return nil
}

func (w *Worker) owns(p int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.running[p]
	return ok
}

func (w *Worker) start(ctx context.Context, p int) {
	pctx, cancel := context.WithCancel(ctx)
	r := &partitionRun{cancel: cancel, done: make(chan struct{})}
	w.mu.Lock()
	w.running[p] = r
	w.mu.Unlock()
	go func() {
		defer close(r.done)
		w.runPartition(pctx, p)
	}()
}

// stop stops the given partitions: all are told at once, then awaited, so a
// drain takes one fetch wait, not one per partition.
func (w *Worker) stop(ps ...int) {
	var runs []*partitionRun
	w.mu.Lock()
	for _, p := range ps {
		if r := w.running[p]; r != nil {
			runs = append(runs, r)
			delete(w.running, p)
		}
	}
	w.mu.Unlock()
	for _, r := range runs {
		r.cancel()
	}
	for _, r := range runs {
		<-r.done
	}
}

func (w *Worker) updateLag(ctx context.Context) {
	var pending uint64
	for _, p := range w.Owned() {
		c, err := w.inStream.Consumer(ctx, consumerName(p))
		if err != nil {
			continue
		}
		if info, err := c.Info(ctx); err == nil {
			pending += info.NumPending
		}
	}
	w.metrics.Lag.Set(float64(pending))
}

// consumerName is the durable pull consumer of partition p.
func consumerName(p int) string { return "converge-p" + strconv.Itoa(p) }

// resetConsumer recreates partition p's consumer so that it delivers from
// start (or, when start is 0, from just after its ack floor). Ownership
// moves and failed inputs go through here, so no input of a group is ever
// delivered after a later one that is not yet done: a consumer is never
// left with unacknowledged input it would redeliver out of order.
func (w *Worker) resetConsumer(ctx context.Context, p int, start uint64) (jetstream.Consumer, error) {
	name := consumerName(p)
	if start == 0 {
		start = 1
		if c, err := w.inStream.Consumer(ctx, name); err == nil {
			if info, err := c.Info(ctx); err == nil {
				start = info.AckFloor.Stream + 1
			}
		}
	}
	if err := w.inStream.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("delete consumer: %w", err)
	}
	filter, err := subject.InputPartition(p)
	if err != nil {
		return nil, err
	}
	c, err := w.inStream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       name,
		FilterSubject: filter,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   start,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       time.Minute,
		MaxAckPending: 1024,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer: %w", err)
	}
	return c, nil
}

// partition is the state of one owned partition: its loaded groups and when
// each group next has messages to expire.
type partition struct {
	id     int
	groups map[string]*loadedGroup // by <tenant>.<group>
	expiry map[string]int64        // by <tenant>.<group>
	// expiryDirty is set when expiry changed since it was last saved.
	expiryDirty bool
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
	if msgpack.Unmarshal(e.Value(), &idx) != nil {
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

func (w *Worker) runPartition(ctx context.Context, p int) {
	part := &partition{id: p, groups: map[string]*loadedGroup{}, expiry: map[string]int64{}}
	w.loadExpiry(ctx, part)
	defer func() {
		// Hand the index to the next owner even when ctx has ended.
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		w.saveExpiry(sctx, part)
	}()
	var cons jetstream.Consumer
	var restart uint64
	backoff := 100 * time.Millisecond
	lastCleanup := time.Time{}
	for ctx.Err() == nil {
		if cons == nil {
			var err error
			if cons, err = w.resetConsumer(ctx, p, restart); err != nil {
				w.log.Warn("converge: consumer", "partition", p, "err", err)
				sleep(ctx, backoff)
				continue
			}
			restart = 0
		}
		batch, err := cons.Fetch(fetchBatch, jetstream.FetchMaxWait(w.cfg.CleanupInterval))
		if err != nil {
			cons = nil
			sleep(ctx, backoff)
			continue
		}
		msgs := batch.Messages()
		for open := true; open; {
			first, ok := <-msgs
			if !ok {
				break
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
					pending = append(pending, m)
				default:
					break drain
				}
			}
			if restart != 0 {
				continue // drain the rest of a batch after a failure
			}
			restart = w.handle(ctx, part, pending)
			if ctx.Err() != nil {
				return
			}
		}
		if restart != 0 {
			cons = nil
			sleep(ctx, backoff)
			continue
		}
		if now := w.cfg.Now(); now.Sub(lastCleanup) >= w.cfg.CleanupInterval {
			lastCleanup = now
			w.cleanup(ctx, part)
		}
		w.saveExpiry(ctx, part)
	}
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
}

// handle processes fetched input messages: each group's in stream order,
// exactly once, behind the fence, and acknowledges them. It returns 0, or
// the stream sequence to redeliver from after a failure.
func (w *Worker) handle(ctx context.Context, part *partition, msgs []jetstream.Msg) uint64 {
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
	var restart uint64
	for _, r := range runs {
		done, err := w.handleRun(ctx, part, r.tenant, r.groupHex, r.ins)
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
	_, tenant, groupHex, err := subject.ParseStoredInput(msg.Subject())
	if err != nil {
		return input{}, "", "", err
	}
	id, err := hex.DecodeString(msg.Headers().Get(ingest.HeaderMessageID))
	if err != nil || len(id) != sha256.Size {
		return input{}, "", "", errors.New("input without a message id")
	}
	return input{
		Seq:       meta.Sequence.Stream,
		Class:     schema.InputClass(msg.Headers().Get(ingest.HeaderClass)),
		MessageID: id,
		Data:      msg.Data(),
		Time:      meta.Timestamp.UnixMilli(),
	}, tenant, groupHex, nil
}

// maxTxnInputs bounds the inputs of one transaction.
const maxTxnInputs = 64

// txnName names the transaction that ends with the input at seq.
func txnName(seq uint64) string { return "in:" + strconv.FormatUint(seq, 10) }

// handleRun applies a group's inputs, in order, in as few transactions as
// fit one atomic batch each. It returns how many inputs are done.
func (w *Worker) handleRun(ctx context.Context, part *partition, tenant, groupHex string, ins []input) (int, error) {
	done := 0
	for done < len(ins) {
		start := time.Now()
		var used int
		err := w.transact(ctx, part, tenant, groupHex, func(ctx context.Context, t *txn, g *loadedGroup) (bool, error) {
			used = 0
			applied := false
			for _, in := range ins[done:] {
				if in.Seq <= g.ck.InputSeq {
					// Done before, by this worker before a crash or by
					// another; the outcomes of the checkpoint's own
					// transaction may not have been published yet.
					if g.ck.Txn == txnName(in.Seq) {
						if err := w.republish(ctx, g); err != nil {
							return false, err
						}
					}
					used++
					continue
				}
				if applied && (used >= maxTxnInputs || len(t.events)+eventBudget(t) > eventbus.MaxBatch-1) {
					break
				}
				if err := t.run(ctx, linear{}, in); err != nil {
					return false, err
				}
				t.inputSeq, t.name = in.Seq, txnName(in.Seq)
				applied = true
				used++
			}
			return applied, nil
		})
		if err != nil {
			return done, err
		}
		for range used {
			w.metrics.Latency.Observe(time.Since(start).Seconds())
		}
		done += used
	}
	return done, nil
}

// eventBudget is the most events one more input can add: a commit can give
// every active member a removal, a membership, a metadata and a pause event.
func eventBudget(t *txn) int { return 4*len(t.g.active()) + 4 }

// republish publishes the outcome records and group entries of a group's
// newest transaction again.
func (w *Worker) republish(ctx context.Context, g *loadedGroup) error {
	if err := w.publishOutcomes(ctx, g.tenant, g.ck.Outcomes); err != nil {
		return err
	}
	return w.publishGroup(ctx, g.tenant, g.groupHex, g.state, g.ckSeq)
}

// cleanup runs the disappearing-messages pass over the owned groups with a
// due expiry (META-063).
func (w *Worker) cleanup(ctx context.Context, part *partition) {
	now := w.cfg.Now().UnixMilli()
	for key, at := range part.expiry {
		if at == 0 || at > now {
			continue
		}
		tenant, groupHex, ok := splitGroupKey(key)
		if !ok {
			part.setExpiry(key, 0)
			continue
		}
		err := w.transact(ctx, part, tenant, groupHex, func(_ context.Context, t *txn, _ *loadedGroup) (bool, error) {
			t.now, t.name = now, "exp:"+strconv.FormatInt(now, 10)
			return t.expire(), nil
		})
		if err != nil {
			w.log.Warn("converge: cleanup pass failed", "err", err)
			continue
		}
		w.metrics.Expirations.Inc()
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
		return g, nil
	}
	ck, seq, err := readCheckpoint(ctx, w.js, tenant, groupHex)
	if err != nil {
		return nil, err
	}
	g := &loadedGroup{tenant: tenant, groupHex: groupHex, ck: ck, ckSeq: seq, members: map[string]MemberState{}}
	if seq == 0 {
		gid, err := hex.DecodeString(groupHex)
		if err != nil {
			return nil, fmt.Errorf("group id: %w", err)
		}
		g.state = newGroupState(tenant, gid)
	} else {
		e, err := w.conv.Get(ctx, ck.State)
		if err != nil {
			return nil, fmt.Errorf("load group state: %w", err)
		}
		if g.state, err = decodeGroupState(e.Value()); err != nil {
			return nil, err
		}
		for client, bk := range ck.Members {
			e, err := w.conv.Get(ctx, bk)
			if err != nil {
				return nil, fmt.Errorf("load member state: %w", err)
			}
			st, err := w.cfg.MLS.Restore(ctx, Client{Tenant: tenant, ClientID: client}, e.Value())
			if err != nil {
				return nil, fmt.Errorf("restore member state: %w", err)
			}
			g.members[client] = st
		}
	}
	part.remember(key, g)
	part.setExpiry(key, ck.NextExpiry)
	return g, nil
}

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
		t := &txn{tenant: tenant, g: g.state, members: g.members, dirty: map[string]bool{}, ratchet: map[string]bool{}, now: w.cfg.Now().UnixMilli(), mls: w.cfg.MLS, dir: w.dir}
		changed, err := body(ctx, t, g)
		if err != nil || !changed {
			delete(part.groups, key) // the body may have moved ratchets
			return err
		}
		next, events, written, err := w.prepare(ctx, g, t)
		if err != nil {
			delete(part.groups, key)
			w.purge(ctx, written)
			return err
		}
		ckSeq, err := commitBatch(ctx, w.js, tenant, groupHex, g.ckSeq, next, events)
		delete(part.groups, key)
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
		// An outcome that did not reach FABRIC_OUTCOMES fails the input;
		// its retry finds the transaction done and publishes them again.
		return w.committed(ctx, part, g, t, next, ckSeq, events)
	}
	return fmt.Errorf("converge: transaction fenced %d times", commitAttempts)
}

// prepare writes the state blobs of a transaction and builds its checkpoint
// and events. Nothing it writes is current until the checkpoint commits;
// it returns the keys it wrote, so a failed commit can remove them.
func (w *Worker) prepare(ctx context.Context, g *loadedGroup, t *txn) (checkpoint, []eventbus.Event, []string, error) {
	next := checkpoint{InputSeq: g.ck.InputSeq, Txn: t.name, Members: map[string]string{}, Outcomes: t.notes, Worker: w.cfg.WorkerID}
	if t.inputSeq != 0 {
		next.InputSeq = t.inputSeq
	}
	blobs := map[string][]byte{}
	for _, m := range t.g.active() {
		bk, ok := g.ck.Members[m.ClientID]
		save := t.dirty[m.ClientID] || !ok
		if !save && t.ratchet[m.ClientID] {
			// A ratchet advance alone may wait: an older snapshot ratchets
			// forward to any later message (RFC 9420 section 9.1).
			m.Unsaved++
			save = m.Unsaved >= w.cfg.SnapshotEvery
		}
		if save {
			m.Unsaved = 0
			snap, err := t.members[m.ClientID].Snapshot()
			if err != nil {
				return checkpoint{}, nil, nil, fmt.Errorf("snapshot member: %w", err)
			}
			if bk, err = blobKey(g.tenant, g.groupHex, m.ClientID); err != nil {
				return checkpoint{}, nil, nil, err
			}
			blobs[bk] = snap
		}
		next.Members[m.ClientID] = bk
	}
	// The group state goes last: the loop above counts unsaved ratchets.
	sb, err := t.g.encode()
	if err != nil {
		return checkpoint{}, nil, nil, err
	}
	if next.State, err = blobKey(g.tenant, g.groupHex, ""); err != nil {
		return checkpoint{}, nil, nil, err
	}
	blobs[next.State] = sb
	written, err := w.putBlobs(ctx, blobs)
	if err != nil {
		return checkpoint{}, nil, written, err
	}
	next.NextExpiry = t.g.nextExpiry()
	dmKey := dmConversationKey(t.g.components())
	events := make([]eventbus.Event, 0, len(t.events))
	for _, e := range t.events {
		var idx [8]byte
		binary.BigEndian.PutUint64(idx[:], uint64(e.Index))
		ev := eventbus.Event{
			Tenant:        g.tenant,
			ClientID:      e.Client,
			ID:            eventbus.EventID([]byte(g.tenant), []byte(e.Client), e.Cause, idx[:]),
			Event:         e.Event.ClientEvent,
			ReferencesOwn: e.Event.ReferencesOwn,
		}
		if _, names := ev.Event.GroupID(); names && dmKey != nil {
			ev.ConversationKey = dmKey
		}
		events = append(events, ev)
	}
	return next, events, written, nil
}

// unnamed returns the keys of written that the group's newest checkpoint
// does not name: after a lost fence they belong to no state.
func (w *Worker) unnamed(ctx context.Context, tenant, groupHex string, written []string) []string {
	ck, _, err := readCheckpoint(ctx, w.js, tenant, groupHex)
	if err != nil {
		return nil // unsure: keep them
	}
	var out []string
	for _, k := range written {
		if k != ck.State && !slices.Contains(slices.Collect(maps.Values(ck.Members)), k) {
			out = append(out, k)
		}
	}
	return out
}

// purge removes state blobs no checkpoint names. It does not wait: a blob
// that stays is only space, never state.
func (w *Worker) purge(ctx context.Context, keys []string) {
	for _, k := range keys {
		m := nats.NewMsg(kvSubject(streams.BucketConverge, k))
		m.Header.Set("KV-Operation", "PURGE")
		m.Header.Set("Nats-Rollup", "sub")
		if _, err := w.js.PublishMsgAsync(m); err != nil {
			w.log.Debug("converge: purge blob", "err", err)
		}
	}
}

// kvSubject is the stream subject of a KV key.
func kvSubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// putBlobs writes state blobs to fabric-converge in parallel and waits for
// every acknowledgement. It returns the keys written, also on failure.
func (w *Worker) putBlobs(ctx context.Context, blobs map[string][]byte) ([]string, error) {
	futures := make([]jetstream.PubAckFuture, 0, len(blobs))
	written := make([]string, 0, len(blobs))
	var first error
	for k, b := range blobs {
		f, err := w.js.PublishAsync(kvSubject(streams.BucketConverge, k), b)
		if err != nil {
			first = fmt.Errorf("write state blob: %w", err)
			break
		}
		written = append(written, k)
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			if first == nil {
				first = fmt.Errorf("write state blob: %w", err)
			}
		case <-ctx.Done():
			if first == nil {
				first = ctx.Err()
			}
		}
	}
	return written, first
}

// committed does what follows a committed batch: the cache, metrics,
// outcome records, the group's KV entries, and garbage collection of the
// blobs the new checkpoint no longer names. None of it affects exactly-once
// emission; a crash here is repaired by the retry of the input.
func (w *Worker) committed(ctx context.Context, part *partition, g *loadedGroup, t *txn, next checkpoint, ckSeq uint64, events []eventbus.Event) error {
	key := g.tenant + "." + g.groupHex
	part.remember(key, &loadedGroup{tenant: g.tenant, groupHex: g.groupHex, ck: next, ckSeq: ckSeq, state: t.g, members: t.members})
	part.setExpiry(key, next.NextExpiry)
	for _, e := range events {
		w.metrics.Events.WithLabelValues(string(e.Event.Kind)).Inc()
	}
	for _, n := range next.Outcomes {
		w.metrics.disposition(n)
	}
	err := w.publishOutcomes(ctx, g.tenant, next.Outcomes)
	if t.groupChanged && err == nil {
		err = w.publishGroup(ctx, g.tenant, g.groupHex, t.g, ckSeq)
	}

	var stale []string
	if g.ck.State != "" && g.ck.State != next.State {
		stale = append(stale, g.ck.State)
	}
	for c, bk := range g.ck.Members {
		if next.Members[c] != bk {
			stale = append(stale, bk)
		}
	}
	w.purge(ctx, stale)
	if ckSeq%pruneEvery == 0 {
		if err := streams.PruneCheckpoint(ctx, w.js, g.tenant, g.groupHex); err != nil {
			w.log.Debug("converge: prune checkpoints", "err", err)
		}
	}
	return err
}

func (w *Worker) publishOutcomes(ctx context.Context, tenant string, notes []outcomeNote) error {
	for _, n := range notes {
		if err := w.outcomes.publish(ctx, tenant, n); err != nil {
			return err
		}
	}
	return nil
}

// GroupRecord is the value of a group's fabric-groups entry
// (<tenant>.<group>): its active hosted members and, for a DM, its
// conversation key. CheckpointSeq orders writes: a record is replaced only
// by one of a newer checkpoint.
type GroupRecord struct {
	Members           []string `msgpack:"members"`
	DMConversationKey []byte   `msgpack:"dm_conversation_key,omitempty"`
	CheckpointSeq     uint64   `msgpack:"checkpoint_seq"`
}

// publishGroup writes the group's fabric-groups record and, when it is the
// newest, its candidate group event keys in fabric-group-keys (the format
// ingest.EncodeGroupKeys defines). A group with no active hosted member has
// neither, so ingest answers its input with unknown_group.
func (w *Worker) publishGroup(ctx context.Context, tenant, groupHex string, g *groupState, ckSeq uint64) error {
	key, err := subject.GroupKey(tenant, groupHex)
	if err != nil {
		return err
	}
	rec := GroupRecord{DMConversationKey: dmConversationKey(g.components()), CheckpointSeq: ckSeq}
	for _, m := range g.active() {
		rec.Members = append(rec.Members, m.ClientID)
	}
	var rev uint64
	e, err := w.groupsKV.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		return fmt.Errorf("read group record: %w", err)
	default:
		var old GroupRecord
		if msgpack.Unmarshal(e.Value(), &old) == nil && old.CheckpointSeq >= ckSeq {
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
	keys := make([][32]byte, 0, len(g.Keys))
	for i := len(g.Keys) - 1; i >= 0; i-- { // newest first: tried first
		var k [32]byte
		copy(k[:], g.Keys[i].Key)
		keys = append(keys, k)
	}
	kb, err := ingest.EncodeGroupKeys(keys)
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

// kvDirectory finds hosted clients in fabric-clients.
type kvDirectory struct {
	kv jetstream.KeyValue
}

func (d kvDirectory) ByKeyPackage(ctx context.Context, tenant, refHex string) (string, bool, error) {
	id, err := clientstore.LookupKeyPackage(ctx, d.kv, tenant, refHex)
	if errors.Is(err, clientstore.ErrNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return id, true, nil
}

func (d kvDirectory) Client(ctx context.Context, tenant, clientID string) (Client, error) {
	rec, err := clientstore.Lookup(ctx, d.kv, tenant, clientID)
	if err != nil {
		return Client{}, err
	}
	return Client{Tenant: tenant, ClientID: rec.ClientID, InboxID: rec.InboxID, InstallationKey: rec.InstallationKey, Sealed: rec.Installation}, nil
}
