package tests

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/demo"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/operations"
	"github.com/fabric-mls/fabric/internal/read"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

var (
	isolationPhase    = flag.Duration("isolation-phase", 15*time.Second, "BenchmarkTenantIsolation: length of each idle and each flood phase")
	isolationReps     = flag.Int("isolation-reps", 2, "BenchmarkTenantIsolation: idle and flood phases, interleaved, of each")
	isolationOpRate   = flag.Int("isolation-op-rate", 470, "BenchmarkTenantIsolation: operations per second the flooding tenant asks for")
	isolationOpBytes  = flag.Int("isolation-op-bytes", 30<<10, "BenchmarkTenantIsolation: text bytes of each flooding send")
	isolationReaders  = flag.Int("isolation-readers", 6, "BenchmarkTenantIsolation: flooding readers of pages of limit=500")
	isolationLarge    = flag.Int("isolation-large", 40, "BenchmarkTenantIsolation: ~1 MB messages in the conversation the flood reads")
	isolationNoQuotas = flag.Bool("isolation-no-quotas", false, "BenchmarkTenantIsolation: turn the per-tenant quotas and the page's byte bound off, to compare")
	isolationProbeGap = flag.Duration("isolation-probe-gap", 50*time.Millisecond, "BenchmarkTenantIsolation: pause between two probes of the quiet tenant")
)

