package ingest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/httpapi"
)

// BenchmarkIngest's callers run in a process of their own (this test
// binary again, with benchCallerEnv naming the plan), so the CPU each
// side's caller spends (the HTTP client, the NATS requester, the anchors'
// JetStream publisher) is measured apart from the CPU of what serves it:
// the server, and ingest where it is in the path.
const benchCallerEnv = "FABRIC_INGEST_BENCH_CALLER"

// The arms a caller runs.
const (
	armHTTP  = "http"  // intake over HTTP, msgpack
	armNATS  = "nats"  // intake over NATS, msgpack
	armRaw   = "raw"   // the writes admission makes, through batchPublisher
	armPlain = "plain" // JetStream async publish
	armMsgID = "msgid" // JetStream async publish with Nats-Msg-Id
)

// callerPlan is everything a caller process sends: made by the benchmark
// before its timer starts, so encoding is nobody's cost.
type callerPlan struct {
	HTTPURL, NATSURL, Token string
	IntakeSubject           string
	AnchorSubject           string // the anchors' one subject of the group
	Batches                 []callerBatch
}

// callerBatch is one batch of benchBatch messages in the forms the arms
// send it.
type callerBatch struct {
	Body     []byte     // intake request body
	Raw      []rawWrite // the writes its admission makes
	Payloads [][]byte   // the anchors' messages
	IDs      []string   // their Nats-Msg-Id
}

type rawWrite struct {
	Subject string
	Header  nats.Header
	Data    []byte
}

// callerProc is a running caller process.
type callerProc struct {
	cmd *exec.Cmd
	in  *bufio.Writer
	out *bufio.Scanner
}

// startCaller writes plan to a file and starts a caller process on it.
func startCaller(b *testing.B, plan *callerPlan) *callerProc {
	b.Helper()
	path := filepath.Join(b.TempDir(), "plan.gob")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	if err := gob.NewEncoder(w).Encode(plan); err != nil {
		b.Fatal(err)
	}
	if err := errors.Join(w.Flush(), f.Close()); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), benchCallerEnv+"="+path)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p := &callerProc{cmd: cmd, in: bufio.NewWriter(stdin), out: bufio.NewScanner(stdout)}
	b.Cleanup(func() {
		_ = stdin.Close()
		if err := cmd.Wait(); err != nil {
			b.Errorf("caller process: %v", err)
		}
	})
	// The first answer says the caller is connected and has read the plan.
	if _, err := p.read(); err != nil {
		b.Fatal(err)
	}
	return p
}

// run has the caller send batches [lo, hi) through arm and returns the
// CPU time the caller process spent on it.
func (p *callerProc) run(arm string, lo, hi int) (time.Duration, error) {
	if _, err := fmt.Fprintf(p.in, "%s %d %d\n", arm, lo, hi); err != nil {
		return 0, err
	}
	if err := p.in.Flush(); err != nil {
		return 0, err
	}
	return p.read()
}

func (p *callerProc) read() (time.Duration, error) {
	if !p.out.Scan() {
		return 0, fmt.Errorf("caller process ended: %v", p.out.Err())
	}
	line := p.out.Text()
	if msg, ok := strings.CutPrefix(line, "error "); ok {
		return 0, errors.New(msg)
	}
	ns, err := strconv.ParseInt(line, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("caller process answered %q", line)
	}
	return time.Duration(ns), nil
}

// runBenchCaller is the caller process: it reads the plan at path, then
// runs one "<arm> <lo> <hi>" line of stdin at a time, answering each with
// the CPU nanoseconds it spent or "error <why>".
func runBenchCaller(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	var plan callerPlan
	err = gob.NewDecoder(bufio.NewReader(f)).Decode(&plan)
	_ = f.Close()
	if err != nil {
		return fmt.Errorf("read plan: %w", err)
	}
	c, err := newCaller(&plan)
	if err != nil {
		return err
	}
	defer c.close()
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, 0)
	if err := out.Flush(); err != nil {
		return err
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var arm string
		var lo, hi int
		if _, err := fmt.Sscanf(in.Text(), "%s %d %d", &arm, &lo, &hi); err != nil {
			return fmt.Errorf("command %q: %w", in.Text(), err)
		}
		c0 := cpuNow()
		if err := c.run(arm, plan.Batches[lo:hi]); err != nil {
			fmt.Fprintf(out, "error %s: %v\n", arm, err)
		} else {
			fmt.Fprintln(out, int64(cpuNow()-c0))
		}
		if err := out.Flush(); err != nil {
			return err
		}
	}
	return in.Err()
}

