package ingest

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Late welcome backfill: commits and messages of a group that arrive before
// the welcome that makes the group known are retained, and offered to
// convergence in their arrival order after the welcome, once a hosted
// client holds the group.
func TestLateWelcomeBackfillKeepsOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	w := e.workers[0]
	g := newGroup(t)
	welcome := invite(t, g)
	commit, err := g.Commit()
	if err != nil {
		t.Fatal(err)
	}
	app := text(t, g, "after the commit")

	res := w.submit(t, commit.Transport, app.Transport)
	wantResult(t, res[0], commit.ID, schema.StatusRejected, schema.CategoryUnknownGroup)
	wantResult(t, res[1], app.ID, schema.StatusRejected, schema.CategoryUnknownGroup)
	wantResult(t, w.submitOne(t, welcome.Transport), welcome.ID, schema.StatusQueued, "")

	e.hostGroup(g.ID()) // converge processed the welcome: bob is hosted
	eventually.True(t, "backfill", func() bool { return len(e.inputs()) == 3 })
	in := e.inputs()
	for i, want := range []testpeer.Message{welcome, commit, app} {
		if got := storedID(t, in[i]); got != hex.EncodeToString(want.ID) {
			t.Fatalf("FABRIC_IN[%d] is not the expected input", i)
		}
	}
	w.awaitOutcome(t, commit.ID, schema.StatusQueued, "", schema.ClassCommit)
}

// Input that already entered convergence is a duplicate when delivered
// again after its group stopped being hosted: its outcome is not replaced
// by unknown_group.
func TestEnteredInputStaysDuplicateWhenGroupGoes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	w := e.workers[0]
	g := newGroup(t)
	e.hostGroup(g.ID())
	m := text(t, g, "entered")
	wantResult(t, w.submitOne(t, m.Transport), m.ID, schema.StatusQueued, "")
	e.converged(m.ID, schema.ClassApplication)
	e.unhostGroup(g.ID())
	wantResult(t, w.submitOne(t, m.Transport), m.ID, schema.StatusRejected, schema.CategoryDuplicate)
	o, _ := w.outcome(t, m.ID)
	if o.Disposition != schema.DispositionAccepted {
		t.Fatalf("outcome replaced: %s/%s", o.Status, o.Category)
	}
	if n := e.retained(); n != 0 {
		t.Fatalf("FABRIC_RETAINED holds %d objects, want 0", n)
	}
}

// A worker told to stop answers every request it took, and every input it
// answered queued is on FABRIC_IN: nothing acknowledged is lost.
func TestDrainLosesNothingAcknowledged(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	w := e.workers[0]
	g := newGroup(t)
	e.hostGroup(g.ID())
	const callers, batches, size = 4, 6, 25
	bodies := make([][]byte, callers*batches)
	for i := range bodies {
		ws := make([]wire, size)
		for j := range ws {
			ws[j] = wire{V: 1, Group: g.ID(), Kind: "mls", Payload: text(t, g, "drain").MLS}
		}
		bodies[i], _ = json.Marshal(map[string]any{"messages": ws})
	}
	var (
		mu      sync.Mutex
		queued  []string
		answers int
		wg      sync.WaitGroup
		first   = make(chan struct{})
		once    sync.Once
	)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				reply, err := e.nc.Request(intakeSubject(testTenant), bodies[c*batches+b], 5*time.Second)
				if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) {
					continue // not taken: not acknowledged
				}
				if err != nil {
					t.Error(err)
					return
				}
				var r Response
				if json.Unmarshal(reply.Data, &r) != nil {
					continue // an error reply (draining): not acknowledged
				}
				mu.Lock()
				answers++
				for _, res := range r.Results {
					if res.Status == schema.StatusQueued {
						queued = append(queued, hex.EncodeToString(res.MessageID))
					}
				}
				mu.Unlock()
				once.Do(func() { close(first) })
			}
		}()
	}
	<-first
	if err := w.svc.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	stored := map[string]bool{}
	for _, m := range e.inputs() {
		stored[storedID(t, m)] = true
	}
	for _, id := range queued {
		if !stored[id] {
			t.Fatal("an input answered queued is not on FABRIC_IN")
		}
	}
	if answers == 0 || len(queued) == 0 {
		t.Fatal("no request was answered")
	}
}

// Issue 26 item 6: input that arrives while its group is unknown (its
// Welcome not yet processed) is retained; once the group is known, input
// that arrives before the retry has backfilled the retained input must not
// overtake it. The retrier is held (its lock taken, so the watch's
// schedule waits) to make the race deterministic: the group is known to
// every worker and nothing has backfilled the hello when the reply
// arrives. FABRIC_IN, whose order converge delivers and numbers in, must
// hold the inputs in the order they were sent. With two workers, the hello
// is retained by one and the reply and reaction arrive at the other.
func TestRetainedInputIsBackfilledBeforeLaterInputOfItsGroup(t *testing.T) {
	t.Parallel()
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprint("workers=", workers), func(t *testing.T) {
			e := newEnv(t, envOpts{workers: workers})
			first, last := e.workers[0], e.workers[len(e.workers)-1]
			g := newGroup(t)
			welcome := invite(t, g)
			hello := text(t, g, "hello")
			reply := text(t, g, "reply")
			react := text(t, g, "reaction")

			res := first.submit(t, welcome.Transport, hello.Transport)
			wantResult(t, res[0], welcome.ID, schema.StatusQueued, "")
			wantResult(t, res[1], hello.ID, schema.StatusRejected, schema.CategoryUnknownGroup)

			// The Welcome is processed: converge writes the group record.
			// No worker's retrier may run until the later input is in.
			for _, w := range e.workers {
				w.svc.retry.mu.Lock()
			}
			held := true
			release := func() {
				if held {
					held = false
					for _, w := range e.workers {
						w.svc.retry.mu.Unlock()
					}
				}
			}
			defer release()
			e.hostGroup(g.ID())
			wantResult(t, last.submitOne(t, reply.Transport), reply.ID, schema.StatusQueued, "")
			wantResult(t, first.submitOne(t, react.Transport), react.ID, schema.StatusQueued, "")
			release()

			want := []testpeer.Message{welcome, hello, reply, react}
			eventually.True(t, "every input on FABRIC_IN", func() bool { return len(e.inputs()) == len(want) })
			var got []string
			for _, m := range e.inputs() {
				got = append(got, storedID(t, m))
			}
			for i, m := range want {
				if got[i] != hex.EncodeToString(m.ID) {
					t.Fatalf("FABRIC_IN holds %v, want welcome, hello, reply, reaction %v", short(got), short(ids(want)))
				}
			}
			first.awaitOutcome(t, hello.ID, schema.StatusQueued, "", schema.ClassApplication)
			eventually.True(t, "retained objects released", func() bool { return e.retained() == 0 })
		})
	}
}

func ids(ms []testpeer.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = hex.EncodeToString(m.ID)
	}
	return out
}

// short is the first 8 digits of each id, to name inputs in a failure.
func short(ids []string) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id[:8]
	}
	return out
}
