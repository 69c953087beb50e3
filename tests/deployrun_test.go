package tests

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/demo"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/pkg/schema"
)

var deployRun = flag.Bool("deploy", false, "run deploy/ on a three-node NATS cluster with the roles as processes (TestDeployRuns*, about a minute)")

// TestDeployRunsAsWritten runs deploy/ the way compose and Kubernetes do:
// a three-node NATS cluster from deploy/nats (ports and folders rewritten to
// the test's, nothing else), provisioning as the provision job does, and
// every role as a process with exactly the user, flags and secrets the
// deploy files give it. It plays the demo conversation, kills one NATS node
// and one converge worker while it flows, and checks that the hosted
// client's events all arrive at the gateway, each once (EVENT-001). Each
// role's user is refused what its role must not do.
func TestDeployRunsAsWritten(t *testing.T) { runDeploy(t, "") }

// TestDeployRunsInAJetStreamDomain is the same run with the servers'
// JetStream in a domain and every role given it (-nats-domain), as on a
// leaf node or in a hub and spoke deploy.
func TestDeployRunsInAJetStreamDomain(t *testing.T) { runDeploy(t, "fabric") }

// deployment is a running deploy: its cluster and its roles.
type deployment struct {
	cluster   *deployCluster
	roles     map[string]roleCommand
	domain    string
	jwt       string
	masterKey string
	procs     map[string]*process // by instance: ingest, api, converge-a, converge-b, fanout
	addrs     map[string]string   // HTTP address by instance
}

func runDeploy(t *testing.T, domain string) {
	if !*deployRun {
		t.Skip("the deploy run takes about a minute under -race; run it with -args -deploy (.ci/run does)")
	}
	roles, files := deployRoles(t)
	files = append(files, "deploy/nats/nats-1.conf", "deploy/nats/nats-2.conf", "deploy/nats/nats-3.conf", "deploy/nats/accounts.conf")
	t.Logf("deploy files: %s", strings.Join(files, ", "))

	d := &deployment{roles: roles, domain: domain, procs: map[string]*process{}, addrs: map[string]string{}}
	d.cluster = writeDeployNATS(t, t.TempDir(), domain)
	d.cluster.start(t)
	d.provision(t)

	d.jwt = randomHex(32)
	d.masterKey = randomHex(32)
	d.startRole(t, "ingest", "ingest")
	d.startRole(t, "api", "api")
	d.startRole(t, "converge-a", "converge")
	d.startRole(t, "converge-b", "converge")
	d.startRole(t, "fanout", "fanout")
	for name, addr := range d.addrs {
		waitReady(t, "http://"+addr+"/readyz", time.Minute)
		t.Logf("%s ready on %s", name, addr)
	}

	t.Run("refusals", func(t *testing.T) { d.checkRefusals(t) })
	d.playDemo(t)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// args is role's command line from the deploy files with what names a
// place made this test's: the cluster's loopback URLs, the test CA, a worker
// id, a free HTTP address; and the domain when the run has one.
func (d *deployment) args(t *testing.T, role, instance string) ([]string, []string) {
	t.Helper()
	c := d.roles[role]
	args := slices.Clone(c.subcommand())
	for _, name := range slices.Sorted(maps.Keys(c.settings)) {
		v := c.settings[name]
		switch name {
		case "nats-url":
			v = d.cluster.url(t, v)
		case "nats-ca":
			v = filepath.Join(d.cluster.dir, "tls", filepath.Base(v))
		case "worker-id":
			v = instance
		}
		args = append(args, "-"+name+"="+v)
	}
	if d.domain != "" {
		args = append(args, "-nats-domain="+d.domain)
	}
	var env []string
	for k, ref := range c.secrets {
		switch k {
		case "FABRIC_NATS_PASSWORD":
			user := strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(ref, "FABRIC_"), "_PASSWORD"))
			env = append(env, k+"="+d.cluster.passwords[user])
		case "FABRIC_JWT_SECRET":
			env = append(env, k+"="+d.jwt)
		case "FABRIC_MASTER_KEY":
			env = append(env, k+"="+d.masterKey)
		}
	}
	return args, env
}

