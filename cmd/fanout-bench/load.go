package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/natsserver"
	"github.com/fabric-mls/fabric/internal/procstat"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// The load comparison (-load): for each round and each -load-subs count,
// the fabric (gateway and nats-server, each its own process) and, with
// -centrifugo, Centrifugo (its own process, memory engine) are started
// fresh, in an order rotated per round; N raw WebSocket connections each
// hold one subscriber on its own channel (a fabric client id; a Centrifugo
// personal channel, subscribed server-side by the connection token's
// channels claim), read by the same code. The fabric's events are stored
// as converge stores them (one atomic batch of -group-messages-per-batch
// group messages in the burst, of one in the latency phase, with the
// group's checkpoint; -fabric-publish event adds one publish per event), and
// Centrifugo's publications carry the same event (-centrifugo-history adds
// Centrifugo keeping them for recovery). It reports per system and N:
// RSS per idle subscriber, delivered events/s with -burst events published
// as fast as the publisher goes (each event reaches one subscriber, so a
// delivery is counted once), server CPU per delivered event (utime+stime
// of the server processes from /proc), and p50/p99 publish→read latency
// at -load-rate events/s. Medians and spread over -rounds.
//
// Centrifugo is not part of the repository; build it with
//
//	GOBIN=/tmp/centrifugo go install github.com/centrifugal/centrifugo/v6@v6.9.1
//
// and run
//
//	go run ./cmd/fanout-bench -load -centrifugo /tmp/centrifugo/centrifugo

type loadOptions struct {
	subs       string
	rounds     int
	burst      int
	rate       int
	rateFor    time.Duration
	centrifugo string
	// centrifugoHistory adds Centrifugo with history on its channels.
	centrifugoHistory bool
	// centrifugoRedis, a redis-server binary, adds Centrifugo on its Redis
	// engine with history.
	centrifugoRedis string
	publishers      int
	// rateBatch is how many events one publish of the latency phase carries.
	rateBatch int
	// groupMessages is how many group messages of groupMembers hosted
	// members one publish of the burst carries.
	groupMessages int
	// fabricPublish lists how the fabric's events are stored, each measured
	// as a system of its own: "batch" (as converge does), "event".
	fabricPublish string
}

// system is a server under load: the fabric or Centrifugo.
type system interface {
	name() string
	// start starts the servers for n subscribers.
	start(ctx context.Context, n int) error
	// pids are the server processes whose CPU and RSS are counted.
	pids() []int
	// dial opens subscriber i's connection and sends what subscribes it.
	dial(ctx context.Context, i int) (*websocket.Conn, error)
	// frame reads one frame for subscriber st.
	frame(st *subscriber, b []byte)
	// publish publishes, as publisher p, one event to each subscriber in
	// to, stamped now, and returns when the server has accepted them.
	publish(ctx context.Context, p int, to []int) error
	stop()
}

// subscriber is one connection's reading state.
type subscriber struct {
	ws         *websocket.Conn
	sub        uint64 // the fabric's subscription id
	uncredited int64
	subscribed chan struct{}
	once       sync.Once
	m          *meter
}

func (s *subscriber) ready() { s.once.Do(func() { close(s.subscribed) }) }

// meter counts what every subscriber reads.
type meter struct {
	delivered atomic.Int64
	lagged    atomic.Int64
	sampling  atomic.Bool
	mu        sync.Mutex
	lat       []time.Duration
}

func (m *meter) event(stampNanos int64) {
	m.delivered.Add(1)
	if m.sampling.Load() && stampNanos > 0 {
		d := time.Since(time.Unix(0, stampNanos))
		m.mu.Lock()
		m.lat = append(m.lat, d)
		m.mu.Unlock()
	}
}

// result is one system's figures for one N in one round.
type result struct {
	idleRSS   float64 // bytes per idle subscriber
	gwRSS     float64 // the first process's share (the gateway's, for the fabric)
	perSec    float64 // delivered events/s
	cpuPerEv  float64 // µs of server CPU per delivered event
	gwCPU     float64 // the first process's share
	genCPU    float64 // µs of the load generator's own CPU (publishers, subscribers) per delivered event
	p50, p99  time.Duration
	lagged    int64
	delivered int64
}

