// Package load drives a whole-system workload through a running fabric:
// remote MLS members (testpeer) send application messages through ingest's
// HTTP intake to groups of hosted clients, and one WebSocket subscriber per
// hosted client (or, like an app backend multiplexing its users, one
// WebSocket per several hosted clients) receives their message.received
// events from the gateway.
// It measures what the system delivers end to end: throughput, latency from
// the intake request to the event at the subscriber, lagged events, and the
// CPU and resident memory of each process it is told about.
package load

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/demo"
	"github.com/fabric-mls/fabric/internal/fanout"
	"github.com/fabric-mls/fabric/internal/procstat"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Workload is the shape of the load: Tenants × Groups groups, each with
// Members hosted clients and one remote sender, offered Rate messages per
// second in total for Duration.
type Workload struct {
	Tenants  int
	Groups   int // per tenant
	Members  int // hosted clients per group
	Rate     float64
	Duration time.Duration
	// Drain is how long to wait, after the last message is sent, for
	// events still on their way.
	Drain time.Duration
	// ClientsPerConn is how many hosted clients' subscriptions one
	// WebSocket carries, as an app backend multiplexing its users would;
	// 0 is 1, a connection per hosted client.
	ClientsPerConn int
}

// perConn is the hosted clients per WebSocket, at least 1.
func (w Workload) perConn() int { return max(1, w.ClientsPerConn) }

// connsPerTenant is how many WebSockets one tenant's hosted clients use.
func (w Workload) connsPerTenant() int {
	return (w.Groups*w.Members + w.perConn() - 1) / w.perConn()
}

// Validate reports a workload that cannot run.
func (w Workload) Validate() error {
	switch {
	case w.Tenants < 1 || w.Groups < 1 || w.Members < 1:
		return errors.New("load: tenants, groups and members must each be at least 1")
	case w.Rate <= 0:
		return errors.New("load: the rate must be positive")
	case w.Duration <= 0:
		return errors.New("load: the duration must be positive")
	case w.ClientsPerConn < 0 || w.ClientsPerConn > fanout.DefaultMaxSubscriptions:
		return fmt.Errorf("load: %d hosted clients per connection: the gateway takes 1 to %d subscriptions per connection", w.ClientsPerConn, fanout.DefaultMaxSubscriptions)
	case w.connsPerTenant() > fanout.DefaultMaxConnsPerTenant:
		// Past the gateway's quota the set-up would fail at its first
		// refused connection.
		return fmt.Errorf("load: %d hosted clients per tenant (groups × members) at %d per connection need %d WebSockets, over the gateway's %d open connections per tenant: use more tenants or more clients per connection", w.Groups*w.Members, w.perConn(), w.connsPerTenant(), fanout.DefaultMaxConnsPerTenant)
	}
	return nil
}

// Messages is how many messages the run sends: the rate over the
// duration, at least one.
func (w Workload) Messages() int {
	return max(1, int(w.Rate*w.Duration.Seconds()))
}

// perGroup is how many of total messages group i of n sends: an equal
// share, the first total mod n groups one more. With more groups than
// messages the rest stay idle: hosted, subscribed, and part of the cost.
func perGroup(total, n, i int) int {
	q := total / n
	if i < total%n {
		q++
	}
	return q
}

// Process is one process of the system under load, measured by its id.
type Process struct {
	Role string
	PID  int
}

// Target is the running fabric.
type Target struct {
	URL       string // HTTP API: client registration and the transport intake
	EventsURL string // the gateway's WebSocket endpoint (ws://…/v1/events)
	// Tokens mints a token for a tenant: admin, ingest and events scopes.
	Tokens    func(tenant string) (Tokens, error)
	Processes []Process
}

// Tokens are one tenant's bearer tokens.
type Tokens struct {
	Admin, Ingest, Events string
}

// Report is what one run measured.
type Report struct {
	Workload  Workload
	Sent      int // messages accepted by the intake
	Expected  int // events expected: Sent × Members
	Delivered int // message.received events at the subscribers
	Conns     int // WebSockets the subscriptions were made on
	Lagged    int // lagged events at the subscribers
	Elapsed   time.Duration
	// Setup is the time from the first registration until every hosted
	// client reported conversation.joined.
	Setup time.Duration
	// Latency quantiles from the intake request's start to the event.
	P50, P99, P999 time.Duration
	Roles          []RoleUsage
	LoadAvg        string
}

// RoleUsage is one process's CPU over the load phase and its RSS at its end.
type RoleUsage struct {
	Role     string
	CPU      time.Duration
	RSSBytes int64
}

