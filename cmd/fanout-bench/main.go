// Command fanout-bench measures the fanout gateway on loopback: it starts an
// embedded nats-server with the fabric's streams and the gateway in a child
// process (so the gateway's memory is its own), opens -subs WebSocket
// subscriptions through the SDK, publishes -events events through the event
// bus, and prints events delivered per second, the p50/p99/max latency from
// publish to handoff, and the gateway's memory per idle subscription.
//
//	go run ./cmd/fanout-bench -subs 1000 -events 20000 -rate 2000
//	go run ./cmd/fanout-bench -subs 10000 -events 10000 -rate 1000 -duration 60s
//
// Subscriptions are spread over -clients client ids (so one event reaches
// subs/clients subscriptions) and -conns WebSocket connections. The run is
// bounded by -duration whatever happens.
//
// -soak holds -idle-conns connections and -replay-subs resuming
// subscriptions for -duration while a probe client's events are measured
// (soak.go; docs/limits.md has its figures):
//
//	go run ./cmd/fanout-bench -soak -duration 5m
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/fanout"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

const (
	tenant     = "bench"
	memPath    = "/bench/memstats"
	envSecret  = "FANOUT_BENCH_SECRET"
	maxSamples = 2000 // latency samples kept per subscription
)

type options struct {
	subs     int
	events   int
	clients  int
	conns    int
	duration time.Duration
	rate     int
	json     bool

	child   bool
	natsURL string
	profile string
	// natsProfile and selfProfile are the CPU profiles of the -load
	// nats-server child and of the load generator itself.
	natsProfile string
	selfProfile string

	soakMode    bool
	loadMode    bool
	childNATS   bool
	load        loadOptions
	childHolder bool
	soak        soakOptions
	holder      holderOptions
}

