package converge

import "github.com/nats-io/nats.go/jetstream"

// hooks are the seams the package's tests set on one worker (Config.hooks),
// so that tests running side by side never see each other's; nil, as in
// production, is no hook at all.
type hooks struct {
	// input is called with each input before it is applied: a panic in it
	// is a panic of the input's processing.
	input func(input)
	// join is told of each hosted client a Welcome joins, and whether it
	// joined the group's view with only its keys (MLS.JoinView).
	join func(client string, keyOnly bool)
	// holdFrozen is asked before a frozen pass is applied; true leaves it
	// frozen, as a crash between cutoff and apply does.
	holdFrozen func() bool
	// batchAck is given the name of each transaction whose batch was
	// published and the publish's error, and returns the error the worker
	// sees: an error for a stored batch is an ack lost on the way.
	batchAck func(txn string, err error) error
	// delivery is asked about each delivery the worker receives; false
	// drops it, as a delivery lost on the way does.
	delivery func(jetstream.Msg) bool
	// drain is asked before each batch of a pending rest is stored; an
	// error stops the drain there, as a crash does.
	drain func() error
	// maxWaiting, when positive, replaces maxWaiting.
	maxWaiting int
	// fetchBatch, when positive, replaces fetchBatch: a test fills a fetch
	// with a few inputs.
	fetchBatch int
}

func (h *hooks) onInput(in input) {
	if h != nil && h.input != nil {
		h.input(in)
	}
}

func (h *hooks) onJoin(client string, keyOnly bool) {
	if h != nil && h.join != nil {
		h.join(client, keyOnly)
	}
}

func (h *hooks) holdsFrozen() bool {
	return h != nil && h.holdFrozen != nil && h.holdFrozen()
}

func (h *hooks) onBatchAck(txn string, err error) error {
	if h == nil || h.batchAck == nil {
		return err
	}
	return h.batchAck(txn, err)
}

func (h *hooks) delivered(m jetstream.Msg) bool {
	return h == nil || h.delivery == nil || h.delivery(m)
}

func (h *hooks) beforeDrain() error {
	if h == nil || h.drain == nil {
		return nil
	}
	return h.drain()
}

func (h *hooks) waitingBound() int {
	if h != nil && h.maxWaiting > 0 {
		return h.maxWaiting
	}
	return maxWaiting
}

func (h *hooks) fetchSize() int {
	if h != nil && h.fetchBatch > 0 {
		return h.fetchBatch
	}
	return fetchBatch
}
