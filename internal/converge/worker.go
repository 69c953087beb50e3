package converge

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/engine"
)

// Defaults of Config.
const (
	DefaultLeaseTTL        = 6 * time.Second
	DefaultCleanupInterval = time.Second
	DefaultIdleAfter       = time.Minute
	// fetchBatch is how many inputs one pull asks for.
	fetchBatch = 1024
	// blobPartHeadroom is what a blob part leaves of max_payload for its
	// subject and headers; minBlobPart floors a part's size.
	blobPartHeadroom = 4 << 10
	minBlobPart      = 64 << 10
	// commitAttempts bounds the retries of one transaction that lost the
	// fence to an earlier attempt or another worker.
	commitAttempts = 5
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
	// SnapshotEvery is how many transactions that only decrypted may
	// advance a member's engine state before it is written again;
	// handshakes always write it. 1 (the default) writes it with every
	// transaction, so no message key a committed transaction consumed is
	// at rest; N keeps the keys of up to N-1 transactions (each up to
	// maxPipelineInputs messages) derivable at rest, for throughput in
	// groups with many hosted members, and a restart then ratchets forward
	// from the older snapshot.
	SnapshotEvery int
	// IdleAfter is how long a group's hosted members stay in memory after
	// the group's last transaction. Then they are dropped, and the next
	// input restores them from their stored state (a cold member is not
	// resident; docs/converge.md, Memory). DefaultIdleAfter when zero.
	IdleAfter time.Duration
	// MessageRetention is how long a message's readable record and its
	// pointer are kept (docs/read-api.md); 0, the default, keeps them
	// until the group's last record is gone. Whole seconds.
	MessageRetention time.Duration
	// MaxBatch is the atomic batch limit of the NATS servers (their
	// jetstream { limits { batch { max_msgs } } }), in messages: a
	// transaction's events and its checkpoint fit in one batch, so a
	// larger limit lets one transaction, and one state write per member,
	// cover more messages of a group with many hosted members.
	// bus.DefaultMaxBatch (the servers' default) when zero; it must
	// not exceed what the servers allow.
	MaxBatch int
	// SelfUpdateAfter is the age of a hosted member's leaf after which
	// converge runs a self-update operation for it (issue 19,
	// post-compromise security), by Now. 0, the default, is off.
	SelfUpdateAfter time.Duration
	// KeyPackagePool is how many unconsumed KeyPackages a hosted client
	// holds again after a join consumed one (issue 19): fresh ones are
	// made when it holds fewer. clientstore.DefaultKeyPackagePool when
	// zero, at most clientstore.MaxKeyPackages.
	KeyPackagePool int
	// Metrics receives measurements; a fresh unregistered set when nil.
	Metrics *Metrics
	// Logger receives diagnostics; slog.Default when nil.
	Logger *slog.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// hooks are the package's tests' seams; nil otherwise.
	hooks *hooks
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
	// vault seals the group event keys the worker stores.
	vault *engine.Vault
	dir   kvDirectory
	// sealers seal message content under each tenant's key (readable.go).
	sealers sealers
	// partBytes is the most bytes of a state blob one message carries.
	partBytes int
	// release returns the memory of dropped idle groups to the system.
	release *memoryRelease
	// failed are the inputs that fail terminally when next applied.
	failed failedInputs

	mu      sync.Mutex
	running map[int]*partitionRun
	ready   bool

	// Used by the balance loop only.
	freeRounds map[int]int  // partition → balance rounds seen free in a row
	adopted    map[int]bool // partitions taken beyond the fair share
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
	e, ok := cfg.MLS.(EngineMLS)
	if !ok {
		return nil, errBranchSelectionMLS
	}
	if e.Vault == nil {
		return nil, errors.New("converge: EngineMLS.Vault is required")
	}
	if e.Signatures == nil {
		e.Signatures = engine.NewSignatureCache(0)
	}
	if e.Welcomes == nil {
		e.Welcomes = engine.NewWelcomeCache(0)
	}
	if e.parsed == nil {
		e.parsed = &parsedWelcome{}
	}
	cfg.MLS = e
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.CleanupInterval <= 0 {
		cfg.CleanupInterval = DefaultCleanupInterval
	}
	if cfg.IdleAfter <= 0 {
		cfg.IdleAfter = DefaultIdleAfter
	}
	if cfg.SnapshotEvery <= 0 {
		cfg.SnapshotEvery = 1
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = bus.DefaultMaxBatch
	}
	if cfg.KeyPackagePool <= 0 {
		cfg.KeyPackagePool = clientstore.DefaultKeyPackagePool
	}
	if cfg.KeyPackagePool > clientstore.MaxKeyPackages {
		return nil, fmt.Errorf("converge: key package pool %d above %d", cfg.KeyPackagePool, clientstore.MaxKeyPackages)
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
	w := &Worker{cfg: cfg, js: cfg.JS, log: cfg.Logger, metrics: cfg.Metrics, running: map[int]*partitionRun{},
		freeRounds: map[int]int{}, adopted: map[int]bool{}, release: newMemoryRelease(cfg.IdleAfter)}
	var err error
	if w.inStream, err = cfg.JS.Stream(ctx, streams.StreamInput); err != nil {
		return nil, fmt.Errorf("converge: stream %s: %w", streams.StreamInput, err)
	}
	if _, err := cfg.JS.Stream(ctx, streams.StreamOutcomes); err != nil {
		return nil, fmt.Errorf("converge: stream %s: %w", streams.StreamOutcomes, err)
	}
	w.outcomes = outcomes{js: cfg.JS}
	for name, dst := range map[string]*jetstream.KeyValue{
		streams.BucketConverge: &w.conv, streams.BucketGroups: &w.groupsKV, streams.BucketGroupKeys: &w.keysKV, streams.BucketClients: &w.dir.kv,
	} {
		if *dst, err = cfg.JS.KeyValue(ctx, name); err != nil {
			return nil, fmt.Errorf("converge: bucket %s: %w", name, err)
		}
	}
	if e, ok := cfg.MLS.(EngineMLS); ok {
		w.vault, w.dir.vault = e.Vault, e.Vault
	}
	w.dir.pool = cfg.KeyPackagePool
	// A blob part leaves room under the server's max_payload for the
	// message's subject and headers.
	w.partBytes = max(int(cfg.JS.Conn().MaxPayload())-blobPartHeadroom, minBlobPart)
	w.leases = newLeases(w.conv, cfg.WorkerID, cfg.LeaseTTL, cfg.Partitions)
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
	// Run returns only once ctx has ended, which stops the releases.
	var releases sync.WaitGroup
	releases.Go(func() { w.release.run(ctx, w.metrics.MemoryReleases, w.log) })
	defer releases.Wait()
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
	lost, err := w.leases.renewAll(ctx, w.Owned())
	for _, p := range lost {
		w.log.Warn("converge: partition lease lost", "partition", p)
		w.stop(p)
		delete(w.adopted, p)
	}
	if err != nil {
		return err
	}
	n, contested, err := w.leases.liveWorkers(ctx)
	if err != nil {
		return err
	}
	share := (len(w.cfg.Partitions) + n - 1) / n
	var owned []int
	for _, p := range w.Owned() {
		if !w.adopted[p] {
			owned = append(owned, p)
		}
	}
	if len(owned) > share {
		// Give up first what another worker can take.
		slices.SortStableFunc(owned, func(a, b int) int {
			switch {
			case contested[a] == contested[b]:
				return 0
			case contested[a]:
				return 1
			}
			return -1
		})
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
	if err := w.adoptOrphans(ctx); err != nil {
		return err
	}
	w.metrics.Owned.Set(float64(len(w.Owned())))
	w.updateLag(ctx)
	w.mu.Lock()
	w.ready = true
	w.mu.Unlock()
	return nil
}

// orphanRounds is how many balance rounds in a row a partition must be
// free before a worker over its share adopts it: long enough (4/3 of a
// lease TTL) for a worker under its share to take it first.
const orphanRounds = 4

// adoptOrphans takes, beyond the fair share, every partition whose lease
// has been free for orphanRounds balance rounds in a row: workers with different
// partition sets can leave one to nobody, and an input must never wait for
// ever. An adopted partition is not given up to rebalancing.
func (w *Worker) adoptOrphans(ctx context.Context) error {
	for _, p := range w.cfg.Partitions {
		if w.owns(p) {
			delete(w.freeRounds, p)
			continue
		}
		free, err := w.leases.free(ctx, p)
		if err != nil {
			return err
		}
		if !free {
			delete(w.freeRounds, p)
			continue
		}
		if w.freeRounds[p]++; w.freeRounds[p] < orphanRounds {
			continue
		}
		ok, err := w.leases.tryAcquire(ctx, p)
		if err != nil {
			return err
		}
		if ok {
			w.adopted[p] = true
			w.start(ctx, p)
		}
		delete(w.freeRounds, p)
	}
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
		c, err := w.inStream.Consumer(ctx, ConsumerName(p))
		if err != nil {
			continue
		}
		if info, err := c.Info(ctx); err == nil {
			pending += info.NumPending
		}
	}
	w.metrics.Lag.Set(float64(pending))
}

// ConsumerName is the durable pull consumer of partition p.
func ConsumerName(p int) string { return "converge-p" + strconv.Itoa(p) }

// resetConsumer recreates partition p's consumer so that it delivers from
// start (or, when start is 0, from just after its ack floor). Ownership
// moves and failed inputs go through here, so no input of a group is ever
// delivered after a later one that is not yet done: a consumer is never
// left with unacknowledged input it would redeliver out of order. It
// returns the consumer and the stream sequence it delivers from; a
// delivery that never arrives is caught at the next (deliveries).
func (w *Worker) resetConsumer(ctx context.Context, p int, start uint64) (jetstream.Consumer, uint64, error) {
	name := ConsumerName(p)
	if start == 0 {
		start = 1
		if c, err := w.inStream.Consumer(ctx, name); err == nil {
			if info, err := c.Info(ctx); err == nil {
				start = info.AckFloor.Stream + 1
			}
		}
	}
	if err := w.inStream.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, 0, fmt.Errorf("delete consumer: %w", err)
	}
	filter, err := subject.InputPartition(p)
	if err != nil {
		return nil, 0, err
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
		return nil, 0, fmt.Errorf("create consumer: %w", err)
	}
	return c, start, nil
}