func main() {
	var o options
	flag.IntVar(&o.subs, "subs", 1000, "subscriptions")
	flag.IntVar(&o.events, "events", 10000, "events to publish, spread over the clients")
	flag.IntVar(&o.clients, "clients", 0, "distinct client ids (default subs/10)")
	flag.IntVar(&o.conns, "conns", 0, "WebSocket connections (default subs/100, at least 1)")
	flag.DurationVar(&o.duration, "duration", 60*time.Second, "upper bound on the whole run (-load: 30m)")
	flag.IntVar(&o.rate, "rate", 2000, "events published per second; 0 publishes as fast as the stream takes them")
	flag.BoolVar(&o.json, "json", false, "use the JSON subprotocol instead of msgpack")
	flag.BoolVar(&o.child, "child-gateway", false, "internal: run only the gateway")
	flag.StringVar(&o.natsURL, "nats-url", "", "internal: NATS for -child-gateway")
	flag.StringVar(&o.profile, "gateway-cpuprofile", "", "write the gateway's CPU profile to this file")
	flag.StringVar(&o.natsProfile, "nats-cpuprofile", "", "load: write the nats-server child's CPU profile to this file")
	flag.StringVar(&o.selfProfile, "cpuprofile", "", "load: write the load generator's own CPU profile (publishers and subscribers) to this file")
	flag.BoolVar(&o.soakMode, "soak", false, "hold -idle-conns connections and -replay-subs resuming subscriptions for -duration while measuring a probe client")
	flag.IntVar(&o.soak.idleConns, "idle-conns", 20000, "soak: WebSocket connections, the replay ones included")
	flag.IntVar(&o.soak.replaySubs, "replay-subs", 1000, "soak: subscriptions resuming from after_seq=1")
	flag.IntVar(&o.soak.replayPerConn, "replay-per-conn", 10, "soak: resuming subscriptions per connection")
	flag.IntVar(&o.soak.backlog, "backlog", 100, "soak: stored events each resuming subscription replays")
	flag.IntVar(&o.soak.tenants, "tenants", 50, "soak: tenants the connections are spread over")
	flag.IntVar(&o.soak.probeRate, "probe-rate", 100, "soak: probe events per second")
	flag.DurationVar(&o.soak.resubscribe, "resubscribe", 30*time.Second, "soak: how often each resuming subscription is renewed")
	flag.IntVar(&o.soak.perProcess, "per-process", 7000, "soak: connections per gateway and per holder process (each below its descriptor limit)")
	flag.Int64Var(&o.soak.maxRSS, "max-rss", 512, "soak: MiB of RSS a gateway process may reach")
	flag.BoolVar(&o.loadMode, "load", false, "compare the fabric with -centrifugo: one subscriber per WebSocket, throughput, CPU and RSS per subscriber, latency at -load-rate (load.go)")
	flag.StringVar(&o.load.subs, "load-subs", "1000,10000", "load: subscriber counts, comma-separated")
	flag.IntVar(&o.load.rounds, "rounds", 3, "load: rounds, each system once per round in rotated order")
	flag.IntVar(&o.load.burst, "burst", 50000, "load: events published as fast as accepted, for delivered events/s and CPU per event")
	flag.IntVar(&o.load.rate, "load-rate", 1000, "load: events per second of the latency phase")
	flag.DurationVar(&o.load.rateFor, "rate-for", 5*time.Second, "load: length of the latency phase")
	flag.IntVar(&o.load.publishers, "publishers", 4, "load: concurrent publishers")
	flag.IntVar(&o.load.rateBatch, "rate-batch", 100, "load: events per publish in the latency phase (a fabric group message to as many hosted members; a Centrifugo /api/batch of as many publishes)")
	flag.IntVar(&o.load.groupMessages, "group-messages-per-batch", convergeGroupMessages, "load: group messages of 100 hosted members per publish of the burst: the fabric's atomic batch holds their events and one checkpoint, as converge's transaction under backlog at its default -max-batch 1000 (4; 92 at the -max-batch=10000 of deploy/ and the all-in-one: load.go convergeGroupMessages); Centrifugo's /api/batch as many publishes")
	flag.StringVar(&o.load.fabricPublish, "fabric-publish", "batch", "load: how the fabric's events are stored, comma-separated, each measured: batch (one atomic batch per group message with its checkpoint, as converge stores them), event (one JetStream async publish with Nats-Msg-Id per event)")
	flag.StringVar(&o.load.centrifugo, "centrifugo", "", "load: path of a centrifugo v6 binary to compare with")
	flag.BoolVar(&o.load.centrifugoHistory, "centrifugo-history", false, "load: also measure Centrifugo with history and forced recovery on its channels, as the fabric stores every event")
	flag.StringVar(&o.load.centrifugoRedis, "centrifugo-redis", "", "load: also measure Centrifugo on its Redis engine with history and forced recovery, started with this redis-server binary (append-only file fsynced every second: kept across a restart, as the fabric's events are)")
	flag.BoolVar(&o.childNATS, "child-nats", false, "internal: run only nats-server")
	flag.BoolVar(&o.childHolder, "child-holder", false, "internal: hold soak connections")
	flag.StringVar(&o.holder.addrs, "addrs", "", "internal: gateways for -child-holder")
	flag.IntVar(&o.holder.first, "holder-first", 0, "internal: first connection index of -child-holder")
	flag.IntVar(&o.holder.n, "holder-conns", 0, "internal: connections of -child-holder")
	flag.IntVar(&o.holder.replayConns, "holder-replay-conns", 0, "internal: connections of -child-holder with resuming subscriptions")
	flag.Parse()
	if o.loadMode && !flagSet("duration") {
		// Rounds of both systems at 10,000 subscribers take minutes on a
		// loaded machine; the 60 s default is the single run's.
		o.duration = 30 * time.Minute
	}
	o.soak.maxRSS <<= 20
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	var err error
	switch {
	case o.child:
		err = runGateway(o)
	case o.childHolder:
		err = runHolder(o)
	case o.childNATS:
		err = runNATS(o.natsProfile)
	case o.loadMode:
		err = runLoad(o)
	case o.soakMode:
		err = runSoak(o)
	default:
		err = run(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fanout-bench:", err)
		os.Exit(1)
	}
}

// runGateway is the child: the gateway alone, plus an endpoint reporting its
// memory after a collection. It prints its address and serves until stdin
// closes.
func runGateway(o options) error {
	stop, err := startCPUProfile(o.profile)
	if err != nil {
		return err
	}
	defer stop()
	v, err := auth.NewVerifier([]byte(os.Getenv(envSecret)))
	if err != nil {
		return err
	}
	nc, err := nats.Connect(o.natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	g, err := fanout.New(fanout.Config{NATS: nc, Verifier: v, MaxSubscriptions: 1 << 16, MaxConnsPerTenant: -1})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/", g.Handler())
	mux.HandleFunc(memPath, func(w http.ResponseWriter, _ *http.Request) {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		_ = json.NewEncoder(w).Encode(memReport{HeapInuse: m.HeapInuse, StackInuse: m.StackInuse, Goroutines: runtime.NumGoroutine()})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	gctx, stopGateway := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- g.Run(gctx) }()
	fmt.Println(ln.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin) // the parent closes stdin to stop us
	stopGateway()
	gerr := <-ran
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(gerr, srv.Shutdown(ctx))
}

// flagSet reports whether the command line set flag name.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// startCPUProfile writes this process's CPU profile to path until stop;
// nothing when path is empty.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

type memReport struct {
	HeapInuse  uint64 `json:"heap_inuse"`
	StackInuse uint64 `json:"stack_inuse"`
	Goroutines int    `json:"goroutines"`
}

func (m memReport) total() int64 { return int64(m.HeapInuse + m.StackInuse) }

func run(o options) error {
	if o.clients <= 0 {
		o.clients = max(1, o.subs/10)
	}
	if o.conns <= 0 {
		o.conns = max(1, o.subs/100)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.duration)
	defer cancel()

	ns, js, closeNATS, err := startNATS(ctx)
	if err != nil {
		return err
	}
	defer closeNATS()

	secret := make([]byte, 48)
	for i := range secret {
		secret[i] = byte('a' + i%26)
	}
	gw, err := startProcess(ctx, secret, "-child-gateway", "-nats-url", ns.ClientURL(), "-gateway-cpuprofile", o.profile)
	if err != nil {
		return err
	}
	defer gw.stop()
	addr := gw.first
	base := "http://" + addr
	idle, err := memstats(ctx, base)
	if err != nil {
		return err
	}

	clientIDs := make([]string, o.clients)
	for i := range clientIDs {
		clientIDs[i] = fmt.Sprintf("%08x", i+1)
	}
	// The gateway serves hosted clients only: each gets a record.
	kv, err := js.KeyValue(ctx, streams.BucketClients)
	if err != nil {
		return err
	}
	for _, id := range clientIDs {
		if _, err := kv.Put(ctx, tenant+"."+id, []byte{0x80}); err != nil {
			return err
		}
	}
	tok, err := auth.Mint(secret, auth.Claims{Tenant: tenant, Scopes: []auth.Scope{auth.ScopeEvents},
		Clients: []string{auth.AllClients}, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		return err
	}
	var copts []client.Option
	if o.json {
		copts = append(copts, client.WithJSON())
	}
	copts = append(copts, client.WithErrorHandler(func(err error) { slog.Error("client", "err", err) }))
	conns := make([]*client.Client, o.conns)
	for i := range conns {
		c, err := client.Connect(ctx, "ws://"+addr+"/v1/events", tok, copts...)
		if err != nil {
			return fmt.Errorf("connect %d: %w", i, err)
		}
		conns[i] = c
		defer c.Close()
	}
	t0 := time.Now()
	subs := make([]*client.Subscription, o.subs)
	perClient := make([]int, o.clients)
	for i := range subs {
		cl := i % o.clients
		s, err := conns[i%o.conns].Subscribe(ctx, clientIDs[cl],
			schema.EventFilter{Kinds: []schema.EventKind{schema.KindMessageReceived}})
		if err != nil {
			return fmt.Errorf("subscribe %d: %w", i, err)
		}
		subs[i] = s
		perClient[cl]++
	}
	subTime := time.Since(t0)
	loaded, err := memstats(ctx, base)
	if err != nil {
		return err
	}

	// Each subscription expects the events of its client.
	expect := make([]int, o.clients)
	for i := range o.events {
		expect[i%o.clients]++
	}
	var total int64
	for cl := range o.clients {
		total += int64(expect[cl] * perClient[cl])
	}
	var delivered, lagged atomic.Int64
	samples := make([][]time.Duration, o.subs)
	var wg sync.WaitGroup
	for i, s := range subs {
		want := expect[i%o.clients]
		wg.Go(func() {
			lat := make([]time.Duration, 0, min(want, maxSamples))
			for got := 0; got < want; {
				ev, err := s.Next(ctx)
				if err != nil {
					break
				}
				if ev.Kind == schema.KindLagged {
					lagged.Add(int64(ev.Lagged.Discarded))
					got += int(ev.Lagged.Discarded)
					continue
				}
				got++
				delivered.Add(1)
				if len(lat) < maxSamples {
					sent := time.Unix(0, int64(binary.BigEndian.Uint64(ev.MessageReceived.MessageID)))
					lat = append(lat, time.Since(sent))
				}
			}
			samples[i] = lat
		})
	}

	start := time.Now()
	if err := publishTo(ctx, js, []string{tenant}, clientIDs, o.events, o.rate, false); err != nil {
		return err
	}
	pubTime := time.Since(start)
	wg.Wait()
	elapsed := time.Since(start)

	var all []time.Duration
	for _, l := range samples {
		all = append(all, l...)
	}
	slices.Sort(all)
	pct := func(p float64) time.Duration {
		if len(all) == 0 {
			return 0
		}
		return all[min(len(all)-1, int(p*float64(len(all))))]
	}
	perSub := float64(loaded.total()-idle.total()) / float64(o.subs)
	enc := "msgpack"
	if o.json {
		enc = "json"
	}
	fmt.Printf("subscriptions       %d on %d connections, %d clients (%d subscriptions per event), %s\n",
		o.subs, o.conns, o.clients, o.subs/o.clients, enc)
	fmt.Printf("subscribe           %v total, %v each\n", subTime.Round(time.Millisecond), (subTime / time.Duration(o.subs)).Round(time.Microsecond))
	fmt.Printf("events published    %d in %v (%.0f/s, -rate %d)\n", o.events, pubTime.Round(time.Millisecond), float64(o.events)/pubTime.Seconds(), o.rate)
	fmt.Printf("handoffs            %d of %d expected, %d discarded (lagged), in %v\n", delivered.Load(), total, lagged.Load(), elapsed.Round(time.Millisecond))
	// An event reaching k subscriptions is k handoffs; -load counts one
	// subscriber per connection.
	fmt.Printf("handoffs/s          %.0f (one per subscription an event reaches)\n", float64(delivered.Load())/elapsed.Seconds())
	fmt.Printf("latency publish→handoff  p50 %v  p99 %v  max %v  (%d samples)\n",
		pct(0.50).Round(time.Microsecond), pct(0.99).Round(time.Microsecond), pct(1).Round(time.Microsecond), len(all))
	fmt.Printf("gateway memory      %.0f bytes of heap+stacks per idle subscription, %d subscriptions sharing each connection (%d → %d), goroutines %d → %d\n",
		perSub, o.subs/o.conns, idle.total(), loaded.total(), idle.Goroutines, loaded.Goroutines)
	if p50, p99, err := gatewayLatency(ctx, base); err == nil {
		fmt.Printf("gateway stored→written  p50 ≤ %v  p99 ≤ %v  (fabric_fanout_handoff_latency_seconds buckets)\n", p50, p99)
	}
	if ctx.Err() != nil {
		return errors.New("the run hit -duration before every event was handed off")
	}
	return nil
}

// gatewayLatency reads the gateway's handoff latency histogram and returns
// the upper bounds of the buckets holding its 50th and 99th percentiles.
func gatewayLatency(ctx context.Context, base string) (p50, p99 time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	type bucket struct {
		le    float64
		count float64
	}
	var buckets []bucket
	sc := bufio.NewScanner(resp.Body)
	const prefix = `fabric_fanout_handoff_latency_seconds_bucket{le="`
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok {
			continue
		}
		le, count, ok := strings.Cut(rest, `"} `)
		if !ok || le == "+Inf" {
			continue
		}
		var b bucket
		if _, err := fmt.Sscan(le, &b.le); err != nil {
			continue
		}
		if _, err := fmt.Sscan(count, &b.count); err != nil {
			continue
		}
		buckets = append(buckets, b)
	}
	if len(buckets) == 0 || buckets[len(buckets)-1].count == 0 {
		return 0, 0, errors.New("no latency observed")
	}
	total := buckets[len(buckets)-1].count
	at := func(q float64) time.Duration {
		for _, b := range buckets {
			if b.count >= q*total {
				return time.Duration(b.le * float64(time.Second))
			}
		}
		return time.Duration(buckets[len(buckets)-1].le * float64(time.Second))
	}
	return at(0.50), at(0.99), sc.Err()
}

func memstats(ctx context.Context, base string) (memReport, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+memPath, nil)
	if err != nil {
		return memReport{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return memReport{}, err
	}
	defer resp.Body.Close()
	var m memReport
	return m, json.NewDecoder(resp.Body).Decode(&m)
}