// provision runs the provision job's command until it succeeds, as the
// job's restartPolicy OnFailure does while the cluster elects its leaders.
func (d *deployment) provision(t *testing.T) {
	t.Helper()
	args, env := d.args(t, "provision", "provision")
	bin := filepath.Join(binaries(t), d.roles["provision"].binary())
	deadline := time.Now().Add(time.Minute)
	for {
		out, code := runToExit(t, bin, env, args...)
		if code == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fabric provision %v failed for a minute:\n%s", args, out)
		}
		time.Sleep(time.Second)
	}
}

func (d *deployment) startRole(t *testing.T, instance, role string) {
	t.Helper()
	args, env := d.args(t, role, instance)
	addr := freeAddr(t)
	args = append(args, "-listen="+addr)
	d.procs[instance] = start(t, filepath.Join(binaries(t), d.roles[role].binary()), env, args...)
	d.addrs[instance] = addr
}

// connect opens a NATS connection as user, the way the roles do.
func (d *deployment) connect(t *testing.T, user string, errs chan<- error) *nats.Conn {
	t.Helper()
	var urls []string
	for _, n := range d.cluster.nodes {
		if n.srv.Running() {
			urls = append(urls, fmt.Sprintf("tls://127.0.0.1:%d", n.client))
		}
	}
	opts := []nats.Option{
		nats.UserInfo(user, d.cluster.passwords[user]),
		nats.CustomInboxPrefix("_INBOX_" + user),
		nats.RootCAs(filepath.Join(d.cluster.dir, "tls", "ca.crt")),
	}
	if errs != nil {
		opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}))
	}
	nc, err := nats.Connect(strings.Join(urls, ","), opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// api is the JetStream API prefix of the run's domain.
func (d *deployment) api() string {
	if d.domain != "" {
		return "$JS." + d.domain + ".API."
	}
	return "$JS.API."
}

// checkRefusals shows each role's user refused what its role must not do.
func (d *deployment) checkRefusals(t *testing.T) {
	api := d.api()
	type attempt struct {
		op, subject string // op: pub or sub
	}
	deleteAndPurge := func(streams ...string) []attempt {
		var a []attempt
		for _, s := range streams {
			a = append(a, attempt{"pub", api + "STREAM.DELETE." + s}, attempt{"pub", api + "STREAM.PURGE." + s})
		}
		return a
	}
	all := []string{"FABRIC_IN", "FABRIC_EVENTS", "FABRIC_OUTCOMES", "FABRIC_RETAINED", "KV_fabric-clients", "KV_fabric-converge"}
	refused := map[string][]attempt{
		"ingest": append(deleteAndPurge(all...),
			attempt{"pub", "fabric.ev.dev.c1"}, attempt{"pub", "fabric.ck.dev.g1"},
			attempt{"pub", "$KV.fabric-clients.dev.c1"}, attempt{"pub", "$KV.fabric-converge.k"},
			attempt{"pub", api + "DIRECT.GET.FABRIC_EVENTS"}, attempt{"pub", api + "DIRECT.GET.KV_fabric-clients.$KV.fabric-clients.dev.c1"},
			attempt{"pub", api + "CONSUMER.CREATE.FABRIC_EVENTS.x.fabric.ev.>"}, attempt{"pub", api + "CONSUMER.CREATE.KV_fabric-clients"},
			// issue 27: its own consumer made again on the events
			attempt{"pub", api + "CONSUMER.CREATE.FABRIC_EVENTS.ingest-outbound.fabric.ev.*.*"},
			attempt{"pub", api + "CONSUMER.CREATE.FABRIC_EVENTS.ingest-outbound"},
			attempt{"sub", "fabric.live.>"}, attempt{"sub", "fabric.ev.>"}, attempt{"sub", "_INBOX_api.>"}, attempt{"sub", "_INBOX.>"},
			attempt{"sub", "fabric.in.>"}),
		// issue 27: converge purges nothing, FABRIC_EVENTS included
		"converge": append(deleteAndPurge(all...),
			attempt{"pub", "fabric.in.dev.g1.m1"}, attempt{"pub", "fabric.retained.dev.g1.m1"},
			attempt{"pub", "$KV.fabric-stores.k"},
			attempt{"pub", api + "CONSUMER.CREATE.FABRIC_EVENTS.x.fabric.ev.>"},
			attempt{"pub", api + "CONSUMER.CREATE.FABRIC_IN.converge-p0.fabric.in.1.>"}, attempt{"pub", api + "CONSUMER.CREATE.FABRIC_IN.spy.fabric.in.>"},
			attempt{"sub", "fabric.live.>"}, attempt{"sub", "fabric.intake.>"}, attempt{"sub", "_INBOX_api.>"}),
		"fanout": append(deleteAndPurge(all...),
			attempt{"pub", "fabric.ev.dev.c1"}, attempt{"pub", "fabric.outcome.dev.m1"}, attempt{"pub", "fabric.in.dev.g1.m1"},
			attempt{"pub", "$KV.fabric-groups.dev.g1"}, attempt{"pub", "$KV.fabric-clients.dev.c1"},
			// fanout reads one client record by its key (unknown_client), from
			// a replica or, when that has none yet, from the leader
			// (STREAM.MSG.GET, which it may send); never the bucket through a
			// direct get without a key or through a consumer.
			attempt{"pub", api + "DIRECT.GET.KV_fabric-clients"},
			attempt{"pub", api + "CONSUMER.CREATE.KV_fabric-clients"}, attempt{"pub", api + "DIRECT.GET.FABRIC_IN"},
			attempt{"sub", "fabric.intake.>"}, attempt{"sub", "fabric.ev.>"}, attempt{"sub", "_INBOX_converge.>"}),
		"api": append(deleteAndPurge(all...),
			attempt{"pub", "fabric.ck.dev.g1"}, attempt{"pub", "$KV.fabric-converge.k"}, attempt{"pub", "$KV.fabric-groups.dev.g1"},
			attempt{"pub", api + "CONSUMER.CREATE.FABRIC_IN.x.fabric.in.>"}, attempt{"pub", api + "CONSUMER.CREATE.FABRIC_EVENTS.x.fabric.ev.>"},
			attempt{"pub", api + "CONSUMER.CREATE.FABRIC_EVENTS.ingest-outbound.fabric.ev.*.*"},
			attempt{"sub", "fabric.live.>"}, attempt{"sub", "fabric.intake.>"}, attempt{"sub", "_INBOX_ingest.>"}),
		"admin": append(deleteAndPurge(all...),
			attempt{"pub", "fabric.ev.dev.c1"}, attempt{"pub", "fabric.in.dev.g1.m1"},
			attempt{"pub", api + "DIRECT.GET.FABRIC_EVENTS"}, attempt{"pub", api + "STREAM.UPDATE.FABRIC_EVENTS"},
			// issue 27: a mirror republishing onto its inbox; only the
			// fabric's own stream names may be made
			attempt{"pub", api + "STREAM.CREATE.SPY"}, attempt{"pub", api + "CONSUMER.CREATE.FABRIC_EVENTS.x.fabric.out.>"},
			attempt{"sub", "fabric.>"}),
	}
	for _, user := range slices.Sorted(maps.Keys(refused)) {
		t.Run(user, func(t *testing.T) {
			errs := make(chan error, 64)
			nc := d.connect(t, user, errs)
			for _, a := range refused[user] {
				switch a.op {
				case "pub":
					if err := nc.PublishRequest(a.subject, nc.NewInbox(), []byte("{}")); err != nil {
						t.Fatal(err)
					}
				case "sub":
					if _, err := nc.SubscribeSync(a.subject); err != nil {
						t.Fatal(err)
					}
				}
				if err := nc.Flush(); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-errs:
					// The server checks a domain's API subject as the one it
					// maps to, and names that one.
					mapped := strings.Replace(a.subject, api, "$JS.API.", 1)
					if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), `"`+mapped+`"`) {
						t.Errorf("%s %s %s: %v", user, a.op, a.subject, err)
					}
				case <-time.After(5 * time.Second):
					t.Errorf("%s may %s %s", user, a.op, a.subject)
				}
			}
		})
	}
	t.Run("route without the route identity", func(t *testing.T) { d.checkRogueRoute(t) })
	t.Run("plaintext", func(t *testing.T) {
		n := d.cluster.nodes[0]
		_, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", n.client), nats.UserInfo("ingest", d.cluster.passwords["ingest"]), nats.NoReconnect())
		if err == nil {
			t.Error("a connection without TLS was accepted")
		}
	})
	t.Run("wrong password", func(t *testing.T) {
		n := d.cluster.nodes[0]
		_, err := nats.Connect(fmt.Sprintf("tls://127.0.0.1:%d", n.client), nats.UserInfo("ingest", "guess"),
			nats.RootCAs(filepath.Join(d.cluster.dir, "tls", "ca.crt")), nats.NoReconnect())
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Errorf("a wrong password: %v", err)
		}
	})
}

