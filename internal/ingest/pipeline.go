package ingest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/binding"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// step is what the pipeline does next with an input.
type step int

const (
	stepReject step = iota + 1 // record the category; done
	stepRetain                 // retain on FABRIC_RETAINED for reason
	stepEnter                  // publish create-if-absent (the dedup)
	stepDone                   // the result is final and recorded
	stepKeep                   // a retained input that still cannot go on
)

// Reasons an object is retained; they are the last token of its
// fabric.retained subject and label values of the retained metrics.
const (
	reasonDeferred = string(schema.CategoryTransportDeferred)
	reasonUnknown  = string(schema.CategoryUnknownGroup)
)

// classUnpeeled is the class recorded for a sealed object no key has opened
// yet: it is not yet an MLSMessage.
const classUnpeeled = schema.ClassSealed

// input is one transport message on its way through the pipeline.
type input struct {
	msg schema.TransportMessage
	// retained is set when the input was re-offered from FABRIC_RETAINED.
	retained bool
	// transportID is SHA-256 of a sealed payload.
	transportID [sha256.Size]byte
	keyGen      uint64 // generation of the key set the peel tried
	mls         []byte
	id          [sha256.Size]byte
	idHex       string // id in hex, once enter needs it (hexID)
	class       schema.InputClass
	groupHex    string
	groupKey    string // <tenant>.<group>
	reason      string // for stepRetain
	step        step
	res         Result
}

func (in *input) settle(st step, status schema.OutcomeStatus, cat schema.Category) {
	in.step = st
	in.res = Result{MessageID: in.id[:], Status: status, Category: cat}
}

func (in *input) reject(cat schema.Category) { in.settle(stepReject, schema.StatusRejected, cat) }

// hexID is the message id in hex, encoded once: the dedup read's outcome
// subject and the input subject carry it.
// It is only called once the id is settled (after prepare).
func (in *input) hexID() string {
	if in.idHex == "" {
		in.idHex = hex.EncodeToString(in.id[:])
	}
	return in.idHex
}

// hexIDs puts the message ids of ins in hex, all in one allocation: the
// dedup read and the writes of a request need every one of them.
func hexIDs(ins []*input) {
	buf := make([]byte, 0, len(ins)*hex.EncodedLen(sha256.Size))
	for _, in := range ins {
		buf = hex.AppendEncode(buf, in.id[:])
	}
	all := string(buf)
	const n = 2 * sha256.Size
	for i, in := range ins {
		in.idHex = all[i*n : (i+1)*n]
	}
}

// shareGroups gives each input the group's hex and key of the input before
// it when both name the same group: a request's inputs are mostly for one
// group, so these are made once, not once each. The others get them in
// peelAndClassify.
func shareGroups(tenant string, ins []*input) {
	for i, in := range ins {
		if i > 0 && ins[i-1].groupKey != "" && bytes.Equal(in.msg.Group, ins[i-1].msg.Group) {
			in.groupHex, in.groupKey = ins[i-1].groupHex, ins[i-1].groupKey
			continue
		}
		groupHex := hex.EncodeToString(in.msg.Group)
		if key, err := subject.GroupKey(tenant, groupHex); err == nil {
			in.groupHex, in.groupKey = groupHex, key
		}
	}
}

// prepare peels and classifies an input and decides its next step. It does
// no I/O. Whatever the bytes, it does not take the worker down: a panic in
// a decoder is contained and the input fails closed as invalid_encoding.
func (s *Service) prepare(tenant string, in *input) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("decoder panicked on input; rejected as invalid_encoding")
			in.id = sha256.Sum256(in.msg.Payload)
			in.class = schema.ClassMalformed
			in.reject(schema.CategoryInvalidEncoding)
		}
	}()
	s.peelAndClassify(tenant, in)
}