// BenchmarkTenantIsolation measures what a flooding tenant does to
// another (issue 27): the all-in-one in process with its default quotas;
// a quiet tenant's hosted client probes in a loop — one send, timed from
// the request to its message's stream timestamp on the outbound subject
// (send → done: the operation is done when its message is there), then
// one GET …/messages?limit=50 of its conversation — through phases of
// -isolation-phase, idle and flood interleaved, -isolation-reps of each.
// In a flood phase the other tenant asks for -isolation-op-rate sends a
// second of -isolation-op-bytes each and runs -isolation-readers loops of
// GET …/messages?limit=500 over a conversation of -isolation-large
// messages of ~1 MB (seeded as converge's records), ignoring Retry-After
// but for a 10 ms pause after a 429. Reported: the quiet tenant's p50 and
// p99 of each kind, idle and flood, their ratios, and what the flood got
// accepted and refused per second. -isolation-no-quotas turns the quotas
// off, for the same figures without them.
func BenchmarkTenantIsolation(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	secret, master := make([]byte, 32), make([]byte, 32)
	_, _ = rand.Read(secret)
	_, _ = rand.Read(master)
	f := startInProcess(b, ctx, func(o *allinone.Options) {
		o.JWTSecret, o.MasterKey = secret, master
		if *isolationNoQuotas {
			o.Quotas.Operations = operations.Quotas{Rate: -1, ByteRate: -1}
			o.Quotas.Read = read.Quotas{Rate: -1, ByteRate: -1, PageBytes: 1 << 40, InFlightBytes: -1}
			o.TenantInputBytes = -1
		}
	})
	mint := func(tenant string, s auth.Scope) string {
		return ok[string](b)(auth.Mint(secret, auth.Claims{Tenant: tenant, Scopes: []auth.Scope{s}, Clients: []string{auth.AllClients}, ExpiresAt: time.Now().Add(2 * time.Hour)}))
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	type tenantClient struct {
		tenant, id string
		ops        *client.Operations
		group      []byte
		send, read string // tokens
	}
	setUp := func(tenant string) tenantClient {
		account := make([]byte, 32)
		_, _ = rand.Read(account)
		api := &demo.API{BaseURL: f.URL, Tenant: tenant, AdminToken: mint(tenant, auth.ScopeAdmin)}
		reg := ok[demo.Registered](b)(api.Register(ctx, hex.EncodeToString(account)))
		c := tenantClient{tenant: tenant, id: reg.ClientID, send: mint(tenant, auth.ScopeSend), read: mint(tenant, auth.ScopeRead)}
		c.ops = client.NewOperations(f.URL, tenant, c.send, hc)
		name := "isolation"
		created := ok[schema.OperationAccepted](b)(c.ops.CreateConversation(ctx, c.id, "create", schema.CreateConversation{Name: &name}))
		operationDone(b, ctx, c.ops, c.id, created.OperationID)
		c.group = created.GroupID
		return c
	}
	quiet, flood := setUp("quiet"), setUp("flood")
	largeGroup := seedLarge(b, ctx, f, master, flood.tenant, flood.id, *isolationLarge)

	// The quiet tenant's outbound subject, read as a bridge reads it.
	js := connectAsBridge(b, f)
	subj := ok[string](b)(subject.Outbound(quiet.tenant, hex.EncodeToString(quiet.group)))
	out := ok[jetstream.Consumer](b)(js.CreateOrUpdateConsumer(ctx, streams.StreamEvents, jetstream.ConsumerConfig{
		Durable: "isolation", FilterSubject: subj, AckPolicy: jetstream.AckNonePolicy, DeliverPolicy: jetstream.DeliverNewPolicy}))

	get := func(tenant, clientID, token, path string) (int, int) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.URL+"/v1/tenants/"+tenant+"/clients/"+clientID+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			return 0, 0
		}
		defer resp.Body.Close()
		n, _ := io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, int(n)
	}
	probeN := 0
	var quietErrors atomic.Int64
	// probe is one send and one read of the quiet tenant; a refusal or a
	// failure is counted and its time is not.
	probe := func() (send, read time.Duration, okSend, okRead bool) {
		probeN++
		key := fmt.Sprintf("probe-%d", probeN)
		id := hex.EncodeToString(bus.OperationID(quiet.tenant, quiet.id, key))
		t0 := time.Now()
		if _, err := quiet.ops.SendText(ctx, quiet.id, quiet.group, key, "a probe of a typical length, from the quiet tenant"); err != nil {
			fmt.Fprintln(os.Stderr, "quiet send:", err)
			quietErrors.Add(1)
		} else {
			for !okSend && time.Since(t0) < 2*time.Minute {
				m, err := out.Next(jetstream.FetchMaxWait(time.Minute))
				if err != nil {
					fmt.Fprintln(os.Stderr, "quiet outbound:", err)
					continue
				}
				if m.Headers().Get(bus.HeaderOperationID) == id {
					send, okSend = ok[*jetstream.MsgMetadata](b)(m.Metadata()).Timestamp.Sub(t0), true
				}
			}
			if !okSend {
				quietErrors.Add(1)
			}
		}
		t0 = time.Now()
		st, _ := get(quiet.tenant, quiet.id, quiet.read, "/conversations/"+hex.EncodeToString(quiet.group)+"/messages?limit=50")
		if st != http.StatusOK {
			fmt.Fprintln(os.Stderr, "quiet read:", st)
			quietErrors.Add(1)
		}
		return send, time.Since(t0), okSend, st == http.StatusOK
	}

	// The flood: sends at the asked rate, each in its own goroutine (at
	// most 128 in flight), and readers back to back.
	var opsOK, opsRefused, readsOK, readsRefused, readBytes, other atomic.Int64 // other: neither accepted nor 429
	var lastAccepted atomic.Pointer[schema.Bytes]                               // the flood's operation answered 202 last
	text := strings.Repeat("f", *isolationOpBytes)
	runFlood := func(fctx context.Context) {
		var wg sync.WaitGroup
		defer wg.Wait()
		for range *isolationReaders {
			wg.Go(func() {
				for fctx.Err() == nil {
					st, n := get(flood.tenant, flood.id, flood.read, "/conversations/"+largeGroup+"/messages?limit=500")
					if st == http.StatusOK {
						readsOK.Add(1)
						readBytes.Add(int64(n))
						continue
					}
					if st == http.StatusTooManyRequests {
						readsRefused.Add(1)
					} else if fctx.Err() == nil {
						if other.Add(1) <= 3 {
							fmt.Fprintln(os.Stderr, "flood read:", st)
						}
					}
					time.Sleep(10 * time.Millisecond)
				}
			})
		}
		if *isolationOpRate <= 0 {
			<-fctx.Done()
			return
		}
		sem := make(chan struct{}, 128)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		per := max(*isolationOpRate/100, 1)
		for i := 0; ; {
			select {
			case <-fctx.Done():
				return
			case <-tick.C:
			}
			for range per {
				i++
				select {
				case sem <- struct{}{}:
				default:
					continue // the flood's own bound
				}
				key := fmt.Sprintf("flood-%d", i)
				wg.Go(func() {
					defer func() { <-sem }()
					var apiErr *client.APIError
					acc, err := flood.ops.SendText(fctx, flood.id, flood.group, key, text)
					switch {
					case err == nil:
						opsOK.Add(1)
						lastAccepted.Store(&acc.OperationID)
					case errors.As(err, &apiErr) && apiErr.Status == http.StatusTooManyRequests:
						opsRefused.Add(1)
					case fctx.Err() == nil:
						if other.Add(1) <= 3 {
							fmt.Fprintln(os.Stderr, "flood send:", err)
						}
					}
				})
			}
		}
	}

	type phase struct {
		flood                                            bool
		send, read                                       []time.Duration
		elapsed                                          time.Duration
		opsOK, opsRefused, readsOK, readsRefused, readMB float64
	}
	var phases []phase
	b.ResetTimer()
	for rep := range *isolationReps {
		for _, flooding := range []bool{false, true} {
			p := phase{flood: flooding}
			fctx, stop := context.WithCancel(ctx)
			floodDone := make(chan struct{})
			o0, or0, r0, rr0, rb0 := opsOK.Load(), opsRefused.Load(), readsOK.Load(), readsRefused.Load(), readBytes.Load()
			if flooding {
				go func() { defer close(floodDone); runFlood(fctx) }()
			} else {
				close(floodDone)
			}
			start := time.Now()
			for time.Since(start) < *isolationPhase {
				s, r, okS, okR := probe()
				if okS {
					p.send = append(p.send, s)
				}
				if okR {
					p.read = append(p.read, r)
				}
				time.Sleep(*isolationProbeGap)
			}
			p.elapsed = time.Since(start)
			stop()
			<-floodDone
			secs := p.elapsed.Seconds()
			p.opsOK, p.opsRefused = float64(opsOK.Load()-o0)/secs, float64(opsRefused.Load()-or0)/secs
			p.readsOK, p.readsRefused = float64(readsOK.Load()-r0)/secs, float64(readsRefused.Load()-rr0)/secs
			p.readMB = float64(readBytes.Load()-rb0) / secs / (1 << 20)
			phases = append(phases, p)
			name := map[bool]string{false: "idle", true: "flood"}[flooding]
			fmt.Fprintf(os.Stderr, "rep %d %-5s: %3d probes, send p50 %6.1f p99 %6.1f ms, read p50 %6.1f p99 %6.1f ms; flood ops %5.1f/s accepted %6.1f/s refused, reads %5.1f/s accepted (%5.1f MiB/s) %6.1f/s refused\n",
				rep+1, name, len(p.send), msf(pct(p.send, 0.5)), msf(pct(p.send, 0.99)), msf(pct(p.read, 0.5)), msf(pct(p.read, 0.99)),
				p.opsOK, p.opsRefused, p.readsOK, p.readMB, p.readsRefused)
			// Converge finishes the flood's accepted sends (one group, in
			// order) before an idle phase measures.
			if id := lastAccepted.Load(); flooding && id != nil {
				eventually.NoErrorWithin(b, 5*time.Minute, func() error {
					rec, err := flood.ops.Operation(ctx, flood.id, *id)
					if err != nil || (rec.Status != schema.OperationDone && rec.Status != schema.OperationFailed) {
						return fmt.Errorf("the flood's last operation: %+v %v", rec, err)
					}
					return nil
				})
			}
		}
	}
	b.StopTimer()
	// Reported, not failed: what the flood and the quiet tenant got
	// besides their answers is a figure of the run.
	b.ReportMetric(float64(other.Load()), "flood-other-answers")
	b.ReportMetric(float64(quietErrors.Load()), "quiet-failures")
	all := func(flooding bool, sel func(phase) []time.Duration) []time.Duration {
		var ds []time.Duration
		for _, p := range phases {
			if p.flood == flooding {
				ds = append(ds, sel(p)...)
			}
		}
		return ds
	}
	sends := func(p phase) []time.Duration { return p.send }
	reads := func(p phase) []time.Duration { return p.read }
	idleSend, floodSend := pct(all(false, sends), 0.99), pct(all(true, sends), 0.99)
	idleRead, floodRead := pct(all(false, reads), 0.99), pct(all(true, reads), 0.99)
	b.ReportMetric(msf(pct(all(false, sends), 0.5)), "idle-send-p50-ms")
	b.ReportMetric(msf(idleSend), "idle-send-p99-ms")
	b.ReportMetric(msf(pct(all(true, sends), 0.5)), "flood-send-p50-ms")
	b.ReportMetric(msf(floodSend), "flood-send-p99-ms")
	b.ReportMetric(float64(floodSend)/float64(idleSend), "send-p99-ratio")
	b.ReportMetric(msf(pct(all(false, reads), 0.5)), "idle-read-p50-ms")
	b.ReportMetric(msf(idleRead), "idle-read-p99-ms")
	b.ReportMetric(msf(pct(all(true, reads), 0.5)), "flood-read-p50-ms")
	b.ReportMetric(msf(floodRead), "flood-read-p99-ms")
	b.ReportMetric(float64(floodRead)/float64(idleRead), "read-p99-ratio")
}