func runLoad(o options) error {
	lo := o.load
	var counts []int
	for f := range strings.SplitSeq(lo.subs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-load-subs: %q is not a count", f)
		}
		counts = append(counts, n)
	}
	if lo.groupMessages < 1 || groupMembers*lo.groupMessages >= natsserver.DefaultMaxAtomicBatch {
		return fmt.Errorf("-group-messages-per-batch: %d group messages of %d members do not fit one batch", lo.groupMessages, groupMembers)
	}
	stop, err := startCPUProfile(o.selfProfile)
	if err != nil {
		return err
	}
	defer stop()
	var systems []system
	for mode := range strings.SplitSeq(lo.fabricPublish, ",") {
		switch mode = strings.TrimSpace(mode); mode {
		case "batch", "event":
			systems = append(systems, &fabricSystem{json: o.json, profile: o.profile, natsProfile: o.natsProfile,
				publishers: lo.publishers, perEvent: mode == "event", members: groupMembers})
		default:
			return fmt.Errorf("-fabric-publish: %q is neither batch nor event", mode)
		}
	}
	if lo.centrifugo != "" {
		systems = append(systems, &centrifugoSystem{bin: lo.centrifugo})
		if lo.centrifugoHistory {
			systems = append(systems, &centrifugoSystem{bin: lo.centrifugo, history: true})
		}
		if lo.centrifugoRedis != "" {
			systems = append(systems, &centrifugoSystem{bin: lo.centrifugo, redis: lo.centrifugoRedis})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.duration)
	defer cancel()
	fmt.Printf("load average before: %s\n", procstat.LoadAverage())
	results := map[string][]result{}
	for r := range lo.rounds {
		for _, n := range counts {
			for k := range systems {
				sys := systems[(k+r)%len(systems)]
				res, err := loadRound(ctx, sys, n, lo)
				if err != nil {
					return fmt.Errorf("round %d, %s, %d subscribers: %w", r+1, sys.name(), n, err)
				}
				key := fmt.Sprintf("%s/%d", sys.name(), n)
				results[key] = append(results[key], res)
				fmt.Printf("round %d %-10s %6d subs: idle %6.1f KB/sub (first process %5.1f)  %8.0f ev/s  %5.1f µs CPU/ev (first process %5.1f, load generator %5.1f)  p50 %v p99 %v at %d/s  lagged %d\n",
					r+1, sys.name(), n, res.idleRSS/1024, res.gwRSS/1024, res.perSec, res.cpuPerEv, res.gwCPU, res.genCPU,
					res.p50.Round(10*time.Microsecond), res.p99.Round(10*time.Microsecond), lo.rate, res.lagged)
			}
		}
	}
	fmt.Printf("load average after: %s\n", procstat.LoadAverage())
	fmt.Printf("\nmedians over %d rounds [min–max]\n", lo.rounds)
	for _, n := range counts {
		for _, sys := range systems {
			rs := results[fmt.Sprintf("%s/%d", sys.name(), n)]
			fmt.Printf("%-10s %6d subs: delivered %s ev/s  CPU %s µs/ev (first process %s)  p50 %s ms  p99 %s ms  idle RSS %s KB/sub (first process %s)\n",
				sys.name(), n,
				spread(rs, func(r result) float64 { return r.perSec }, "%.0f"),
				spread(rs, func(r result) float64 { return r.cpuPerEv }, "%.1f"),
				spread(rs, func(r result) float64 { return r.gwCPU }, "%.1f"),
				spread(rs, func(r result) float64 { return float64(r.p50) / 1e6 }, "%.2f"),
				spread(rs, func(r result) float64 { return float64(r.p99) / 1e6 }, "%.2f"),
				spread(rs, func(r result) float64 { return r.idleRSS / 1024 }, "%.1f"),
				spread(rs, func(r result) float64 { return r.gwRSS / 1024 }, "%.1f"))
		}
	}
	return nil
}

// spread formats the median of rs's values and their range.
func spread(rs []result, v func(result) float64, format string) string {
	vs := make([]float64, len(rs))
	for i, r := range rs {
		vs[i] = v(r)
	}
	slices.Sort(vs)
	return fmt.Sprintf(format+" ["+format+"–"+format+"]", vs[len(vs)/2], vs[0], vs[len(vs)-1])
}

