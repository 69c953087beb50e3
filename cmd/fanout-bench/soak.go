package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/natsserver"
	"github.com/fabric-mls/fabric/internal/procstat"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// The soak (-soak): -idle-conns WebSocket connections and -replay-subs
// subscriptions that resume from after_seq=1, each replaying -backlog
// stored events and resubscribing every -resubscribe, held for -duration
// over several gateway and holder processes (one process may hold at most
// its descriptor limit), while a probe client's events, published at
// -probe-rate, are measured publish to handoff. Every replay and every
// probe event must arrive: a lagged, an error frame, a closed connection or
// a gateway's RSS over -max-rss fails the run.

// soakOptions configure the soak.
type soakOptions struct {
	idleConns     int
	replaySubs    int
	backlog       int
	tenants       int
	probeRate     int
	resubscribe   time.Duration
	perProcess    int // connections per gateway and per holder process
	replayPerConn int
	maxRSS        int64 // bytes per gateway process; past it the run fails
}

const (
	replayClients = 20 // replay clients per tenant
	probeTenant   = "probe"
	probeClient   = "0000beef"
)

func soakTenant(i int) string { return fmt.Sprintf("t%03d", i) }

func replayClient(i int) string { return fmt.Sprintf("%08x", 0x10000+i) }

func runSoak(o options) error {
	s := o.soak
	ctx, cancel := context.WithTimeout(context.Background(), o.duration+10*time.Minute)
	defer cancel()
	ns, js, closeNATS, err := startNATS(ctx)
	if err != nil {
		return err
	}
	defer closeNATS()
	// Sequence 1 belongs to nobody, so after_seq=1 replays every backlog
	// event of a replay client.
	if err := publishTo(ctx, js, []string{"nobody"}, []string{"00000000"}, 1, 0, false); err != nil {
		return err
	}
	t0 := time.Now()
	for t := range s.tenants {
		var cl []string
		for c := range replayClients {
			cl = append(cl, replayClient(c))
		}
		if err := publishTo(ctx, js, []string{soakTenant(t)}, cl, s.backlog*replayClients, 0, false); err != nil {
			return err
		}
	}
	fmt.Printf("backlog             %d events stored for %d replay clients in %v\n",
		s.backlog*replayClients*s.tenants, replayClients*s.tenants, time.Since(t0).Round(time.Millisecond))

	secret := make([]byte, 48)
	for i := range secret {
		secret[i] = byte('a' + i%26)
	}
	total := s.idleConns
	gateways := (total + s.perProcess - 1) / s.perProcess
	var addrs []string
	var gwPids []int
	for range gateways {
		gw, err := startProcess(ctx, secret, "-child-gateway", "-nats-url", ns.ClientURL())
		if err != nil {
			return err
		}
		defer gw.stop()
		addrs = append(addrs, gw.first)
		gwPids = append(gwPids, gw.cmd.Process.Pid)
	}
	var rssMax, rssSum atomic.Int64
	sampleDone := make(chan struct{})
	sampleCtx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	go func() {
		defer close(sampleDone)
		for {
			var sum int64
			for _, pid := range gwPids {
				r := procstat.RSS(pid)
				sum += r
				if r > rssMax.Load() {
					rssMax.Store(r)
				}
			}
			if sum > rssSum.Load() {
				rssSum.Store(sum)
			}
			select {
			case <-sampleCtx.Done():
				return
			case <-time.After(2 * time.Second):
			}
		}
	}()

	// Holders: the connections, the replay subscriptions on the first ones.
	var holders []*child
	t0 = time.Now()
	replayConns := (s.replaySubs + s.replayPerConn - 1) / s.replayPerConn
	for first := 0; first < total; first += s.perProcess {
		n := min(s.perProcess, total-first)
		rc := max(0, min(n, replayConns-first))
		args := []string{"-child-holder", "-addrs", strings.Join(addrs, ","), "-holder-first", strconv.Itoa(first),
			"-holder-conns", strconv.Itoa(n), "-holder-replay-conns", strconv.Itoa(rc),
			"-replay-per-conn", strconv.Itoa(s.replayPerConn), "-backlog", strconv.Itoa(s.backlog),
			"-tenants", strconv.Itoa(s.tenants), "-resubscribe", s.resubscribe.String()}
		h, err := startProcess(ctx, secret, args...)
		if err != nil {
			return err
		}
		defer h.stop()
		if h.first != "ready" {
			return fmt.Errorf("holder: %s", h.first)
		}
		holders = append(holders, h)
	}
	fmt.Printf("connections         %d on %d gateways (%d per process), %d replay subscriptions on %d of them, open in %v\n",
		total, gateways, s.perProcess, s.replaySubs, replayConns, time.Since(t0).Round(time.Millisecond))

	// The probe: another tenant's client, measured publish to handoff.
	tok, err := auth.Mint(secret, auth.Claims{Tenant: probeTenant, Scopes: []auth.Scope{auth.ScopeEvents},
		Clients: []string{auth.AllClients}, ExpiresAt: time.Now().Add(24 * time.Hour)})
	if err != nil {
		return err
	}
	c, err := client.Connect(ctx, "ws://"+addrs[0]+"/v1/events", tok,
		client.WithErrorHandler(func(err error) { slog.Error("probe", "err", err) }))
	if err != nil {
		return err
	}
	defer c.Close()
	sub, err := c.Subscribe(ctx, probeClient, schema.EventFilter{Kinds: []schema.EventKind{schema.KindMessageReceived}})
	if err != nil {
		return err
	}
	n := int(o.duration.Seconds()) * s.probeRate
	var lat []time.Duration
	var lagged uint64
	recvDone := make(chan error, 1)
	go func() {
		for len(lat) < n {
			ev, err := sub.Next(ctx)
			if err != nil {
				recvDone <- err
				return
			}
			if ev.Kind == schema.KindLagged {
				lagged += ev.Lagged.Discarded
				continue
			}
			sent := time.Unix(0, int64(binary.BigEndian.Uint64(ev.MessageReceived.MessageID)))
			lat = append(lat, time.Since(sent))
		}
		recvDone <- nil
	}()
	start := time.Now()
	// Each probe publish is waited for at once, so the latency is not a
	// publish queue's.
	if err := publishTo(ctx, js, []string{probeTenant}, []string{probeClient}, n, s.probeRate, true); err != nil {
		return err
	}
	var recvErr error
	select {
	case recvErr = <-recvDone:
	case <-time.After(30 * time.Second):
		recvErr = errors.New("probe events missing 30 s after the last publish")
	}
	elapsed := time.Since(start)
	stopSampling()
	<-sampleDone

	var stats []string
	var failed bool
	for _, h := range holders {
		line := h.stop() // the holder prints its figures and exits
		stats = append(stats, line)
		if !strings.Contains(line, "lost=0 ") || !strings.Contains(line, "errors=0 ") || !strings.HasSuffix(line, "closed=0") {
			failed = true
		}
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	fmt.Printf("soak                %v: %d probe events at %d/s, %d handed off, %d lagged\n",
		elapsed.Round(time.Second), n, s.probeRate, len(lat), lagged)
	fmt.Printf("probe latency       p50 %v  p99 %v  max %v  (publish → handoff)\n",
		pct(0.50).Round(time.Microsecond), pct(0.99).Round(time.Microsecond), pct(1).Round(time.Microsecond))
	fmt.Printf("gateway RSS         max %d MiB per process, %d MiB all %d together (sampled every 2 s)\n",
		rssMax.Load()>>20, rssSum.Load()>>20, gateways)
	for _, l := range stats {
		fmt.Printf("holder              %s\n", l)
	}
	switch {
	case recvErr != nil:
		return fmt.Errorf("probe: %w", recvErr)
	case len(lat) != n || lagged != 0:
		return fmt.Errorf("probe: %d of %d events, %d lagged", len(lat), n, lagged)
	case failed:
		return errors.New("a holder lost events, got error frames or lost connections")
	case rssMax.Load() > s.maxRSS:
		return fmt.Errorf("a gateway's RSS reached %d MiB, over -max-rss %d MiB", rssMax.Load()>>20, s.maxRSS>>20)
	}
	return nil
}

// publishTo stores n message.received events round-robin over the tenants
// and clients, paced at rate per second (0: unpaced), with the publish time
// in the message id. It waits for every acknowledgement, each at once when
// waitEach is set.
func publishTo(ctx context.Context, js jetstream.JetStream, tenants, clients []string, n, rate int, waitEach bool) error {
	start := time.Now()
	const window = 2000
	futures := make([]jetstream.PubAckFuture, 0, window)
	drain := func() error {
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		futures = futures[:0]
		return nil
	}
	for i := range n {
		if rate > 0 {
			if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
				time.Sleep(d)
			}
		}
		id := make([]byte, 16)
		binary.BigEndian.PutUint64(id, uint64(time.Now().UnixNano()))
		binary.BigEndian.PutUint64(id[8:], uint64(i))
		ev := bus.Event{
			Tenant: tenants[i%len(tenants)], ClientID: clients[i%len(clients)],
			ID: bus.EventID([]byte("bench"), id),
			Event: &schema.ClientEvent{Kind: schema.KindMessageReceived, MessageReceived: &schema.MessageReceived{
				GroupID: schema.Bytes{1, 2, 3, 4}, MessageID: id, SenderInboxID: "bench"}},
		}
		m, err := ev.Msg()
		if err != nil {
			return err
		}
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			return err
		}
		futures = append(futures, f)
		if len(futures) == window || waitEach {
			if err := drain(); err != nil {
				return err
			}
		}
	}
	return drain()
}

