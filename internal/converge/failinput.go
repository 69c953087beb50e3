package converge

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// An input that can never be applied must not stop its group (issue 26):
// retried in order, it would hold back every later input of the group, and
// a panic would take the process down with every group of it, again at
// each restart. Such an input fails terminally instead: an operation's
// record is failed with a category (a send's client gets
// message.status_changed unpublished → failed), an MLS input's outcome is
// rejected with it, and the group's next input goes on.

// Reasons an input fails terminally (label of fabric_converge_failed_inputs_total).
const (
	// failPanic: applying the input panicked (a defect): resource_refused,
	// a local refusal that claims nothing of the input itself.
	failPanic = "panic"
	// failUnpublishable: what the input produces is larger than the
	// server takes (its max payload or the stream's max message size):
	// transport_rejected, a publication refused at the transport layer.
	failUnpublishable = "unpublishable"
	// failDuplicate: the events the input makes have ids already stored
	// by another write: an operation id stored on a second group (an
	// Idempotency-Key reused before operation ids were scoped by route
	// and group). That operation already happened: the repeat is dropped,
	// and an MLS input is rejected as a duplicate.
	failDuplicate = "duplicate"
)

// inputFailure is why an input fails terminally.
type inputFailure struct {
	reason string
	cat    schema.Category
	err    error
}

// errInputFailed reports that an input was marked to fail terminally: the
// transaction holding it is dropped and the group's retry fails it.
var errInputFailed = errors.New("converge: input fails terminally")

type failedKey struct {
	tenant, groupHex string
	seq              uint64
}

// failedInputs are the inputs marked to fail terminally, by group and
// input sequence, until a transaction fails them. A mark is in memory
// only: an input whose failure was not stored before a restart is applied
// again, and marked again.
type failedInputs struct {
	mu sync.Mutex
	m  map[failedKey]inputFailure
}

func (f *failedInputs) mark(k failedKey, why inputFailure) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[failedKey]inputFailure{}
	}
	f.m[k] = why
}

// get returns the mark of an input.
func (f *failedInputs) get(k failedKey) (inputFailure, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	why, ok := f.m[k]
	return why, ok
}

// forget drops the marks of a group's inputs up to seq: a transaction
// that stored their failure was committed.
func (f *failedInputs) forget(tenant, groupHex string, seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k := range f.m {
		if k.tenant == tenant && k.groupHex == groupHex && k.seq <= seq {
			delete(f.m, k)
		}
	}
}

// apply applies one input to t, or, when it was marked, fails it. A panic
// while applying it marks it (failPanic) and returns errInputFailed: the
// transaction may be half-applied, so its caller drops it, and the
// group's retry fails the input.
func (w *Worker) apply(ctx context.Context, t *txn, g *loadedGroup, in input) (err error) {
	k := failedKey{g.tenant, g.groupHex, in.Seq}
	why, marked := w.failed.get(k)
	defer func() {
		v := recover()
		switch {
		case v == nil:
		case marked:
			// Failing it panicked too: retried in order, with backoff.
			err = fmt.Errorf("converge: failing an input panicked: %v", v)
		default:
			why := inputFailure{reason: failPanic, cat: schema.CategoryResourceRefused, err: fmt.Errorf("panic: %v", v)}
			w.log.Error("converge: applying an input panicked; it fails terminally", "tenant", g.tenant, "group", g.groupHex,
				"seq", in.Seq, "class", in.Class, "panic", v, "stack", string(debug.Stack()))
			w.markFailed(k, why)
			err = fmt.Errorf("%w: %w", errInputFailed, why.err)
		}
	}()
	if marked {
		return w.policy().fail(t, in, why)
	}
	w.cfg.hooks.onInput(in)
	return w.policy().run(ctx, t, in)
}

func (w *Worker) markFailed(k failedKey, why inputFailure) {
	w.metrics.FailedInputs.WithLabelValues(why.reason).Inc()
	w.failed.mark(k, why)
}

// unpublishable reports a commit error that no retry mends: a message of
// the batch is larger than the server takes.
func unpublishable(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, nats.ErrMaxPayload) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum)
}

// fail records an input's terminal failure: an operation fails with the
// category (a send's client gets message.status_changed unpublished →
// failed); any other input is rejected with it.
func (p marmot) fail(t *txn, in input, why inputFailure) error {
	if in.Class != bus.ClassOperation {
		t.notes = append(t.notes, rejectedNote(in.MessageID, in.Class, why.cat, in.Time))
		return nil
	}
	if why.reason == failDuplicate {
		return nil // its record is the first execution's
	}
	req, err := bus.DecodeOperation(in.Data)
	if err != nil || len(req.GroupID) == 0 {
		return nil // never stored by the API: nothing to answer
	}
	_, err = p.finish(t, in, req, "", nil, refuse(why.cat, why.err))
	return err
}