// loadRound starts sys fresh, connects n subscribers and measures.
func loadRound(ctx context.Context, sys system, n int, lo loadOptions) (result, error) {
	var res result
	if err := sys.start(ctx, n); err != nil {
		return res, err
	}
	defer sys.stop()
	pids := sys.pids()
	runtime.GC()
	time.Sleep(500 * time.Millisecond)
	before := make([]int64, len(pids))
	for i, p := range pids {
		before[i] = procstat.RSS(p)
	}

	m := &meter{}
	subs := make([]*subscriber, n)
	rctx, rcancel := context.WithCancel(ctx)
	var readers sync.WaitGroup
	defer func() {
		rcancel()
		for _, s := range subs {
			if s != nil {
				_ = s.ws.CloseNow()
			}
		}
		readers.Wait()
	}()
	next := atomic.Int64{}
	var dialErr error
	var errOnce sync.Once
	var dialers sync.WaitGroup
	for range 16 {
		dialers.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				ws, err := sys.dial(ctx, i)
				if err != nil {
					errOnce.Do(func() { dialErr = fmt.Errorf("subscriber %d: %w", i, err) })
					return
				}
				ws.SetReadLimit(1 << 20)
				st := &subscriber{ws: ws, subscribed: make(chan struct{}), m: m}
				subs[i] = st
				readers.Go(func() {
					for {
						_, b, err := ws.Read(rctx)
						if err != nil {
							return
						}
						sys.frame(st, b)
					}
				})
				select {
				case <-st.subscribed:
				case <-time.After(30 * time.Second):
					errOnce.Do(func() { dialErr = fmt.Errorf("subscriber %d: not subscribed within 30s", i) })
					return
				}
			}
		})
	}
	dialers.Wait()
	if dialErr != nil {
		return res, dialErr
	}
	time.Sleep(time.Second)
	for i, p := range pids {
		d := float64(procstat.RSS(p)-before[i]) / float64(n)
		res.idleRSS += d
		if i == 0 {
			res.gwRSS = d
		}
	}

	// Throughput: -burst events round-robin, as fast as accepted.
	self := []int{os.Getpid()}
	cpu0, gw0, gen0 := cpuTime(pids), cpuTime(pids[:1]), cpuTime(self)
	t0 := time.Now()
	if err := publishLoad(ctx, sys, n, lo.burst, 0, groupMembers*lo.groupMessages, lo.publishers); err != nil {
		return res, err
	}
	last := awaitDelivered(ctx, m, int64(lo.burst))
	res.delivered = m.delivered.Load()
	res.lagged = m.lagged.Load()
	res.perSec = float64(res.delivered) / last.Sub(t0).Seconds()
	res.cpuPerEv = float64(cpuTime(pids)-cpu0) / float64(time.Microsecond) / float64(max(1, res.delivered))
	res.gwCPU = float64(cpuTime(pids[:1])-gw0) / float64(time.Microsecond) / float64(max(1, res.delivered))
	res.genCPU = float64(cpuTime(self)-gen0) / float64(time.Microsecond) / float64(max(1, res.delivered))
	if res.delivered+res.lagged < int64(lo.burst) {
		return res, fmt.Errorf("%d of %d events delivered", res.delivered+res.lagged, lo.burst)
	}

	// Latency at a fixed rate.
	m.delivered.Store(0)
	m.sampling.Store(true)
	events := int(lo.rateFor.Seconds() * float64(lo.rate))
	if err := publishLoad(ctx, sys, n, events, lo.rate, lo.rateBatch, lo.publishers); err != nil {
		return res, err
	}
	awaitDelivered(ctx, m, int64(events))
	m.sampling.Store(false)
	m.mu.Lock()
	lat := m.lat
	m.mu.Unlock()
	slices.Sort(lat)
	if len(lat) > 0 {
		res.p50 = lat[len(lat)/2]
		res.p99 = lat[min(len(lat)-1, len(lat)*99/100)]
	}
	return res, nil
}