func (s *Service) peelAndClassify(tenant string, in *input) {
	if in.groupKey == "" {
		in.groupHex = hex.EncodeToString(in.msg.Group)
		key, err := subject.GroupKey(tenant, in.groupHex)
		if err != nil {
			// Intake checks tenant and group length; this is a guard.
			in.id = sha256.Sum256(in.msg.Payload)
			in.class = schema.ClassMalformed
			in.reject(schema.CategoryWrongRecipient)
			return
		}
		in.groupKey = key
	}
	key := in.groupKey
	var err error
	mls := []byte(in.msg.Payload)
	if in.msg.Kind == schema.TransportSealed {
		in.transportID = sha256.Sum256(in.msg.Payload)
		keys, gen := s.dir.candidateKeys(key)
		in.keyGen = gen
		mls, err = binding.Peel(in.msg, keys)
		if err != nil {
			in.id = in.transportID
			in.class = classUnpeeled
			var be *binding.Error
			if errors.As(err, &be) && be.Category == schema.CategoryTransportDeferred {
				in.reason = reasonDeferred
				in.settle(stepRetain, schema.StatusDeferred, schema.CategoryTransportDeferred)
				return
			}
			in.class = schema.ClassMalformed
			in.reject(schema.CategoryInvalidEncoding)
			return
		}
	}
	in.mls = mls
	cls, err := engine.Classify(mls)
	if err != nil {
		in.id = engine.NewMessageID(mls)
		cat := engine.CategoryOf(err)
		in.class = schema.ClassUnsupported
		if cat == "" || cat == schema.CategoryInvalidEncoding {
			cat = schema.CategoryInvalidEncoding
			in.class = schema.ClassMalformed
		}
		in.reject(cat)
		return
	}
	in.id = cls.MessageID
	in.class = cls.Class
	switch cls.Class {
	case schema.ClassWelcome:
		// A welcome goes to the group its hint names; it is what makes a
		// group known, so it skips the known-group check.
		in.settle(stepEnter, schema.StatusQueued, "")
		return
	case schema.ClassCommit, schema.ClassProposal, schema.ClassApplication:
		if !bytes.Equal(cls.GroupID, in.msg.Group) {
			// Routed to a group the MLS message does not belong to.
			in.reject(schema.CategoryWrongRecipient)
			return
		}
	default:
		// A GroupInfo or KeyPackage is not group input.
		in.reject(schema.CategoryUnsupportedRequiredFeature)
		return
	}
	if !s.dir.known(key) {
		in.reason = reasonUnknown
		in.settle(stepRetain, schema.StatusRejected, schema.CategoryUnknownGroup)
		return
	}
	in.settle(stepEnter, schema.StatusQueued, "")
}

// prepareAll prepares a request's inputs; a large batch is split over the
// CPUs. It does no I/O.
func (s *Service) prepareAll(tenant string, ins []*input) {
	shareGroups(tenant, ins)
	const perWorker = 64 // below this a goroutine costs more than it saves
	n := min(runtime.GOMAXPROCS(0), (len(ins)+perWorker-1)/perWorker)
	if n <= 1 {
		for _, in := range ins {
			s.prepare(tenant, in)
		}
		return
	}
	chunk := (len(ins) + n - 1) / n
	var wg sync.WaitGroup
	for lo := 0; lo < len(ins); lo += chunk {
		part := ins[lo:min(lo+chunk, len(ins))]
		wg.Go(func() {
			for _, in := range part {
				s.prepare(tenant, in)
			}
		})
	}
	wg.Wait()
}

// run takes prepared inputs to their outcome: rejections and retentions are
// recorded, the rest deduplicated and published. The writes of one request
// are pipelined: the rejection records are sent first and awaited last. An
// error means some input may not have been handled; none was acknowledged,
// and a retry is safe.
func (s *Service) run(ctx context.Context, tenant string, ins []*input) error {
	var enter, retain []*input
	var rejects []pendingOutcome
	hosted := map[string]bool{} // directory misses confirmed in this run
	for _, in := range ins {
		switch in.step {
		case stepReject:
			rejects = append(rejects, pendingOutcome{rec: s.record(in)})
			in.step = stepDone
		case stepRetain:
			if err := s.checkRetain(ctx, tenant, in, hosted); err != nil {
				return err
			}
			switch in.step {
			case stepEnter:
				enter = append(enter, in)
			case stepRetain:
				retain = append(retain, in)
			}
		case stepEnter:
			enter = append(enter, in)
		}
	}
	rw, err := s.startOutcomes(tenant, rejects)
	if err != nil {
		return err
	}
	if err := s.retain(ctx, tenant, retain); err != nil {
		return err
	}
	if err := s.backfillBefore(ctx, tenant, enter); err != nil {
		return err
	}
	if err := s.enter(ctx, tenant, enter); err != nil {
		return err
	}
	return s.finishOutcomes(ctx, tenant, rw)
}

// record is the outcome record an input's result makes.
func (s *Service) record(in *input) schema.Outcome {
	return schema.Outcome{
		MessageID: in.res.MessageID,
		Class:     in.class,
		Status:    in.res.Status,
		Category:  in.res.Category,
	}
}

