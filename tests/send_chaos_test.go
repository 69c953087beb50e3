package tests

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/demo"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

var sendChaos = flag.Bool("send-chaos", false, "run the long send chaos test: 1,000 sends through the operations API while converge and ingest are killed with kill -9 many times")

// TestSendsExactlyOnceAcrossKills is issue 19's chaos line: a hosted
// client in a group with a real MLS test peer sends texts through the
// HTTP operations API, each with its Idempotency-Key, retrying a request
// that got no answer with the same key, as an app does; converge and
// ingest run as processes and are killed with SIGKILL at random points
// while the sends are in flight, and restarted. Every acknowledged send
// reaches the peer exactly once: the peer, reading fabric.out.<tenant>.
// <group>, decrypts each text once (none missing, none twice, no ratchet
// key used twice), and every operation's record is done, naming the
// message the peer read. The client renames the group every renameEvery
// sends too, from the same senders: the sends behind a pending rename wait
// for it, and the peer, applying each accepted commit, reads every text.
func TestSendsExactlyOnceAcrossKills(t *testing.T) {
	t.Parallel()
	sends, kills, senders, renameEvery := 50, 1, 4, 25
	if *sendChaos {
		sends, kills, senders, renameEvery = 1000, 6, 16, 100
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := binaries(t)
	began := time.Now()

	n := natstest.Start(t, natstest.OverLoopback())
	js := n.JS
	const tenant = "chaos"
	secret := []byte(strings.Repeat("j", 32))
	masterKey := sha256.Sum256([]byte("send chaos master key"))
	env := []string{
		"FABRIC_NATS_URL=" + n.Server.ClientURL(),
		"FABRIC_JWT_SECRET=" + string(secret),
		"FABRIC_MASTER_KEY=" + hex.EncodeToString(masterKey[:]),
	}

	// One ingest on a fixed address, so the app finds it again after a
	// restart; one converge worker.
	ingestAddr := freeAddr(t)
	ingestArgs := []string{"-listen", ingestAddr, "-drain-timeout", "1s"}
	runIngest := func() *process {
		p := start(t, filepath.Join(bin, "ingest"), env, ingestArgs...)
		waitReady(t, "http://"+ingestAddr+"/readyz", time.Minute)
		return p
	}
	runConverge := func() *process {
		return start(t, filepath.Join(bin, "converge"), env, "-worker-id", "a", "-listen", freeAddr(t), "-lease-ttl", "2s")
	}
	ingest, converge := runIngest(), runConverge()

	token := func(scope auth.Scope) string {
		tok, err := auth.Mint(secret, auth.Claims{Tenant: tenant, Scopes: []auth.Scope{scope}, Clients: []string{auth.AllClients}, ExpiresAt: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	base := "http://" + ingestAddr
	api := &demo.API{BaseURL: base, Tenant: tenant, AdminToken: token(auth.ScopeAdmin)}
	account := sha256.Sum256([]byte("send chaos host"))
	hosted := ok[demo.Registered](t)(api.Register(ctx, hex.EncodeToString(account[:])))
	ops := client.NewOperations(base, tenant, token(auth.ScopeSend), &http.Client{Timeout: 15 * time.Second})

	// The group: the hosted client creates it with the peer in it; the
	// peer joins from the Welcome on the outbound subject.
	bob := ok[*testpeer.Peer](t)(testpeer.New("bob"))
	name := "chaos"
	created := ok[schema.OperationAccepted](t)(ops.CreateConversation(ctx, hosted.ClientID, "create", schema.CreateConversation{Name: &name, KeyPackages: []schema.Bytes{ok[[]byte](t)(bob.KeyPackage())}}))
	group := []byte(created.GroupID)
	waitOperationsDone(t, ctx, js, tenant, [][]byte{created.OperationID}, time.Minute)
	outSubj := ok[string](t)(subject.Outbound(tenant, hex.EncodeToString(group)))
	var bg *testpeer.Group
	for _, m := range storedOn(t, ctx, js, outSubj) {
		if m.Header.Get(bus.HeaderClass) == string(schema.ClassWelcome) {
			bg = ok[*testpeer.Group](t)(bob.Join(decodeTransport(t, m.Data)))
		}
	}
	if bg == nil {
		t.Fatal("no Welcome for the peer on the outbound subject")
	}

	// The kills fall at random points of the sends: ingest's when the
	// count of acknowledged sends passes a mark, converge's when the count
	// of messages on the outbound subject does, so each falls while that
	// role has sends in hand.
	marks := func() []int {
		m := make([]int, kills)
		for i := range m {
			m[i] = 1 + rand.IntN(sends*9/10)
		}
		slices.Sort(m)
		return m
	}
	ingestMarks, convergeMarks := marks(), marks()
	var acked atomic.Int64
	opIDs := make([][]byte, sends)
	renameIDs := make([][]byte, sends/renameEvery)
	var retries atomic.Int64
	work := make(chan int)
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				key := fmt.Sprintf("send-%d", i)
				op := func() (schema.OperationAccepted, error) {
					return ops.SendText(ctx, hosted.ClientID, group, key, chaosText(i))
				}
				if i%renameEvery == renameEvery-1 {
					key = fmt.Sprintf("rename-%d", i)
					name := fmt.Sprintf("chaos %d", i)
					op = func() (schema.OperationAccepted, error) {
						return ops.UpdateConversation(ctx, hosted.ClientID, group, key, schema.ConversationChanges{Name: &name})
					}
				}
				for {
					a, err := op()
					var apiErr *client.APIError
					if err == nil && strings.HasPrefix(key, "rename") {
						renameIDs[i/renameEvery] = a.OperationID
						break
					}
					if err == nil {
						opIDs[i] = a.OperationID
						acked.Add(1)
						break
					}
					if errors.As(err, &apiErr) && apiErr.Status < 500 && apiErr.Status != http.StatusTooManyRequests || ctx.Err() != nil {
						errs <- fmt.Errorf("send %d: %w", i, err)
						return
					}
					// No answer, or not stored: the same key again.
					retries.Add(1)
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	go func() {
		defer close(work)
		for i := range sends {
			select {
			case work <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	events := ok[jetstream.Stream](t)(js.Stream(ctx, streams.StreamEvents))
	sent := func() int {
		info, err := events.Info(ctx, jetstream.WithSubjectFilter(outSubj))
		if err != nil {
			t.Fatal(err)
		}
		return int(info.State.Subjects[outSubj]) - 2 // the create's commit and Welcome
	}
	killsBy := time.Now().Add(3 * time.Minute)
	for len(ingestMarks)+len(convergeMarks) > 0 {
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		if time.Now().After(killsBy) {
			t.Fatalf("%d acknowledged, %d on the outbound subject after 3 minutes; kills left at %v and %v", acked.Load(), sent(), ingestMarks, convergeMarks)
		}
		if len(ingestMarks) > 0 && int(acked.Load()) >= ingestMarks[0] {
			ingestMarks = ingestMarks[1:]
			sigkill(ingest)
			ingest = start(t, filepath.Join(bin, "ingest"), env, ingestArgs...)
		}
		if len(convergeMarks) > 0 && sent() >= convergeMarks[0] {
			convergeMarks = convergeMarks[1:]
			sigkill(converge)
			converge = runConverge()
		}
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	acknowledged := time.Since(began)

	// Every operation ends done; then the outbound subject holds what the
	// peer reads. A rename's commits but its last lost a race.
	renames := waitOperationsDone(t, ctx, js, tenant, renameIDs, 3*time.Minute)
	lost := map[string]bool{}
	for _, r := range renames {
		for _, id := range r.MessageIDs[:len(r.MessageIDs)-1] {
			lost[hex.EncodeToString(id)] = true
		}
	}
	var sendIDs [][]byte
	var sendOf []int // the text of each of sendIDs
	for i, id := range opIDs {
		if id != nil {
			sendIDs, sendOf = append(sendIDs, id), append(sendOf, i)
		}
	}
	recs := waitOperationsDone(t, ctx, js, tenant, sendIDs, 3*time.Minute)
	byMessage := map[string]int{}
	for k, r := range recs {
		if r.Kind != schema.OpSendMessage || len(r.MessageIDs) != 1 {
			t.Fatalf("send %d: record %+v", sendOf[k], r)
		}
		byMessage[hex.EncodeToString(r.MessageIDs[0])] = sendOf[k]
	}
	seen := make([]int, sends)
	apps, commits := 0, 0
	for _, m := range storedOn(t, ctx, js, outSubj)[2:] {
		if m.Header.Get(bus.HeaderClass) == string(schema.ClassCommit) && !lost[m.Header.Get(bus.HeaderMessageID)] {
			commits++
			if _, err := bg.Process(decodeTransport(t, m.Data)); err != nil {
				t.Fatalf("the peer cannot apply the accepted commit %s: %v", m.Header.Get(bus.HeaderMessageID), err)
			}
		}
		if m.Header.Get(bus.HeaderClass) != string(schema.ClassApplication) {
			continue
		}
		apps++
		r, err := bg.Process(decodeTransport(t, m.Data))
		if err != nil {
			t.Fatalf("the peer cannot read outbound message %s (a ratchet key used twice?): %v", m.Header.Get(bus.HeaderMessageID), err)
		}
		text, _ := r.Payload.Text()
		var i int
		if _, err := fmt.Sscanf(text, "chaos text %d", &i); err != nil || i < 0 || i >= sends {
			t.Fatalf("the peer reads %q", text)
		}
		seen[i]++
		if j, ok := byMessage[m.Header.Get(bus.HeaderMessageID)]; !ok || j != i {
			t.Errorf("outbound message of send %d is not the one its operation record names", i)
		}
	}
	for i, c := range seen {
		if i%renameEvery == renameEvery-1 {
			if c != 0 {
				t.Errorf("the peer read text %d of a rename", i)
			}
			continue
		}
		if c != 1 {
			t.Errorf("the peer read send %d %d times, want once", i, c)
		}
	}
	if commits != len(renames) {
		t.Errorf("the peer applied %d commits for %d renames", commits, len(renames))
	}
	t.Logf("%d operations, %d of them renames (%d retried requests), %d kills of converge and %d of ingest: acknowledged in %s, all done and read once in %s; %d application messages and %d accepted commits (%d lost) on the outbound subject",
		sends, len(renames), retries.Load(), kills, kills, acknowledged.Round(time.Millisecond), time.Since(began).Round(time.Millisecond), apps, commits, len(lost))
}

func chaosText(i int) string { return fmt.Sprintf("chaos text %d", i) }

// sigkill kills p with SIGKILL and waits for it to end.
func sigkill(p *process) {
	_ = p.cmd.Process.Kill()
	<-p.done
}

func decodeTransport(t *testing.T, b []byte) schema.TransportMessage {
	t.Helper()
	var tm schema.TransportMessage
	if err := tm.UnmarshalMsgpack(b); err != nil {
		t.Fatal(err)
	}
	return tm
}

// storedOn reads every message stored on subj in FABRIC_EVENTS, oldest
// first.
func storedOn(t *testing.T, ctx context.Context, js jetstream.JetStream, subj string) []*jetstream.RawStreamMsg {
	t.Helper()
	s, err := js.Stream(ctx, streams.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := uint64(1); ; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
		seq = m.Sequence + 1
	}
}

// waitOperationsDone waits until every operation's newest record says
// done and returns them; a failed one fails the test.
func waitOperationsDone(t *testing.T, ctx context.Context, js jetstream.JetStream, tenant string, ids [][]byte, within time.Duration) []schema.Operation {
	t.Helper()
	s, err := js.Stream(ctx, streams.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]schema.Operation, len(ids))
	deadline := time.Now().Add(within)
	for i, id := range ids {
		subj, err := subject.Operation(tenant, hex.EncodeToString(id))
		if err != nil {
			t.Fatal(err)
		}
		for {
			m, err := s.GetLastMsgForSubject(ctx, subj)
			if err == nil {
				if recs[i], err = bus.DecodeOperationRecord(m.Data); err != nil {
					t.Fatal(err)
				}
				if recs[i].Status == schema.OperationDone {
					break
				}
				if recs[i].Status == schema.OperationFailed {
					t.Fatalf("operation %d failed: %+v", i, recs[i])
				}
			} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
				t.Fatal(err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("operation %d of %d not done within %s: %+v", i, len(ids), within, recs[i])
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return recs
}