// awaitDelivered waits until want events were read or lagged, or none more
// arrived for 5 s; it returns when the last one was read.
func awaitDelivered(ctx context.Context, m *meter, want int64) time.Time {
	last, lastN := time.Now(), int64(-1)
	for ctx.Err() == nil {
		got := m.delivered.Load() + m.lagged.Load()
		if got != lastN {
			last, lastN = time.Now(), got
		}
		if got >= want || time.Since(last) > 5*time.Second {
			return last
		}
		time.Sleep(time.Millisecond)
	}
	return last
}

// groupMembers is the hosted members of the fabric's group: one group
// message is that many events, to as many subscribers. One publish of the
// burst carries -group-messages-per-batch of them: for the fabric one
// atomic batch, for Centrifugo one /api/batch request of as many publish
// commands.
const groupMembers = 100

// convergeGroupMessages is how many inputs of a 100-member group converge
// applies in one transaction under backlog (partition.go applyRun, MaxBatch
// bus.DefaultMaxBatch 1000): after k message inputs the transaction holds
// 100k events, k index entries (index.go), k message records and k
// pointers plus 2 conversation records per group member (readable.go),
// 103k+200 in all; a next input is admitted while that plus
// eventBudget 4*100+4 stays within 999, so up to k=3 (509+404), and the
// transaction commits 4 inputs (612 messages and the checkpoint). At the
// -max-batch=10000 of deploy/ and the all-in-one it commits 92 (9,676 and
// the checkpoint; counted in BenchmarkConvergeBacklog at members=100), which
// the bench's nats-server (natsserver.DefaultMaxAtomicBatch) allows too.
const convergeGroupMessages = 4

// publishLoad publishes events round-robin to the n subscribers in batches
// of batch events from publishers goroutines: paced at rate events per
// second, or, with rate 0, as fast as they are accepted.
func publishLoad(ctx context.Context, sys system, n, events, rate, batch, publishers int) error {
	work := make(chan []int, publishers)
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Go(func() {
			for to := range work {
				if failed.Load() != nil {
					continue
				}
				if err := sys.publish(ctx, p, to); err != nil {
					failed.Store(&err)
				}
			}
		})
	}
	start := time.Now()
	for i := 0; i < events; i += batch {
		if rate > 0 {
			if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
				time.Sleep(d)
			}
		}
		to := make([]int, 0, batch)
		for j := i; j < min(events, i+batch); j++ {
			to = append(to, j%n)
		}
		work <- to
	}
	close(work)
	wg.Wait()
	if p := failed.Load(); p != nil {
		return *p
	}
	return ctx.Err()
}

// cpuTime is the user and system CPU the processes have used.
func cpuTime(pids []int) time.Duration {
	var d time.Duration
	for _, p := range pids {
		d += procstat.CPU(p)
	}
	return d
}

// fabricSystem is nats-server and the gateway, each a child process.
type fabricSystem struct {
	json        bool
	profile     string // the gateway's CPU profile, overwritten by each round
	natsProfile string // the nats-server's, likewise
	secret      []byte
	nats        *child
	gw          *child
	nc          *nats.Conn
	js          jetstream.JetStream
	publishers  int
	// perEvent stores each event with its own JetStream async publish
	// (Nats-Msg-Id) instead of converge's atomic batches.
	perEvent bool
	clients  []string
	// members is the hosted members of each group message (groupMembers;
	// 0, all of one publish's subscribers).
	members int
	seq     atomic.Uint64
	// ckSeq is publisher p's group's last checkpoint sequence, the fence
	// of its next batch.
	ckSeq []uint64
}

func (f *fabricSystem) name() string {
	if f.perEvent {
		return "fabric/event"
	}
	return "fabric"
}

func (f *fabricSystem) start(ctx context.Context, n int) error {
	f.secret = bytes.Repeat([]byte("fanout-load-secret-"), 3)
	var err error
	if f.nats, err = startProcess(ctx, f.secret, "-child-nats", "-nats-cpuprofile", f.natsProfile); err != nil {
		return err
	}
	if f.nc, err = nats.Connect(f.nats.first); err != nil {
		return err
	}
	if f.js, err = jetstream.New(f.nc); err != nil {
		return err
	}
	if f.gw, err = startProcess(ctx, f.secret, "-child-gateway", "-nats-url", f.nats.first, "-gateway-cpuprofile", f.profile); err != nil {
		return err
	}
	kv, err := f.js.KeyValue(ctx, streams.BucketClients)
	if err != nil {
		return err
	}
	f.ckSeq = make([]uint64, f.publishers)
	f.clients = make([]string, n)
	for i := range f.clients {
		f.clients[i] = fmt.Sprintf("%08x", i+1)
		if _, err := kv.Put(ctx, tenant+"."+f.clients[i], []byte{0x80}); err != nil {
			return err
		}
	}
	return nil
}

