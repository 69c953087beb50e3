package ingest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/pkg/schema"
)

func ackMsg(data string, status string) *nats.Msg {
	m := nats.NewMsg("_INBOX.x.1")
	m.Data = []byte(data)
	if status != "" {
		m.Header.Set("Status", status)
	}
	return m
}

// Acknowledgements are read as the server writes them: stored, a
// duplicate, an API error callers branch on, no stream at all, and shapes
// the fast path does not know, which are decoded in full.
func TestParseAck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		data     string
		status   string
		stream   string
		seq      uint64
		dup      bool
		wrongSeq bool
		fails    bool
	}{
		{name: "stored", data: `{"stream":"FABRIC_IN","seq":42}`, stream: "FABRIC_IN", seq: 42},
		{name: "duplicate", data: `{"stream":"FABRIC_IN","seq":7,"duplicate":true}`, stream: "FABRIC_IN", seq: 7, dup: true},
		{name: "with domain", data: `{"stream":"FABRIC_IN","domain":"hub","seq":9}`, stream: "FABRIC_IN", seq: 9},
		{name: "wrong last sequence", data: `{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"}}`, wrongSeq: true, fails: true},
		{name: "error after a stream name", data: `{"stream":"FABRIC_IN","seq":0,"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"}}`, wrongSeq: true, fails: true},
		{name: "no stream", data: "", status: "503", fails: true},
		{name: "not json", data: `{"stream":"FABRIC_IN","seq":`, fails: true},
		{name: "no stream named", data: `{}`, fails: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := parseAck(ackMsg(tc.data, tc.status))
			if tc.fails {
				if r.err == nil {
					t.Fatalf("ack %+v, want an error", r.ack)
				}
				if isWrongLast(r.err) != tc.wrongSeq {
					t.Errorf("isWrongLast(%v) = %v", r.err, !tc.wrongSeq)
				}
				if tc.status == "503" && !errors.Is(r.err, nats.ErrNoResponders) {
					t.Errorf("err = %v, want no responders", r.err)
				}
				return
			}
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.ack.Stream != tc.stream || r.ack.Sequence != tc.seq || r.ack.Duplicate != tc.dup {
				t.Errorf("ack = %+v", r.ack)
			}
		})
	}
}

// FuzzParseAck: whatever comes back on the acknowledgement subject, the
// result is a stored message with a stream, or an error; never both,
// never neither, never a panic.
func FuzzParseAck(f *testing.F) {
	f.Add([]byte(`{"stream":"FABRIC_IN","seq":42}`))
	f.Add([]byte(`{"stream":"FABRIC_IN","seq":7,"duplicate":true}`))
	f.Add([]byte(`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"}}`))
	f.Add([]byte(`{"stream":"a","seq":1}"error"}`))
	f.Add([]byte(`{"stream":"","seq":18446744073709551616}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := parseAck(&nats.Msg{Data: data})
		if (r.err == nil) == (r.ack == nil) {
			t.Fatalf("ack %+v and err %v", r.ack, r.err)
		}
		if r.ack != nil && r.ack.Stream == "" {
			t.Fatalf("stored in no stream: %q", data)
		}
	})
}

// A call that stops waiting leaves no slot behind, and the publisher keeps
// serving later calls.
func TestPublisherForgetsAbandonedCalls(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	p := newBatchPublisher(e.nc)
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	defer p.stop()
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	// Someone listens on this subject but never answers.
	silent, err := e.nc.Subscribe("nobody.answers", func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Unsubscribe()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := p.publish(ctx, js, []*nats.Msg{nats.NewMsg("nobody.answers")}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the deadline", err)
	}
	// Nobody at all: the server says so at once.
	res, err := p.publish(context.Background(), js, []*nats.Msg{nats.NewMsg("nobody.listens")})
	if err != nil || !errors.Is(res[0].err, nats.ErrNoResponders) {
		t.Fatalf("result %+v, err %v; want no responders", res, err)
	}
	p.mu.Lock()
	n := len(p.waiting)
	p.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d slots left after the call gave up", n)
	}
	in := &input{id: [32]byte{1}, groupHex: "0a", class: schema.ClassApplication, mls: []byte("input")}
	for attempt, stored := range []bool{true, false} {
		m, err := inputMsg(testTenant, in)
		if err != nil {
			t.Fatal(err)
		}
		res, err = p.publish(context.Background(), js, []*nats.Msg{nil, m})
		if err != nil {
			t.Fatal(err)
		}
		if res[0] != (pubResult{}) {
			t.Fatalf("a nil message got %+v", res[0])
		}
		if stored && (res[1].err != nil || res[1].ack.Stream != streamIn) {
			t.Fatalf("first write: %+v", res[1])
		}
		if !stored && !isWrongLast(res[1].err) {
			t.Fatalf("write %d of the same input: %+v, want it refused as present", attempt+1, res[1])
		}
	}
}