// Run sets the workload up (registers hosted clients, creates the groups,
// subscribes), sends its messages at the rate, waits for the events and
// reports. Progress lines go to log.
func Run(ctx context.Context, w Workload, t Target, log io.Writer) (Report, error) {
	if err := w.Validate(); err != nil {
		return Report{}, err
	}
	total := w.Messages()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()

	var (
		mu      sync.Mutex
		sentAt  = map[string]*atomic.Int64{} // message id → unix ns of its intake request
		lat     []time.Duration
		joined  atomic.Int64
		lagged  atomic.Int64
		deliver atomic.Int64
	)
	var conns []*client.Client
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	groups := make([]*group, w.Tenants*w.Groups)
	fmt.Fprintf(log, "setting up %d tenants × %d groups × %d hosted members on %d WebSockets, %d messages\n", w.Tenants, w.Groups, w.Members, w.Tenants*w.connsPerTenant(), total)
	setupStart := time.Now()
	// setupCtx ends the other groups' set-up when one fails; it lives as
	// long as the run, as do the subscriptions made with it.
	setupCtx, cancelSetup := context.WithCancel(ctx)
	defer cancelSetup()
	subscribe := func(tok Tokens) func(clientID string) error {
		// The tenant's hosted clients fill one WebSocket after the other,
		// perConn subscriptions each.
		var (
			connMu sync.Mutex
			cur    *client.Client
			onCur  int
		)
		conn := func() (*client.Client, error) {
			connMu.Lock()
			defer connMu.Unlock()
			if cur == nil || onCur == w.perConn() {
				c, err := client.Connect(setupCtx, t.EventsURL, tok.Events, client.WithHTTPClient(hc))
				if err != nil {
					return nil, err
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				cur, onCur = c, 0
			}
			onCur++
			return cur, nil
		}
		return func(clientID string) error {
			c, err := conn()
			if err != nil {
				return err
			}
			_, err = c.SubscribeFunc(setupCtx, clientID, schema.EventFilter{Kinds: schema.AllKinds()}, func(_ context.Context, ev schema.ClientEvent) error {
				switch ev.Kind {
				case schema.KindConversationJoined:
					joined.Add(1)
				case schema.KindLagged:
					lagged.Add(1)
				case schema.KindMessageReceived:
					now := time.Now().UnixNano()
					mu.Lock()
					at := sentAt[string(ev.MessageReceived.MessageID)]
					mu.Unlock()
					if at == nil {
						return nil // not one of the load's messages
					}
					d := time.Duration(now - at.Load())
					deliver.Add(1)
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				}
				return nil
			})
			return err
		}
	}
	setupGroup := func(api *demo.API, sub func(clientID string) error, i int) error {
		g, invite, err := newGroup(setupCtx, api, w.Members, sub)
		if err != nil {
			return err
		}
		g.api = api
		if err := post(setupCtx, api, invite...); err != nil {
			return fmt.Errorf("invite: %w", err)
		}
		if g.msgs, err = messages(g.sender, perGroup(total, len(groups), i)); err != nil {
			return err
		}
		mu.Lock()
		for _, m := range g.msgs {
			sentAt[string(m.ID)] = new(atomic.Int64)
		}
		mu.Unlock()
		groups[i] = g
		return nil
	}
	// Groups are set up setupWorkers at a time: one after the other, 10,000
	// hosted clients take longer than the run.
	var (
		wg       sync.WaitGroup
		slots    = make(chan struct{}, setupWorkers)
		setupErr = make(chan error, 1)
	)
setup:
	for ti := range w.Tenants {
		tenant := fmt.Sprintf("load%d", ti)
		tok, err := t.Tokens(tenant)
		if err != nil {
			cancelSetup()
			wg.Wait()
			return Report{}, err
		}
		api := &demo.API{BaseURL: t.URL, Tenant: tenant, AdminToken: tok.Admin, IngestToken: tok.Ingest, HTTP: hc}
		sub := subscribe(tok)
		for gi := range w.Groups {
			select {
			case slots <- struct{}{}:
			case <-setupCtx.Done():
				break setup
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				if err := setupGroup(api, sub, ti*w.Groups+gi); err != nil {
					select {
					case setupErr <- fmt.Errorf("load: tenant %s group %d: %w", tenant, gi, err):
					default:
					}
					cancelSetup()
				}
			}()
		}
	}
	wg.Wait()
	select {
	case err := <-setupErr:
		return Report{}, err
	default:
	}
	if err := ctx.Err(); err != nil {
		return Report{}, err
	}
	members := int64(w.Tenants * w.Groups * w.Members)
	// A large workload's joins take longer than a fixed bound: give up only
	// when no hosted client has joined for joinStall.
	if err := awaitProgress(ctx, joinStall, joined.Load, members); err != nil {
		return Report{}, fmt.Errorf("load: %d of %d hosted clients joined: %w", joined.Load(), members, err)
	}
	setup := time.Since(setupStart)
	fmt.Fprintf(log, "%d hosted clients joined in %s; sending %.0f messages/s for %s\n", members, setup.Round(time.Millisecond), w.Rate, w.Duration)

	before := usage(t.Processes)
	start := time.Now()
	sent, err := send(ctx, groups, w.Rate, func(id []byte) {
		sentAt[string(id)].Store(time.Now().UnixNano())
	})
	if err != nil {
		return Report{}, err
	}
	expected := int64(sent * w.Members)
	last, lastAt := deliver.Load(), time.Now()
	for deliver.Load() < expected && ctx.Err() == nil {
		if n := deliver.Load(); n != last {
			last, lastAt = n, time.Now()
		} else if time.Since(lastAt) > w.Drain {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := lastAt.Sub(start)
	if deliver.Load() >= expected {
		elapsed = time.Since(start)
	}
	after := usage(t.Processes)

	mu.Lock()
	defer mu.Unlock()
	slices.Sort(lat)
	r := Report{
		Workload: w, Sent: sent, Expected: int(expected), Delivered: int(deliver.Load()), Conns: len(conns), Lagged: int(lagged.Load()),
		Elapsed: elapsed, Setup: setup, P50: quantile(lat, 0.5), P99: quantile(lat, 0.99), P999: quantile(lat, 0.999),
		LoadAvg: procstat.LoadAverage(),
	}
	for i, p := range t.Processes {
		r.Roles = append(r.Roles, RoleUsage{Role: p.Role, CPU: after[i].cpu - before[i].cpu, RSSBytes: after[i].rss})
	}
	return r, nil
}

// group is one conversation of the workload: its remote sender and the
// messages it sends.
type group struct {
	api    *demo.API
	sender *testpeer.Group
	msgs   []testpeer.Message
}

// newGroup registers members hosted clients, subscribes each with
// subscribe before anything happens to it (events are live only,
// EVENT-014), and has a remote peer create a group and invite them: the
// Welcome to post.
func newGroup(ctx context.Context, api *demo.API, members int, subscribe func(clientID string) error) (*group, []testpeer.Message, error) {
	kps := make([][]byte, 0, members)
	for range members {
		account := make([]byte, 32)
		if _, err := rand.Read(account); err != nil {
			return nil, nil, err
		}
		hosted, err := api.Register(ctx, hex.EncodeToString(account))
		if err != nil {
			return nil, nil, err
		}
		if err := subscribe(hosted.ClientID); err != nil {
			return nil, nil, err
		}
		kps = append(kps, hosted.KeyPackages[0])
	}
	peer, err := testpeer.New("remote")
	if err != nil {
		return nil, nil, err
	}
	g, err := peer.CreateGroup(components.Set{
		Profile: &components.ProfileState{Name: "load"},
		Admins:  []components.AccountID{peer.AccountID()},
	})
	if err != nil {
		return nil, nil, err
	}
	_, welcome, err := g.Invite(kps...)
	if err != nil {
		return nil, nil, err
	}
	// The fabric hosts the group from the Welcome on; the commit before it
	// would be refused as unknown_group.
	return &group{sender: g}, []testpeer.Message{welcome}, nil
}

// messages are n text messages of the sender, made before the load starts:
// the remote members' encryption is not the fabric's cost.
func messages(g *testpeer.Group, n int) ([]testpeer.Message, error) {
	out := make([]testpeer.Message, 0, n)
	for i := range n {
		m, err := g.SendText("load message " + strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// tick is how often the sender posts what is due: each tenant's due
// messages go in one intake request, each group's in order.
const tick = 10 * time.Millisecond

// send offers the groups' messages at rate, round-robin over the groups,
// and returns how many the intake accepted.
func send(ctx context.Context, groups []*group, rate float64, mark func(id []byte)) (int, error) {
	total := 0
	for _, g := range groups {
		total += len(g.msgs)
	}
	next := make([]int, len(groups))
	sent, gi := 0, 0
	start := time.Now()
	for sent < total {
		due := min(total, int(rate*time.Since(start).Seconds())+1)
		byTenant := map[*demo.API][]testpeer.Message{}
		for sent < due {
			i := gi % len(groups)
			gi++
			g := groups[i]
			if next[i] >= len(g.msgs) {
				continue
			}
			byTenant[g.api] = append(byTenant[g.api], g.msgs[next[i]])
			next[i]++
			sent++
		}
		var wg sync.WaitGroup
		errs := make(chan error, len(byTenant))
		for api, msgs := range byTenant {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, m := range msgs {
					mark(m.ID)
				}
				errs <- post(ctx, api, msgs...)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				return sent, err
			}
		}
		select {
		case <-ctx.Done():
			return sent, ctx.Err()
		case <-time.After(tick):
		}
	}
	return sent, nil
}

// post sends msgs to the intake and fails unless each is queued.
func post(ctx context.Context, api *demo.API, msgs ...testpeer.Message) error {
	tms := make([]schema.TransportMessage, len(msgs))
	for i, m := range msgs {
		tms[i] = m.Transport
	}
	res, err := api.Post(ctx, tms...)
	if err != nil {
		return err
	}
	for _, r := range res {
		if r.Status != "queued" && r.Status != "duplicate" {
			return fmt.Errorf("intake answered %s %s", r.Status, r.Category)
		}
	}
	return nil
}

// setupWorkers is how many groups are set up at once.
const setupWorkers = 8

// joinStall is how long the set-up waits for the next hosted client to join.
const joinStall = 2 * time.Minute

// errStalled is awaitProgress's error when the count stops growing.
var errStalled = errors.New("no progress")

// awaitProgress polls count until it reaches target, failing when it has
// not grown for stall.
func awaitProgress(ctx context.Context, stall time.Duration, count func() int64, target int64) error {
	last, lastAt := count(), time.Now()
	for last < target {
		if time.Since(lastAt) > stall {
			return fmt.Errorf("%w for %s", errStalled, stall)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if n := count(); n != last {
			last, lastAt = n, time.Now()
		}
	}
	return nil
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

type procUsage struct {
	cpu time.Duration
	rss int64
}

// usage reads each process's CPU time (user and system) and RSS from /proc.
// PID 0 is this process.
func usage(ps []Process) []procUsage {
	out := make([]procUsage, len(ps))
	for i, p := range ps {
		if p.PID == 0 {
			var ru syscall.Rusage
			if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
				out[i].cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
			}
			out[i].rss = procstat.RSS(os.Getpid())
			continue
		}
		out[i].cpu = procstat.CPU(p.PID)
		out[i].rss = procstat.RSS(p.PID)
	}
	return out
}

// Print writes the report as a table.
func (r Report) Print(w io.Writer) {
	wl := r.Workload
	fmt.Fprintf(w, "workload: %d tenants × %d groups × %d hosted members, %.0f messages/s offered for %s\n", wl.Tenants, wl.Groups, wl.Members, wl.Rate, wl.Duration)
	fmt.Fprintf(w, "set-up (registrations, subscriptions, joins of %d hosted clients on %d WebSockets, up to %d per connection): %s\n", wl.Tenants*wl.Groups*wl.Members, r.Conns, wl.perConn(), r.Setup.Round(time.Millisecond))
	fmt.Fprintf(w, "messages sent %d, events expected %d, delivered %d (%.1f %%), lagged %d\n", r.Sent, r.Expected, r.Delivered, 100*float64(r.Delivered)/float64(max(1, r.Expected)), r.Lagged)
	fmt.Fprintf(w, "throughput: %.0f messages/s in, %.0f events/s delivered, over %s\n", float64(r.Sent)/r.Elapsed.Seconds(), float64(r.Delivered)/r.Elapsed.Seconds(), r.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "end-to-end latency (intake request to event at the subscriber): p50 %s, p99 %s, p99.9 %s\n", r.P50.Round(10*time.Microsecond), r.P99.Round(10*time.Microsecond), r.P999.Round(10*time.Microsecond))
	fmt.Fprintf(w, "%-22s %10s %14s %10s\n", "role", "CPU", "CPU µs/msg", "RSS MiB")
	for _, u := range r.Roles {
		fmt.Fprintf(w, "%-22s %10s %14.0f %10.1f\n", u.Role, u.CPU.Round(10*time.Millisecond), float64(u.CPU.Microseconds())/float64(max(1, r.Sent)), float64(u.RSSBytes)/(1<<20))
	}
	fmt.Fprintf(w, "load average (1, 5, 15 min) at the end: %s; %d CPUs\n", r.LoadAvg, runtime.NumCPU())
}