func (f *fabricSystem) pids() []int {
	return []int{f.gw.cmd.Process.Pid, f.nats.cmd.Process.Pid}
}

func (f *fabricSystem) enc() wire.Encoding {
	if f.json {
		return wire.JSON
	}
	return wire.Msgpack
}

func (f *fabricSystem) dial(ctx context.Context, i int) (*websocket.Conn, error) {
	tok, err := auth.Mint(f.secret, auth.Claims{Tenant: tenant, Scopes: []auth.Scope{auth.ScopeEvents},
		Clients: []string{f.clients[i]}, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(dctx, "ws://"+f.gw.first+"/v1/events", &websocket.DialOptions{
		HTTPHeader:   http.Header{"Authorization": {"Bearer " + tok}},
		Subprotocols: []string{f.enc().Subprotocol()},
	})
	if err != nil {
		return nil, err
	}
	typ := websocket.MessageBinary
	if f.json {
		typ = websocket.MessageText
	}
	sub := wire.Append(f.enc(), nil, &wire.Frame{Op: wire.OpSubscribe, ID: 1, ClientID: f.clients[i],
		Filter: &schema.EventFilter{Kinds: []schema.EventKind{schema.KindMessageReceived}}})
	if err := ws.Write(dctx, typ, sub); err != nil {
		_ = ws.CloseNow()
		return nil, err
	}
	return ws, nil
}

// creditEvery is how many events a subscriber reads before it returns
// credit, well inside the 1024 bound.
const creditEvery = 256

// Event frames are read as lightly as Centrifugo's pushes are (its frame
// below): the op and the event id are found in the bytes, not decoded, so
// both systems' subscribers cost the load generator alike. wire.Append
// writes op first and event_id before the event.
var (
	// eventOp is what follows the map header of an event frame.
	eventOp = map[wire.Encoding][]byte{
		wire.Msgpack: wire.Append(wire.Msgpack, nil, &wire.Frame{Op: wire.OpEvent})[1:],
		wire.JSON:    []byte(`"op":"event"`),
	}
	// eventIDKey is what precedes an event id's hex digits.
	eventIDKey = map[wire.Encoding][]byte{
		wire.Msgpack: []byte("\xa8event_id\xd9\x40"), // the key, then a str8 of 64 bytes
		wire.JSON:    []byte(`"event_id":"`),
	}
)

func (f *fabricSystem) frame(st *subscriber, b []byte) {
	enc := f.enc()
	if len(b) < 1 || !bytes.HasPrefix(b[1:], eventOp[enc]) {
		fr, err := wire.Decode(enc, b)
		if err == nil && fr.Op == wire.OpSubscribed {
			st.sub = fr.Sub
			st.ready()
		}
		return
	}
	if k := bytes.Index(b, eventIDKey[enc]); k < 0 || len(b) < k+len(eventIDKey[enc])+16 { // lagged
		st.m.lagged.Add(1)
	} else {
		id := b[k+len(eventIDKey[enc]):]
		stamp, _ := strconv.ParseInt(string(id[:16]), 16, 64)
		st.m.event(stamp)
	}
	if st.uncredited++; st.uncredited >= creditEvery {
		typ := websocket.MessageBinary
		if f.json {
			typ = websocket.MessageText
		}
		c := wire.Append(enc, nil, &wire.Frame{Op: wire.OpCredit, Sub: st.sub, N: st.uncredited})
		st.uncredited = 0
		_ = st.ws.Write(context.Background(), typ, c)
	}
}

// benchText is the content type of every message.
var benchText = &schema.ContentTypeID{AuthorityID: "xmtp.org", TypeID: "text", VersionMajor: 1}

// benchCheckpoint has the shape and size of converge's checkpoint record
// (internal/converge, fence.go) for one input to a group: the member state
// blob keys of every hosted member. Its bytes are opaque to the bus.
type benchCheckpoint struct {
	V        int               `msgpack:"v"`
	InputSeq uint64            `msgpack:"input_seq"`
	Txn      string            `msgpack:"txn"`
	State    string            `msgpack:"state"`
	Members  map[string]string `msgpack:"members"`
	Worker   string            `msgpack:"worker"`
}

// groupMessage is what converge stores for input messages to a group,
// each to f.members of the clients to (the group's hosted members): one
// message.received per member per message and the group's checkpoint
// naming one message's members, built by the bus code converge uses. Each
// event id starts with the publish time in hex, read back from the frame.
func (f *fabricSystem) groupMessage(p int, to []int) ([]bus.Event, bus.Checkpoint, error) {
	stamp := time.Now().UnixNano()
	n := f.seq.Add(uint64(len(to)))
	groupHex := fmt.Sprintf("%064x", p+1)
	group, err := hex.DecodeString(groupHex)
	if err != nil {
		return nil, bus.Checkpoint{}, err
	}
	members := f.members
	if members <= 0 {
		members = len(to)
	}
	events := make([]bus.Event, len(to))
	ck := benchCheckpoint{V: 1, InputSeq: n, Txn: "in:" + strconv.FormatUint(n, 10),
		State: fmt.Sprintf("%s.%s.s.%024x", tenant, groupHex, n), Members: make(map[string]string, members), Worker: "fanout-bench"}
	var msgID []byte
	for k, i := range to {
		if k%members == 0 {
			msgID = fmt.Appendf(nil, "%016x%016x", stamp, n-uint64(k))
		}
		events[k] = bus.Event{Tenant: tenant, ClientID: f.clients[i], ID: fmt.Sprintf("%016x%048x", stamp, n-uint64(k)),
			Event: &schema.ClientEvent{Kind: schema.KindMessageReceived, MessageReceived: &schema.MessageReceived{
				GroupID: group, MessageID: msgID, ContentType: benchText, SenderInboxID: benchSender}}}
		if k < members {
			ck.Members[f.clients[i]] = fmt.Sprintf("%s.%s.m.%s.%024x", tenant, groupHex, f.clients[i], n)
		}
	}
	body, err := msgpack.Marshal(ck)
	if err != nil {
		return nil, bus.Checkpoint{}, err
	}
	return events, bus.Checkpoint{Tenant: tenant, GroupID: groupHex, Data: body, ExpectedSeq: f.ckSeq[p]}, nil
}

// benchSender is the sending inbox id of every message, 64 hex digits.
var benchSender = strings.Repeat("5e", 32)

// publish stores the events as converge does (bus.PublishBatch): one
// atomic batch of the events and publisher p's group checkpoint, fenced on
// the group's previous checkpoint, one ack per batch.
func (f *fabricSystem) publish(ctx context.Context, p int, to []int) error {
	events, ck, err := f.groupMessage(p, to)
	if err != nil {
		return err
	}
	if f.perEvent {
		return f.publishEach(ctx, events)
	}
	seq, err := bus.PublishBatch(ctx, f.js, events, ck, bus.WithMaxBatch(natsserver.DefaultMaxAtomicBatch))
	if err != nil {
		return err
	}
	f.ckSeq[p] = seq
	return nil
}

// publishEach stores each event with a JetStream async publish carrying
// its Nats-Msg-Id, then awaits every ack.
func (f *fabricSystem) publishEach(ctx context.Context, events []bus.Event) error {
	futures := make([]jetstream.PubAckFuture, 0, len(events))
	for _, ev := range events {
		m, err := ev.Msg()
		if err != nil {
			return err
		}
		fu, err := f.js.PublishMsgAsync(m)
		if err != nil {
			return err
		}
		futures = append(futures, fu)
	}
	for _, fu := range futures {
		select {
		case <-fu.Ok():
		case err := <-fu.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (f *fabricSystem) stop() {
	if f.gw != nil {
		f.gw.stop()
		f.gw = nil
	}
	if f.nc != nil {
		f.nc.Close()
		f.nc = nil
	}
	if f.nats != nil {
		f.nats.stop()
		f.nats = nil
	}
}

// runNATS is the -child-nats process: nats-server with the fabric's
// streams. It prints its URL and serves until stdin closes.
func runNATS(profile string) error {
	stop, err := startCPUProfile(profile)
	if err != nil {
		return err
	}
	defer stop()
	ctx := context.Background()
	ns, _, closeNATS, err := startNATS(ctx)
	if err != nil {
		return err
	}
	defer closeNATS()
	fmt.Println(ns.ClientURL())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// centrifugoSystem is a Centrifugo binary with its memory engine, HMAC
// connection tokens and the HTTP server API; with history, the personal
// channels keep their publications for recovery, as the fabric stores its
// events.
type centrifugoSystem struct {
	bin     string
	history bool
	// redis is a redis-server binary: the Redis engine, history and
	// forced recovery on the channels, Redis's data in an append-only file.
	redis    string
	redisCmd *exec.Cmd
	dir      string
	cmd      *exec.Cmd
	addr     string
	secret   string
	apiKey   string
	http     *http.Client
	seq      atomic.Uint64
}

func (c *centrifugoSystem) name() string {
	if c.redis != "" {
		return "centrifugo+redis"
	}
	if c.history {
		return "centrifugo+history"
	}
	return "centrifugo"
}

// Centrifugo's history on the personal channels: as many publications per
// channel and as long as the fabric keeps a client's events (the events
// stream's default MaxAge), recovery forced on every subscription.
const (
	centrifugoHistorySize = 10000
	centrifugoHistoryTTL  = "24h"
)

// freePort returns a loopback TCP port nothing listens on now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (c *centrifugoSystem) start(ctx context.Context, _ int) error {
	var err error
	if c.dir, err = os.MkdirTemp("", "fanout-load-centrifugo-"); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	c.addr = fmt.Sprintf("127.0.0.1:%d", port)
	c.secret, c.apiKey = "fanout-load-centrifugo-hmac-secret", "fanout-load-api-key"
	cfg := map[string]any{
		"http_server": map[string]any{"address": "127.0.0.1", "port": port},
		"client": map[string]any{
			"token":           map[string]any{"hmac_secret_key": c.secret},
			"allowed_origins": []string{"*"},
		},
		"http_api": map[string]any{"key": c.apiKey},
		"log":      map[string]any{"level": "error"},
		"engine":   map[string]any{"type": "memory"},
	}
	if c.history || c.redis != "" {
		cfg["channel"] = map[string]any{"without_namespace": map[string]any{
			"history_size": centrifugoHistorySize, "history_ttl": centrifugoHistoryTTL, "force_recovery": true}}
	}
	if c.redis != "" {
		addr, err := c.startRedis(ctx)
		if err != nil {
			return err
		}
		cfg["engine"] = map[string]any{"type": "redis", "redis": map[string]any{"address": []string{"redis://" + addr}}}
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	path := filepath.Join(c.dir, "config.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return err
	}
	c.cmd = exec.CommandContext(ctx, c.bin, "--config", path)
	c.cmd.Stdout, c.cmd.Stderr = os.Stderr, os.Stderr
	if err := c.cmd.Start(); err != nil {
		return err
	}
	c.http = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	for deadline := time.Now().Add(30 * time.Second); ; {
		if err := c.api(ctx, "info", map[string]any{}); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("centrifugo did not answer: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *centrifugoSystem) api(ctx context.Context, method string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.addr+"/api/"+method, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("X-API-Key", c.apiKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || bytes.Contains(out, []byte(`"error"`)) {
		return fmt.Errorf("centrifugo api %s: %s %s", method, resp.Status, out)
	}
	return nil
}

func (c *centrifugoSystem) pids() []int {
	if c.redisCmd != nil {
		return []int{c.cmd.Process.Pid, c.redisCmd.Process.Pid}
	}
	return []int{c.cmd.Process.Pid}
}

func channelOf(i int) string { return fmt.Sprintf("u%08x", i+1) }

func (c *centrifugoSystem) dial(ctx context.Context, i int) (*websocket.Conn, error) {
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": strconv.Itoa(i + 1), "exp": time.Now().Add(time.Hour).Unix(),
		"channels": []string{channelOf(i)},
	}).SignedString([]byte(c.secret))
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(dctx, "ws://"+c.addr+"/connection/websocket", nil)
	if err != nil {
		return nil, err
	}
	connect, _ := json.Marshal(map[string]any{"id": 1, "connect": map[string]any{"token": tok}})
	if err := ws.Write(dctx, websocket.MessageText, connect); err != nil {
		_ = ws.CloseNow()
		return nil, err
	}
	return ws, nil
}

var (
	pushPub   = []byte(`"pub":`)
	stampKey  = []byte(`"t":`)
	connectOK = []byte(`"connect":{`)
)

// frame reads Centrifugo's JSON protocol: replies and pushes, several per
// frame separated by newlines; {} is a ping, answered with {}.
func (c *centrifugoSystem) frame(st *subscriber, b []byte) {
	for line := range bytes.SplitSeq(b, []byte{'\n'}) {
		switch {
		case bytes.Equal(line, []byte("{}")):
			_ = st.ws.Write(context.Background(), websocket.MessageText, []byte("{}"))
		case bytes.Contains(line, pushPub):
			var stamp int64
			if k := bytes.Index(line, stampKey); k >= 0 {
				rest := line[k+len(stampKey):]
				end := bytes.IndexAny(rest, ",}")
				if end > 0 {
					stamp, _ = strconv.ParseInt(string(rest[:end]), 10, 64)
				}
			}
			st.m.event(stamp)
		case bytes.Contains(line, connectOK):
			st.ready()
		case bytes.Contains(line, []byte(`"error"`)):
			fmt.Fprintf(os.Stderr, "centrifugo: %s\n", line)
		}
	}
}

// centrifugoData is a publication's data: the publish time, then what a
// fabric event frame carries (the event id and the event), so that both
// systems move the same information.
type centrifugoData struct {
	T     int64              `json:"t"`
	ID    string             `json:"id"`
	Event schema.ClientEvent `json:"event"`
}

// publish sends the events in one batch request of the server API: the
// same events as the fabric's batch, JSON-encoded.
func (c *centrifugoSystem) publish(ctx context.Context, p int, to []int) error {
	stamp := time.Now().UnixNano()
	group := fmt.Sprintf("%064x", p+1)
	gid, err := hex.DecodeString(group)
	if err != nil {
		return err
	}
	n := c.seq.Add(uint64(len(to)))
	msgID := fmt.Appendf(nil, "%016x%016x", stamp, n)
	type publish struct {
		Channel string         `json:"channel"`
		Data    centrifugoData `json:"data"`
	}
	type command struct {
		Publish publish `json:"publish"`
	}
	cmds := make([]command, len(to))
	for k, i := range to {
		cmds[k] = command{Publish: publish{Channel: channelOf(i), Data: centrifugoData{
			T: stamp, ID: fmt.Sprintf("%016x%048x", stamp, n-uint64(k)),
			Event: schema.ClientEvent{Kind: schema.KindMessageReceived, MessageReceived: &schema.MessageReceived{
				GroupID: gid, MessageID: msgID, ContentType: benchText, SenderInboxID: benchSender}}}}}
	}
	return c.api(ctx, "batch", map[string]any{"commands": cmds})
}

// startRedis starts redis-server for the Redis engine, keeping the data
// across a restart as the fabric's file storage does: append-only file,
// fsynced every second, in c.dir. It returns the address once it answers.
func (c *centrifugoSystem) startRedis(ctx context.Context) (string, error) {
	port, err := freePort()
	if err != nil {
		return "", err
	}
	c.redisCmd = exec.CommandContext(ctx, c.redis, "--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--dir", c.dir, "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no")
	c.redisCmd.Stdout, c.redisCmd.Stderr = io.Discard, os.Stderr
	if err := c.redisCmd.Start(); err != nil {
		return "", err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for deadline := time.Now().Add(30 * time.Second); ; {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			conn.Close()
			return addr, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("redis-server did not answer: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stopProcess interrupts cmd and waits for it, killing it after 10 s.
func stopProcess(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func (c *centrifugoSystem) stop() {
	if c.cmd != nil {
		stopProcess(c.cmd)
		c.cmd = nil
	}
	if c.redisCmd != nil {
		stopProcess(c.redisCmd)
		c.redisCmd = nil
	}
	if c.dir != "" {
		_ = os.RemoveAll(c.dir)
		c.dir = ""
	}
}