// checkRetain looks again at an input that cannot go on yet. A group the
// directory does not know is confirmed by a read first: the watch may lag a
// record converge has just written. An unknown-group input that already
// entered convergence once is a duplicate, so its outcome is not
// overwritten; a retained input that still cannot go on stays where it is
// (stepKeep); the others stay at stepRetain.
func (s *Service) checkRetain(ctx context.Context, tenant string, in *input, hosted map[string]bool) error {
	if in.reason == reasonUnknown {
		known, ok := hosted[in.groupKey]
		if !ok {
			var err error
			if known, err = s.confirmHosted(ctx, in.groupKey); err != nil {
				return err
			}
			hosted[in.groupKey] = known
		}
		if known {
			in.settle(stepEnter, schema.StatusQueued, "")
			return nil
		}
		subj, err := subject.Outcome(tenant, hex.EncodeToString(in.id[:]))
		if err != nil {
			return fmt.Errorf("outcome subject: %w", err)
		}
		prev, err := s.readOutcome(ctx, subj)
		if err != nil {
			return err
		}
		if admitted(prev) {
			in.settle(stepDone, schema.StatusRejected, schema.CategoryDuplicate)
			return nil
		}
		// An admitted input has no record until converge writes one: the
		// stored input is its record.
		stored, err := s.storedInput(ctx, tenant, in.groupHex, hex.EncodeToString(in.id[:]))
		if err != nil {
			return err
		}
		if stored != nil {
			in.settle(stepDone, schema.StatusRejected, schema.CategoryDuplicate)
			return nil
		}
	}
	if in.retained {
		in.step = stepKeep
	}
	return nil
}

// confirmHosted reads a group's fabric-groups record from the stream leader
// after a directory miss, and puts what it finds into the directory. The
// watch can lag: converge writes the record and emits conversation.joined,
// and an app may post into the group before this worker's watch has the
// record; that input is not unknown_group.
func (s *Service) confirmHosted(ctx context.Context, key string) (bool, error) {
	m, err := bus.GetMsg(ctx, s.js, streams.KVStream(bucketGroups), bus.MsgRequest{LastBySubject: streams.KVSubject(bucketGroups, key)})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read group record: %w", err)
	}
	// A delete or purge marker has no value.
	known := len(m.Data) > 0 && s.hasMembers(m.Data)
	s.dir.setKnown(key, known, m.Sequence, true)
	return known, nil
}

// preConvergence reports whether a category is one ingest gives an input
// that may still enter convergence later.
func preConvergence(c schema.Category) bool {
	return c == schema.CategoryUnknownGroup || c == schema.CategoryTransportDeferred || c == schema.CategoryResourceRefused
}

// admitted reports whether an input's record shows that the input is on
// its group's input subject: ingest writes queued only after the input's
// publish was acknowledged, and convergence (which keeps status queued with
// a disposition, or rejects terminally) only writes about input it took
// from there. A pre-convergence rejection does not: the same bytes may
// enter later. Nor does wrong_recipient, ingest's or convergence's: it
// refuses the routing (the transport's group, a Welcome's hint), not the
// bytes, so a copy of the same bytes routed right is not its duplicate
// (docs/ingest.md, "Routing"). Ingest never writes on top of an admitted
// input's record, and an admitted input delivered again is a duplicate.
func admitted(l *latest) bool {
	if l == nil {
		return false
	}
	r := l.rec
	switch {
	case r.Status == schema.StatusQueued:
		return true
	case preConvergence(r.Category), r.Category == schema.CategoryWrongRecipient:
		return false
	}
	return r.Status == schema.StatusRejected
}