// checkRogueRoute starts a fourth node made from nats-1.conf whose
// certificate comes from the cluster's CA but does not name the route
// identity, routed to node 2, and checks that node 2 refuses the route.
func (d *deployment) checkRogueRoute(t *testing.T) {
	n := d.cluster.nodes[1]
	file := "deploy/nats/nats-1.conf"
	conf := string(readDeployFile(t, file))
	tlsDir := filepath.Join(d.cluster.dir, "tls")
	conf = rewrite(t, file, conf, "server_name: nats-1", "server_name: rogue", 1)
	conf = rewrite(t, file, conf, "listen: 0.0.0.0:4222", "listen: 127.0.0.1:-1", 1)
	conf = rewrite(t, file, conf, "http: 127.0.0.1:8222", "http: 127.0.0.1:0", 1)
	conf = rewrite(t, file, conf, "listen: 0.0.0.0:6222", "listen: 127.0.0.1:-1", 1)
	conf = rewrite(t, file, conf, "nats-route://nats-1:6222", "", 1)
	conf = rewrite(t, file, conf, "nats-route://nats-2:6222", fmt.Sprintf("nats-route://127.0.0.1:%d", n.route), 1)
	conf = rewrite(t, file, conf, "nats-route://nats-3:6222", "", 1)
	conf = rewrite(t, file, conf, "store_dir: /data/jetstream", "store_dir: "+filepath.Join(t.TempDir(), "jetstream"), 1)
	conf = rewrite(t, file, conf, "/etc/nats/tls/server.crt", filepath.Join(tlsDir, "other.crt"), 2)
	conf = rewrite(t, file, conf, "/etc/nats/tls/", tlsDir+"/", 4)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "accounts.conf"), readDeployFile(t, "deploy/nats/accounts.conf"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rogue, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	rogue.SetLoggerV2(&violationLog{}, false, false, false)
	rogue.Start()
	defer rogue.Shutdown()
	eventually.Within(t, 30*time.Second, "node 2 refuses the route", func() bool {
		return d.cluster.logs.contains("rid:", "authentication error")
	})
	rz, err := n.srv.Routez(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rz.Routes {
		if r.RemoteName == "rogue" {
			t.Errorf("node 2 routes to the node without the route identity: %+v", r)
		}
	}
}

// routedTransport sends the client API to the api role and everything else
// to ingest, as an ingress would, and retries what a node or worker loss
// turns into a 503 or a broken connection: a transport message is
// deduplicated by its id, so a retry is safe.
type routedTransport struct {
	ingest, api string
	ids         *[]string // message ids the intake answered, in order
	mu          *sync.Mutex
}

func (rt routedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		var err error
		if body, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		req.Body.Close()
	}
	host := rt.ingest
	if strings.Contains(req.URL.Path, "/clients") {
		host = rt.api
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := req.Clone(req.Context())
		r.URL.Host = host
		r.Host = host
		r.Body = io.NopCloser(bytes.NewReader(body))
		resp, err := http.DefaultTransport.RoundTrip(r)
		if err == nil && resp.StatusCode < 500 && strings.HasSuffix(req.URL.Path, "/transport") {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(b))
			var res struct {
				Results []struct {
					MessageID string `json:"message_id"`
				} `json:"results"`
			}
			json.Unmarshal(b, &res)
			rt.mu.Lock()
			for _, r := range res.Results {
				*rt.ids = append(*rt.ids, r.MessageID)
			}
			rt.mu.Unlock()
		}
		if err == nil && resp.StatusCode < 500 || time.Now().After(deadline) || req.Context().Err() != nil {
			return resp, err
		}
		if resp != nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sseEvent is one event read from the gateway's Server-Sent Events.
type sseEvent struct {
	seq  uint64
	kind string
}

// sseEvents follows a client's events over SSE until ctx ends.
type sseEvents struct {
	mu     sync.Mutex
	events []sseEvent
	err    error
	done   chan struct{}
}

func followSSE(ctx context.Context, t *testing.T, url, token string) *sseEvents {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s %s", url, resp.Status, b)
	}
	s := &sseEvents{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev.kind = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "id: "):
				ev.seq, _ = strconv.ParseUint(strings.TrimPrefix(line, "id: "), 10, 64)
			case line == "":
				if ev.kind != "" {
					s.mu.Lock()
					s.events = append(s.events, ev)
					s.mu.Unlock()
				}
				ev = sseEvent{}
			}
		}
		s.mu.Lock()
		s.err = sc.Err()
		s.mu.Unlock()
	}()
	t.Cleanup(func() { <-s.done })
	return s
}