// startNATS starts an embedded server in a temporary folder with the
// fabric's streams and returns it, a JetStream context on it and a
// function that stops both and removes the folder.
func startNATS(ctx context.Context) (*natsserver.Server, jetstream.JetStream, func(), error) {
	dir, err := os.MkdirTemp("", "fanout-bench-")
	if err != nil {
		return nil, nil, nil, err
	}
	ns, err := natsserver.Start(ctx, natsserver.Options{StoreDir: dir, Port: natsserver.RandomPort})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, nil, err
	}
	closeAll := func() { ns.Shutdown(); os.RemoveAll(dir) }
	pub, err := ns.Connect()
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	closeAll = func() { pub.Close(); ns.Shutdown(); os.RemoveAll(dir) }
	js, err := jetstream.New(pub)
	if err == nil {
		err = streams.Ensure(ctx, js, streams.Config{})
	}
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	return ns, js, closeAll, nil
}

// child is this binary run as a gateway or a holder.
type child struct {
	cmd   *exec.Cmd
	first string // its first stdout line
	stdin io.Closer
	out   *bufio.Reader
	once  sync.Once
	last  string
}

// startProcess runs this binary with args and the secret in its
// environment, and returns once it printed its first line.
func startProcess(ctx context.Context, secret []byte, args ...string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), envSecret+"="+string(secret))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	line, err := c.out.ReadString('\n')
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("%s: %w", args[0], err)
	}
	c.first = strings.TrimSpace(line)
	return c, nil
}