// caller holds the caller process's connections.
type caller struct {
	plan   *callerPlan
	client *http.Client
	nc     *nats.Conn
	js     jetstream.JetStream
	pub    *batchPublisher
}

func newCaller(plan *callerPlan) (*caller, error) {
	nc, err := nats.Connect(plan.NATSURL)
	if err != nil {
		return nil, err
	}
	c := &caller{
		plan:   plan,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchCallers}},
		nc:     nc,
		pub:    newBatchPublisher(nc),
	}
	if c.js, err = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096)); err != nil {
		nc.Close()
		return nil, err
	}
	if err := c.pub.start(); err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

func (c *caller) close() {
	c.pub.stop()
	c.client.CloseIdleConnections()
	c.nc.Close()
}

// run sends batches through arm from benchCallers goroutines, each with
// one batch in flight at a time and every acknowledgement awaited: the
// same number of messages in flight on every arm.
func (c *caller) run(arm string, batches []callerBatch) error {
	var send func(callerBatch) error
	switch arm {
	case armHTTP:
		send = c.postHTTP
	case armNATS:
		send = c.requestNATS
	case armRaw:
		send = c.publishRaw
	case armPlain:
		send = func(bt callerBatch) error { return c.publishAnchor(bt, false) }
	case armMsgID:
		send = func(bt callerBatch) error { return c.publishAnchor(bt, true) }
	default:
		return fmt.Errorf("unknown arm %q", arm)
	}
	next := make(chan callerBatch, len(batches))
	for _, bt := range batches {
		next <- bt
	}
	close(next)
	var wg sync.WaitGroup
	errs := make([]error, benchCallers)
	for i := range benchCallers {
		wg.Go(func() {
			for bt := range next {
				if errs[i] = send(bt); errs[i] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (c *caller) postHTTP(bt callerBatch) error {
	req, err := http.NewRequest(http.MethodPost, c.plan.HTTPURL, bytes.NewReader(bt.Body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.plan.Token)
	req.Header.Set("Content-Type", httpapi.ContentTypeMsgpack)
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var res Response
	if err := decodeResponse(resp, &res); err != nil {
		return err
	}
	return checkQueued(res, len(bt.Payloads))
}

func (c *caller) requestNATS(bt callerBatch) error {
	m := nats.NewMsg(c.plan.IntakeSubject)
	m.Header.Set(HeaderContentType, httpapi.ContentTypeMsgpack)
	m.Data = bt.Body
	reply, err := c.nc.RequestMsg(m, 30*time.Second)
	if err != nil {
		return err
	}
	var res Response
	if err := decodeMsgpack(reply.Data, &res); err != nil {
		return err
	}
	return checkQueued(res, len(bt.Payloads))
}

func (c *caller) publishRaw(bt callerBatch) error {
	msgs := make([]*nats.Msg, len(bt.Raw))
	for i, w := range bt.Raw {
		msgs[i] = &nats.Msg{Subject: w.Subject, Header: w.Header, Data: w.Data}
	}
	res, err := c.pub.publish(context.Background(), c.js, msgs)
	if err != nil {
		return err
	}
	for _, r := range res {
		if r.err != nil {
			return r.err
		}
	}
	return nil
}

// publishAnchor publishes a batch's messages asynchronously to the
// anchors' subject, with Nats-Msg-Id when withID, and awaits each
// acknowledgement.
func (c *caller) publishAnchor(bt callerBatch, withID bool) error {
	futures := make([]jetstream.PubAckFuture, len(bt.Payloads))
	for i, p := range bt.Payloads {
		opts := []jetstream.PublishOpt{jetstream.WithStallWait(stallWait)}
		if withID {
			opts = append(opts, jetstream.WithMsgID(bt.IDs[i]))
		}
		f, err := c.js.PublishAsync(c.plan.AnchorSubject, p, opts...)
		if err != nil {
			return err
		}
		futures[i] = f
	}
	timeout := time.After(time.Minute)
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-timeout:
			return errors.New("publishes not acknowledged")
		}
	}
	return nil
}