func (s *sseEvents) snapshot() []sseEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

func allKinds() string {
	var k []string
	for _, kind := range schema.AllKinds() {
		k = append(k, string(kind))
	}
	return strings.Join(k, ",")
}

// storedEvents reads the sequences and kinds of every event stored for a
// client, with the fanout user's batched direct get (what fanout's gap
// repair reads with).
func (d *deployment) storedEvents(t *testing.T, nc *nats.Conn, subject string) map[uint64]string {
	t.Helper()
	out := map[uint64]string{}
	var next uint64 = 1
	for {
		inbox := nc.NewInbox()
		sub, err := nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := json.Marshal(map[string]any{"seq": next, "next_by_subj": subject, "batch": 500})
		if err := nc.PublishRequest(d.api()+"DIRECT.GET.FABRIC_EVENTS", inbox, req); err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			m, err := sub.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("direct get %s: %v", subject, err)
			}
			if st := m.Header.Get("Status"); st != "" {
				sub.Unsubscribe()
				if n < 500 {
					return out
				}
				break
			}
			ev, err := bus.Decode(m)
			if err != nil {
				t.Fatalf("stored event: %v", err)
			}
			out[ev.Sequence] = string(ev.Event.Kind)
			next = ev.Sequence + 1
			n++
		}
	}
}

