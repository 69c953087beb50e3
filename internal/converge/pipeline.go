package converge

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
)

// pipeline applies and commits the inputs of a fetch that all belong to one
// group. Storing an atomic batch takes about the same time whatever its
// size (the server stages it in a file store of its own), so while one
// transaction's batch is in flight the next inputs are applied to the
// in-memory state, and that next transaction is cut when the batch before
// it has been stored (or it is full). Its state blobs are written before
// that, and its batch is fenced on the checkpoint the one before stored.
// Outcome records follow each batch and are awaited before the run's
// inputs count as done. Nothing of a transaction is visible before its
// batch, and a transaction that fails takes every later one of the run
// with it: the per-group path reloads the group and retries from the first
// input not done (r.done).
func (w *Worker) pipeline(ctx context.Context, part *partition, r *groupRun, pull puller) {
	key := r.tenant + "." + r.groupHex
	g, err := w.load(ctx, part, r.tenant, r.groupHex)
	if err != nil {
		return
	}
	var flights []*flight
	defer func() { w.finish(ctx, part, r, flights) }()
	// inFlight is the last launched flight not yet known stored.
	var inFlight *flight
	// stop drops what a transaction that will not commit wrote and the
	// cache, which may hold its state.
	stop := func(written []string) {
		w.purge(ctx, written)
		if inFlight != nil {
			w.land(ctx, part, inFlight)
		}
		delete(part.groups, key)
	}
	// more waits, while a batch is in flight, for the next input of the
	// group to arrive in this fetch, and appends it to the run.
	more := func() bool {
		if pull == nil || inFlight == nil {
			return false
		}
		return pull(func(m jetstream.Msg) bool {
			in, tenant, groupHex, err := parseInput(m)
			if err != nil || tenant != r.tenant || groupHex != r.groupHex {
				return false
			}
			r.ins, r.msgs = append(r.ins, in), append(r.msgs, m)
			return true
		}, inFlight.stored)
	}
	for i := 0; i < len(r.ins) || more(); {
		t := w.newTxn(ctx, r.tenant, g)
		from, applied := i, false
		for i < len(r.ins) || (applied && more()) {
			if applied && (i-from >= maxPipelineInputs || t.size()+eventBudget(t) > w.cfg.MaxBatch-1 || (inFlight != nil && inFlight.isStored() && i-from >= minPipelineInputs)) {
				break
			}
			used, app, err := w.applyRun(ctx, t, g, r.ins[i:i+1])
			if err != nil {
				stop(nil)
				return
			}
			i += used
			applied = applied || app
			if t.groupChanged {
				// The group's KV entries are written in checkpoint order:
				// nothing is applied past a change of them until it lands.
				break
			}
		}
		if !applied {
			// Done before, all of them: only ever the first inputs of the
			// run, which precede anything this run applies.
			r.done = i
			continue
		}
		start := time.Now()
		next, events, ix, written, err := w.prepare(ctx, g, t)
		if err != nil || !w.fits(events, ix) {
			// One batch too large is the per-group path's to split.
			stop(written)
			return
		}
		// Outcome records of earlier flights not yet stored ride in this
		// checkpoint too: a retry republishes the newest checkpoint's, so
		// none is lost when they fail after this batch commits.
		next.Outcomes = append(unconfirmed(flights), next.Outcomes...)
		if inFlight != nil {
			ok := w.land(ctx, part, inFlight)
			if !ok {
				inFlight = nil
				stop(written)
				return
			}
			g.ckSeq, inFlight = inFlight.seq, nil
		}
		f := &flight{g: g, t: t, next: next, events: events, ix: ix, written: written, from: from, to: i, start: start}
		if len(flights) > 0 {
			f.after = flights[len(flights)-1]
		}
		w.launch(ctx, f)
		flights = append(flights, f)
		inFlight = f
		// The next transaction starts from this one's checkpoint; its
		// sequence is known when this one is stored.
		g = &loadedGroup{tenant: g.tenant, groupHex: g.groupHex, ck: next, state: t.g, members: t.members, chunks: t.chunks}
		if t.groupChanged {
			ok := w.land(ctx, part, inFlight)
			if !ok {
				return
			}
			g.ckSeq, inFlight = inFlight.seq, nil
		}
	}
	if inFlight != nil {
		w.land(ctx, part, inFlight)
	}
}

// puller hands a pipelined run the next input message of its fetch: it
// waits until one arrives or stop is closed, and reports whether take took
// it (a message take refuses is kept for the next batch of the fetch).
type puller func(take func(jetstream.Msg) bool, stop <-chan struct{}) bool

// minPipelineInputs is how many inputs a pipelined transaction takes, when
// they are there, before the batch before it being stored cuts it. Every
// transaction has a fixed cost: it writes the state of each member it
// touched, and the server stages its atomic batch in a file store of its
// own on an R1 stream (a directory and files created, about 2.4 ms of CPU
// in a profile). Cut every few dozen inputs, that cost was a tenth of the
// CPU a one-member group's messages took.
const minPipelineInputs = 256

// maxPipelineInputs bounds the inputs of one pipelined transaction. One
// event per input per member must fit one atomic batch anyway; the bound
// keeps a checkpoint's outcome list small.
const maxPipelineInputs = 512