// stop closes the child's stdin, which ends it, and returns the line it
// printed last.
func (c *child) stop() string {
	c.once.Do(func() {
		_ = c.stdin.Close()
		for {
			line, err := c.out.ReadString('\n')
			if l := strings.TrimSpace(line); l != "" {
				c.last = l
			}
			if err != nil {
				break
			}
		}
		_ = c.cmd.Wait()
	})
	return c.last
}

// holderOptions configure a holder child.
type holderOptions struct {
	addrs       string
	first, n    int
	replayConns int
}

// runHolder is a holder child: it opens its connections round-robin over
// the gateways, spread over the tenants, subscribes replayPerConn
// resuming subscriptions on each of its first replayConns connections and
// renews them every resubscribe, checking each got the whole backlog. It
// prints "ready", then its figures when stdin closes.
func runHolder(o options) error {
	h, s := o.holder, o.soak
	addrs := strings.Split(h.addrs, ",")
	secret := []byte(os.Getenv(envSecret))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var replayed, lost, errs, closed, resubs atomic.Int64
	var wg sync.WaitGroup
	conns := make([]*websocket.Conn, h.n)
	for i := range h.n {
		g := h.first + i
		tenant := soakTenant(g % s.tenants)
		tok, err := auth.Mint(secret, auth.Claims{Tenant: tenant, Scopes: []auth.Scope{auth.ScopeEvents},
			Clients: []string{auth.AllClients}, ExpiresAt: time.Now().Add(24 * time.Hour)})
		if err != nil {
			return err
		}
		dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
		ws, _, err := websocket.Dial(dctx, "ws://"+addrs[g%len(addrs)]+"/v1/events", &websocket.DialOptions{
			HTTPHeader:   map[string][]string{"Authorization": {"Bearer " + tok}},
			Subprotocols: []string{wire.SubprotocolMsgpack},
		})
		dcancel()
		if err != nil {
			return fmt.Errorf("connection %d: %w", g, err)
		}
		ws.SetReadLimit(1 << 20)
		conns[i] = ws
		replay := i < h.replayConns
		var mu sync.Mutex
		got := map[uint64]int{} // events per live subscription
		wg.Go(func() {
			for {
				_, b, err := ws.Read(ctx)
				if err != nil {
					if ctx.Err() == nil {
						closed.Add(1)
					}
					return
				}
				f, err := wire.Decode(wire.Msgpack, b)
				if err != nil {
					errs.Add(1)
					continue
				}
				switch f.Op {
				case wire.OpSubscribed:
					mu.Lock()
					got[f.Sub] = 0
					mu.Unlock()
				case wire.OpEvent:
					if f.Seq == 0 { // lagged
						lost.Add(1)
						continue
					}
					replayed.Add(1)
					mu.Lock()
					got[f.Sub]++
					mu.Unlock()
				case wire.OpEnded:
					mu.Lock()
					if n, ok := got[f.Sub]; ok && n != s.backlog {
						lost.Add(int64(s.backlog - n))
					}
					delete(got, f.Sub)
					mu.Unlock()
				case wire.OpError:
					errs.Add(1)
					slog.Error("holder: error frame", "code", f.Code, "message", f.Message)
				}
			}
		})
		if replay {
			wg.Go(func() { holdReplay(ctx, ws, g, s, &resubs) })
		}
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	cancel()
	for _, ws := range conns {
		_ = ws.CloseNow()
	}
	wg.Wait()
	fmt.Printf("conns=%d replay_conns=%d resubscriptions=%d replayed=%d lost=%d errors=%d closed=%d\n",
		h.n, h.replayConns, resubs.Load(), replayed.Load(), lost.Load(), errs.Load(), closed.Load())
	return nil
}

// holdReplay keeps replayPerConn resuming subscriptions on ws, renewing
// each every resubscribe (staggered), until ctx ends.
func holdReplay(ctx context.Context, ws *websocket.Conn, g int, s soakOptions, resubs *atomic.Int64) {
	f := schema.EventFilter{Kinds: []schema.EventKind{schema.KindMessageReceived}}
	write := func(fr *wire.Frame) bool {
		return ws.Write(ctx, websocket.MessageBinary, wire.Append(wire.Msgpack, nil, fr)) == nil
	}
	var id uint64
	subs := make([]uint64, s.replayPerConn) // subscription ids, assigned in order by the gateway
	for k := range s.replayPerConn {
		id++
		if !write(&wire.Frame{Op: wire.OpSubscribe, ID: id, ClientID: replayClient((g*s.replayPerConn + k) % replayClients), Filter: &f, AfterSeq: 1}) {
			return
		}
		subs[k] = id
	}
	step := s.resubscribe / time.Duration(s.replayPerConn)
	// Stagger the connections over one step.
	offset := time.Duration(g%97) * step / 97
	t := time.NewTimer(offset + step)
	defer t.Stop()
	for k := 0; ; k = (k + 1) % s.replayPerConn {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(step)
		if !write(&wire.Frame{Op: wire.OpUnsubscribe, Sub: subs[k]}) {
			return
		}
		id++
		if !write(&wire.Frame{Op: wire.OpSubscribe, ID: id, ClientID: replayClient((g*s.replayPerConn + k) % replayClients), Filter: &f, AfterSeq: 1}) {
			return
		}
		subs[k] = id
		resubs.Add(1)
	}
}