// enter deduplicates inputs and publishes the new ones onto their
// per-message input subjects. The input is its own create-if-absent dedup
// record, so an admitted input costs one acknowledged write:
//
//  1. one batched read of the inputs' current outcome records: an admitted
//     input (see admitted) is a duplicate and is not published, whatever
//     the age of the first delivery;
//  2. every input published asynchronously on
//     fabric.in.<tenant>.<group>.<message_id> with
//     Nats-Expected-Last-Subject-Sequence 0: a wrong last sequence (10071,
//     the input is already stored, however long ago) means duplicate. The
//     subject is the dedup key, inside JetStream's window and beyond it, so
//     the write carries no Nats-Msg-Id: a second dedup map on the server
//     would cost a third of the write and decide nothing the subject does
//     not;
//  3. only an input that already had a pre-convergence record (an earlier
//     unknown_group, transport_deferred or misrouted delivery) gets a queued
//     record on top of it, so the lookup does not answer the stale one.
//
// GET …/outcomes/{message_id} answers queued from the stored input while
// no record exists, so an acknowledged queued is always readable.
func (s *Service) enter(ctx context.Context, tenant string, ins []*input) error {
	if len(ins) == 0 {
		return nil
	}
	start := time.Now()
	hexIDs(ins)
	prevs, err := s.readOutcomes(ctx, tenant, ins)
	if err != nil {
		return err
	}
	s.m.stage.WithLabelValues("dedup").Observe(time.Since(start).Seconds())

	start = time.Now()
	type entry struct {
		in   *input
		prev *latest
	}
	batch := make([]entry, 0, len(ins))
	msgs := make([]*nats.Msg, 0, len(ins))
	writes := make([]nats.Msg, len(ins))
	first := make(map[[sha256.Size]byte]bool, len(ins))
	for _, in := range ins {
		prev := prevs[in.id]
		if admitted(prev) || first[in.id] {
			in.settle(stepDone, schema.StatusRejected, schema.CategoryDuplicate)
			continue
		}
		first[in.id] = true
		m := &writes[len(msgs)]
		if err := setInputMsg(m, tenant, in); err != nil {
			return err
		}
		batch = append(batch, entry{in: in, prev: prev})
		msgs = append(msgs, m)
	}
	results, err := s.pub.publish(ctx, s.js, msgs)
	if err != nil {
		return err
	}
	var recs []pending
	for i, e := range batch {
		r := results[i]
		switch {
		case isWrongLast(r.err):
			e.in.settle(stepDone, schema.StatusRejected, schema.CategoryDuplicate)
		case r.err != nil:
			return fmt.Errorf("publish input: %w", r.err)
		default:
			e.in.step = stepDone
		}
		if e.prev == nil {
			continue
		}
		// Queued also for a duplicate: the attempt that stored it may have
		// died before writing on top of the pre-convergence record.
		w := pendingOutcome{rec: schema.Outcome{MessageID: e.in.id[:], Class: e.in.class, Status: schema.StatusQueued}, prev: e.prev}
		m, err := s.prepareOutcome(tenant, &w)
		if err != nil {
			return err
		}
		if m != nil {
			recs = append(recs, publishAsync(s.js, m))
		}
	}
	for _, p := range recs {
		switch r := p.await(ctx, s.js); {
		case outcomeConflict(r):
			// A record landed after the read: converge's decision about
			// this input, which stands even when it is unknown_group, or
			// another worker's. A worker that retained the same bytes as
			// unknown_group meanwhile retries them once it sees the group
			// hosted, and then writes queued on top of its record.
		case r.err != nil:
			return fmt.Errorf("write outcome: %w", r.err)
		}
	}
	s.m.stage.WithLabelValues("publish").Observe(time.Since(start).Seconds())
	return nil
}

// inputMsg is the message that puts an input on its per-message input
// subject, created only if absent.
func inputMsg(tenant string, in *input) (*nats.Msg, error) {
	m := new(nats.Msg)
	return m, setInputMsg(m, tenant, in)
}

// inputHeaders are the headers of an input of each class that enters:
// created only if absent, and the class. They are shared by every write and
// never written to (nothing sets a header on an input message after set,
// and a publish without options adds none). The message id is not among
// them: it is the subject's last token, which converge reads, so a header
// repeating it would be stored and parsed with every input for nothing.
var inputHeaders = func() map[schema.InputClass]nats.Header {
	hs := map[schema.InputClass]nats.Header{}
	for _, c := range []schema.InputClass{schema.ClassWelcome, schema.ClassCommit, schema.ClassProposal, schema.ClassApplication} {
		hs[c] = inputHeader(c)
	}
	return hs
}()

func inputHeader(c schema.InputClass) nats.Header {
	return nats.Header{
		jetstream.ExpectedLastSubjSeqHeader: {"0"},
		bus.HeaderClass:                     {string(c)},
	}
}

// setInputMsg makes m the message of in. The messages of a request's
// writes are one allocation, not one each.
func setInputMsg(m *nats.Msg, tenant string, in *input) error {
	subj, err := subject.Input(tenant, in.groupHex, in.hexID())
	if err != nil {
		return fmt.Errorf("input subject: %w", err)
	}
	h, ok := inputHeaders[in.class]
	if !ok {
		// Only the classes above enter; this is a guard.
		h = inputHeader(in.class)
	}
	*m = nats.Msg{Subject: subj, Data: in.mls, Header: h}
	return nil
}

// storedInput reads the stored input of a message id through the stream
// leader, so that an input acknowledged a moment ago is found. With the
// group known it reads the exact subject; without, the last message on
// fabric.in.*.<tenant>.*.<message_id>, which the server answers from its
// subject index without a scan. It returns nil when there is none.
func (s *Service) storedInput(ctx context.Context, tenant, groupHex, idHex string) (*bus.StoredMsg, error) {
	var subj string
	var err error
	if groupHex != "" {
		subj, err = subject.StoredInput(tenant, groupHex, idHex)
	} else {
		subj, err = subject.InputByID(tenant, idHex)
	}
	if err != nil {
		return nil, fmt.Errorf("input subject: %w", err)
	}
	m, err := bus.GetMsg(ctx, s.js, streamIn, bus.MsgRequest{LastBySubject: subj})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read input: %w", err)
	}
	return m, nil
}