// flight is one transaction whose atomic batch is being stored while the
// partition goroutine applies the next inputs.
type flight struct {
	g       *loadedGroup // the group as the transaction found it
	t       *txn
	next    checkpoint
	events  []bus.Event
	ix      []*nats.Msg
	written []string
	// from and to delimit the run's inputs it applies: once it commits,
	// the first to inputs of the run are done.
	from, to int
	start    time.Time
	// stored is closed when the batch is answered (seq, err set), done
	// when the outcome records are too (outErr set).
	stored, done chan struct{}
	seq          uint64
	err, outErr  error
	// landed is set by land when the batch committed.
	landed bool
	// after is the run's flight before this one: its outcome records are
	// stored first, so an input decided twice in one run (deferred, then
	// accepted) ends with its later decision, at the next revision.
	after *flight
}

// launch stores a prepared transaction's batch, fenced on the checkpoint
// the transaction found, and then its outcome records, on a goroutine that
// finish waits for.
func (w *Worker) launch(ctx context.Context, f *flight) {
	f.stored, f.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(f.done)
		f.seq, f.err = commitBatch(ctx, w.js, w.cfg.MaxBatch, f.g.tenant, f.g.groupHex, f.g.ckSeq, f.next, f.events, f.ix)
		close(f.stored)
		if f.after != nil {
			<-f.after.done
		}
		if f.err != nil {
			return
		}
		// The outcome records go right after the batch, before the inputs
		// are acknowledged; a crash before they are stored leaves the
		// input unacknowledged, and its retry republishes them.
		ow, err := w.outcomes.start(ctx, f.g.tenant, f.next.Outcomes)
		if err == nil {
			err = ow.await(ctx)
		}
		f.outErr = err
	}()
}

// unconfirmed returns the outcome notes of the flights whose records are
// not known stored.
func unconfirmed(flights []*flight) []outcomeNote {
	var out []outcomeNote
	for _, f := range flights {
		select {
		case <-f.done:
			if f.outErr == nil {
				continue
			}
		default:
		}
		out = append(out, f.t.notes...)
	}
	return out
}

// isStored reports whether f's batch has been answered.
func (f *flight) isStored() bool {
	select {
	case <-f.stored:
		return true
	default:
		return false
	}
}

// land waits for f's batch and does what follows its commit but the
// outcome records. It reports whether f committed; when not, the cache is
// dropped and f's inputs are left to the per-group path, which reloads the
// group and skips what is done.
func (w *Worker) land(ctx context.Context, part *partition, f *flight) bool {
	<-f.stored
	key := f.g.tenant + "." + f.g.groupHex
	switch {
	case errors.Is(f.err, ErrFenced):
		w.metrics.Fenced.Inc()
		delete(part.groups, key)
		w.purge(ctx, w.unnamed(ctx, f.g.tenant, f.g.groupHex, f.written))
		return false
	case f.err != nil:
		// The batch may have been stored even so (a lost ack): the blobs
		// stay, for the checkpoint that may name them.
		delete(part.groups, key)
		return false
	}
	w.metrics.Batches.WithLabelValues("1").Inc()
	w.afterCommit(ctx, part, f.g, f.t, f.next, f.seq, f.events)
	if f.t.groupChanged {
		if err := w.publishGroup(ctx, f.g.tenant, f.g.groupHex, f.t.g, f.seq); err != nil {
			// Committed; the retry of its inputs republishes the entries.
			delete(part.groups, key)
			return false
		}
	}
	if err := w.consumeKeyPackages(ctx, f.g.tenant, f.next.Consumed); err != nil {
		delete(part.groups, key)
		return false
	}
	f.landed = true
	return true
}

// finish waits for every flight of a run and counts the inputs done: those
// of each flight, in order, that committed with its outcome records and
// group entries stored.
func (w *Worker) finish(ctx context.Context, part *partition, r *groupRun, flights []*flight) {
	ok := true
	for _, f := range flights {
		<-f.done
		if !ok || !f.landed || f.outErr != nil {
			if ok {
				delete(part.groups, f.g.tenant+"."+f.g.groupHex)
			}
			ok = false
			continue
		}
		r.done = f.to
		for range f.to - f.from {
			w.metrics.Latency.Observe(time.Since(f.start).Seconds())
		}
	}
}

// parallel runs fn(0) … fn(n-1) on up to GOMAXPROCS goroutines and returns
// when all have returned. Each call must touch only its own index. A panic
// of a call is raised again in the caller's goroutine once all have
// returned, where the input's recovery finds it (failinput.go).
func parallel(n int, fn func(i int)) {
	workers := min(n, runtime.GOMAXPROCS(0))
	if workers <= 1 {
		for i := range n {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var panicked atomic.Pointer[any]
	for range workers {
		wg.Go(func() {
			defer func() {
				if v := recover(); v != nil {
					panicked.CompareAndSwap(nil, &v)
				}
			}()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				fn(i)
			}
		})
	}
	wg.Wait()
	if v := panicked.Load(); v != nil {
		panic(*v)
	}
}