// natsAs connects as one of the all-in-one's NATS users until the test
// ends.
func natsAs(b *testing.B, f *allinone.Fabric, user string) *nats.Conn {
	pw := ok[[]byte](b)(os.ReadFile(allinone.NATSPasswordFile(f.DataDir(), user)))
	nc := ok[*nats.Conn](b)(nats.Connect(f.NATSURL, nats.UserInfo(user, strings.TrimSpace(string(pw))), nats.CustomInboxPrefix(allinone.InboxPrefix(user))))
	b.Cleanup(nc.Close)
	return nc
}

// seedLarge stores, as converge's records, a conversation of clientID's
// of n text messages of about 1 MB, and returns its group id in hex.
func seedLarge(b *testing.B, ctx context.Context, f *allinone.Fabric, master []byte, tenant, clientID string, n int) string {
	js := ok[jetstream.JetStream](b)(jetstream.New(natsAs(b, f, allinone.UserConverge)))
	vault := ok[*engine.Vault](b)(engine.NewVault(master))
	kv := ok[jetstream.KeyValue](b)(js.KeyValue(ctx, streams.BucketClients))
	salt := ok[[]byte](b)(readmodel.TenantSalt(ctx, kv, tenant, true))
	sealer := ok[*readmodel.Sealer](b)(readmodel.NewSealer(vault, tenant, salt))
	gid := make([]byte, 32)
	_, _ = rand.Read(gid)
	g := hex.EncodeToString(gid)
	payload := ok[[]byte](b)(apppayload.Encode(apppayload.NewText(strings.Repeat("L", 1000_000))))
	ct := &schema.ContentTypeID{AuthorityID: "xmtp.org", TypeID: "text", VersionMajor: 1}
	now := time.Now().UnixMilli()
	publish := func(subj string, v any) {
		m := ok[*nats.Msg](b)(readmodel.RecordMsg(subj, v))
		ok[*jetstream.PubAck](b)(js.PublishMsg(ctx, m))
	}
	for i := 1; i <= n; i++ {
		id := make([]byte, 32)
		_, _ = rand.Read(id)
		content := ok[[]byte](b)(sealer.Seal(gid, uint64(i), payload))
		publish(ok[string](b)(readmodel.MessageSubject(tenant, g, uint64(i))), readmodel.Message{N: uint64(i), ID: id, GroupID: gid,
			SenderInboxID: g, SenderInstallation: gid, Seq: uint64(i), SentAt: now, State: readmodel.StateDelivered, ContentType: ct, Content: content})
	}
	installation, _ := hex.DecodeString(clientID)
	publish(ok[string](b)(readmodel.ConversationSubject(tenant, g, clientID)), readmodel.Conversation{GroupID: gid, ClientID: clientID,
		InboxID: g, Installation: installation, Epoch: 1, Inboxes: 2, Installations: 2, Delivered: uint64(n), FirstN: 1, Activity: now})
	return g
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pct is the p-quantile of ds (nearest rank).
func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}