// playDemo plays the demo conversation (internal/demo) into ingest and the
// api, follows the hosted client's events at the gateway, and kills a NATS
// node and a converge worker while the conversation flows.
func (d *deployment) playDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	token := func(scope auth.Scope) string {
		tok, err := auth.Mint([]byte(d.jwt), auth.Claims{Tenant: "dev", Scopes: []auth.Scope{scope}, Clients: []string{auth.AllClients}, ExpiresAt: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	var (
		posted   []string
		postedMu sync.Mutex
	)
	api := &demo.API{
		BaseURL: "http://" + d.addrs["ingest"], Tenant: "dev",
		AdminToken: token(auth.ScopeAdmin), IngestToken: token(auth.ScopeIngest),
		HTTP: &http.Client{Transport: routedTransport{ingest: d.addrs["ingest"], api: d.addrs["api"], ids: &posted, mu: &postedMu}},
	}
	var out strings.Builder
	var outMu sync.Mutex
	killed := map[string]bool{}
	script := &demo.Script{API: api, Pause: 200 * time.Millisecond, Out: writerFunc(func(b []byte) (int, error) {
		outMu.Lock()
		defer outMu.Unlock()
		line := string(b)
		out.WriteString(line)
		// Mid-conversation: a NATS node goes, then a converge worker.
		switch {
		case strings.HasPrefix(line, "bob says hello") && !killed["nats"]:
			killed["nats"] = true
			d.cluster.nodes[0].srv.Shutdown()
		case strings.HasPrefix(line, "bob reacts") && !killed["converge"]:
			killed["converge"] = true
			kill(t, d.procs["converge-a"])
		}
		return len(b), nil
	})}
	hosted, err := script.Register(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sse := followSSE(ctx, t, "http://"+d.addrs["fanout"]+"/v1/tenants/dev/clients/"+hosted.ClientID+"/events?kinds="+allKinds(), token(auth.ScopeEvents))
	reader := d.connect(t, "fanout", nil)
	subject := "fabric.ev.dev." + hosted.ClientID
	// Registration's event (identity.registered) is stored before the
	// gateway subscription starts; the rest must all reach it.
	before := d.storedEvents(t, reader, subject)
	if err := script.Play(ctx, hosted); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	t.Logf("demo:\n%s", out.String())
	if !killed["nats"] || !killed["converge"] {
		t.Fatalf("the demo did not reach the kills: %v", killed)
	}

	// The demo's conversation as the hosted client sees it: the Welcome,
	// five messages (hello, the reply, the reaction, the one deleted, the
	// deletion itself), the rename, bob's leave, the deletion.
	want := map[string]int{"conversation.joined": 1, "message.received": 5, "conversation.metadata_changed": 1,
		"conversation.membership_changed": 1, "message.deleted": 1}
	var stored map[uint64]string
	defer func() {
		if t.Failed() {
			t.Logf("stored for the client: %v\nat the gateway: %v", stored, sse.snapshot())
			// Each input's outcome, to tell a lost input from a late event.
			postedMu.Lock()
			defer postedMu.Unlock()
			for _, id := range posted {
				req, _ := http.NewRequest(http.MethodGet, "http://"+d.addrs["ingest"]+"/v1/tenants/dev/outcomes/"+id, nil)
				req.Header.Set("Authorization", "Bearer "+api.IngestToken)
				if resp, err := http.DefaultClient.Do(req); err == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					t.Logf("outcome %s: %s", id, bytes.TrimSpace(b))
				}
			}
		}
	}()
	eventually.Within(t, 2*time.Minute, "every event stored for the hosted client arrives at the gateway", func() bool {
		stored = d.storedEvents(t, reader, subject)
		for seq := range before {
			delete(stored, seq)
		}
		kinds := map[string]int{}
		for _, k := range stored {
			kinds[k]++
		}
		if !maps.Equal(kinds, want) {
			return false
		}
		got := map[uint64]bool{}
		for _, ev := range sse.snapshot() {
			got[ev.seq] = true
		}
		for seq := range stored {
			if !got[seq] {
				return false
			}
		}
		return true
	})
	seen := map[uint64]int{}
	var kinds []string
	for _, ev := range sse.snapshot() {
		seen[ev.seq]++
		kinds = append(kinds, ev.kind)
		if _, ok := stored[ev.seq]; !ok {
			t.Errorf("the gateway sent event %d (%s), which is not stored for the client", ev.seq, ev.kind)
		}
	}
	for seq, n := range seen {
		if n != 1 {
			t.Errorf("event %d (%s) arrived %d times", seq, stored[seq], n)
		}
	}
	t.Logf("the hosted client's %d events, each once: %s", len(seen), strings.Join(kinds, ", "))
}
