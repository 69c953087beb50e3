package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
)

// A bridge does not make its consumer: it asks the source fabric for it,
// on fabric.bridge.<tenant>.<consumer> (subject.BridgeRequest), and the
// Provisioner, run by ingest, makes it, a pull consumer of the tenant's
// outbound subjects and nothing else (issue 27). A user that may make
// consumers may make push consumers too, delivering what it reads onto any
// subject (a client's fabric.live.*, another tenant's intake): NATS
// permissions cannot tell them apart, so no bridge user may make one. Who
// may ask for which tenant and name is decided by NATS permissions on the
// request subject.

// ProvisionerQueue is the queue group the provisioners answer in.
const ProvisionerQueue = "bridge-provisioner"

// Bounds of what a bridge may ask for its consumer.
const (
	MaxAckWait       = time.Hour
	MaxAckPending    = 1 << 16
	maxProvisionBody = 4 << 10
	provisionTimeout = 10 * time.Second
)

// ProvisionRequest is the body of a request for a bridge's consumer: its
// acknowledgement wait and how many messages it may hold unacknowledged.
type ProvisionRequest struct {
	AckWaitMS     int64 `json:"ack_wait_ms"`
	MaxAckPending int   `json:"max_ack_pending"`
}

// provisionReply is the body of the answer: the consumer, or a refusal.
type provisionReply struct {
	Consumer string `json:"consumer,omitempty"`
	Error    *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// Provisioner answers bridges' requests for their consumers (ops.Component).
type Provisioner struct {
	js      jetstream.JetStream
	log     *slog.Logger
	started chan struct{}
}

// NewProvisioner makes bridges' consumers through js, whose user may make
// consumers on FABRIC_EVENTS filtered to one tenant's outbound subjects
// (the filter in the create subject) and subscribe to
// subject.BridgeRequestPattern.
func NewProvisioner(js jetstream.JetStream, log *slog.Logger) *Provisioner {
	if log == nil {
		log = slog.Default()
	}
	return &Provisioner{js: js, log: log, started: make(chan struct{})}
}

// Started is closed once the server routes requests to the provisioner.
func (p *Provisioner) Started() <-chan struct{} { return p.started }

// Run answers requests until ctx ends. Requests are few (one per bridge
// start) and answered one at a time.
func (p *Provisioner) Run(ctx context.Context) error {
	ch := make(chan *nats.Msg, 64)
	nc := p.js.Conn()
	sub, err := nc.ChanQueueSubscribe(subject.BridgeRequestPattern, ProvisionerQueue, ch)
	if err != nil {
		return fmt.Errorf("bridge provisioner: subscribe: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	fctx, cancel := context.WithTimeout(ctx, provisionTimeout)
	err = nc.FlushWithContext(fctx)
	cancel()
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("bridge provisioner: subscribe: %w", err)
	}
	close(p.started)
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-ch:
			rctx, cancel := context.WithTimeout(ctx, provisionTimeout)
			p.answer(rctx, m)
			cancel()
		}
	}
}

// answer makes or checks the consumer m asks for and replies.
func (p *Provisioner) answer(ctx context.Context, m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	status, code, msg := 200, "", ""
	name, err := p.provision(ctx, m)
	var pe *provisionError
	switch {
	case errors.As(err, &pe):
		status, code, msg = pe.status, pe.code, pe.msg
	case err != nil:
		p.log.Warn("bridge provisioner", "subject", m.Subject, "err", err)
		status, code, msg = 503, "unavailable", "the consumer could not be made now"
	}
	var body provisionReply
	if err == nil {
		body.Consumer = name
	} else {
		body.Error = &struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}{code, msg}
	}
	out := nats.NewMsg(m.Reply)
	out.Header.Set(bus.HeaderReplyStatus, strconv.Itoa(status))
	if code != "" {
		out.Header.Set(bus.HeaderReplyError, code)
	}
	out.Data, _ = json.Marshal(body)
	_ = m.RespondMsg(out) // a bridge that went asks again
}

// provisionError is a request refused for what it asks.
type provisionError struct {
	status    int
	code, msg string
}

func (e *provisionError) Error() string { return e.msg }

func refuse(status int, code, format string, args ...any) error {
	return &provisionError{status: status, code: code, msg: fmt.Sprintf(format, args...)}
}

// provision makes the consumer m asks for, or finds it made: a pull
// consumer of its tenant's outbound subjects. It never changes a consumer
// of other subjects or a push consumer, nor makes ingest's.
func (p *Provisioner) provision(ctx context.Context, m *nats.Msg) (string, error) {
	tenant, name, err := subject.ParseBridgeRequest(m.Subject)
	if err != nil {
		return "", refuse(400, "bad_request", "%v", err)
	}
	if name == streams.ConsumerOutbound {
		return "", refuse(403, "forbidden", "consumer %s is ingest's", name)
	}
	var req ProvisionRequest
	if len(m.Data) > maxProvisionBody || json.Unmarshal(m.Data, &req) != nil {
		return "", refuse(400, "bad_request", "body: want {\"ack_wait_ms\", \"max_ack_pending\"} within %d bytes", maxProvisionBody)
	}
	ackWait := DefaultAckWait
	if req.AckWaitMS != 0 {
		if req.AckWaitMS < time.Second.Milliseconds() || req.AckWaitMS > MaxAckWait.Milliseconds() {
			return "", refuse(400, "bad_request", "ack_wait_ms: between 1000 and %d", MaxAckWait.Milliseconds())
		}
		ackWait = time.Duration(req.AckWaitMS) * time.Millisecond
	}
	pending := req.MaxAckPending
	if pending == 0 {
		pending = 4 * DefaultMaxBatch
	}
	if pending < 1 || pending > MaxAckPending {
		return "", refuse(400, "bad_request", "max_ack_pending: between 1 and %d", MaxAckPending)
	}
	filter, err := subject.OutboundTenant(tenant)
	if err != nil {
		return "", refuse(400, "bad_request", "%v", err)
	}
	c, err := p.js.Consumer(ctx, streams.StreamEvents, name)
	switch {
	case err == nil:
		if cfg := c.CachedInfo().Config; cfg.FilterSubject != filter || len(cfg.FilterSubjects) > 0 || cfg.DeliverSubject != "" {
			return "", refuse(409, "conflict", "consumer %s exists for other subjects", name)
		}
	case errors.Is(err, jetstream.ErrNotPullConsumer):
		return "", refuse(409, "conflict", "consumer %s exists as a push consumer", name)
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return "", fmt.Errorf("look up consumer %s: %w", name, err)
	}
	if _, err := p.js.CreateOrUpdateConsumer(ctx, streams.StreamEvents, jetstream.ConsumerConfig{
		Durable:       name,
		FilterSubject: filter,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxAckPending: pending,
	}); err != nil {
		return "", fmt.Errorf("make consumer %s: %w", name, err)
	}
	return name, nil
}

// askConsumer asks the source for the bridge's consumer and binds it.
func (b *Bridge) askConsumer(ctx context.Context) (jetstream.Consumer, error) {
	body, err := json.Marshal(ProvisionRequest{AckWaitMS: b.cfg.AckWait.Milliseconds(), MaxAckPending: 4 * b.cfg.MaxBatch})
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, provisionTimeout)
	defer cancel()
	reply, err := b.cfg.JS.Conn().RequestWithContext(rctx, b.request, body)
	if err != nil {
		return nil, fmt.Errorf("ask for the consumer on %s: %w", b.request, err)
	}
	if st := reply.Header.Get(bus.HeaderReplyStatus); st != "200" {
		var r provisionReply
		_ = json.Unmarshal(reply.Data, &r)
		if r.Error != nil {
			return nil, fmt.Errorf("the source refused the consumer: %s %s: %s", st, r.Error.Code, r.Error.Message)
		}
		return nil, fmt.Errorf("the source answered %q", st)
	}
	return b.cfg.JS.Consumer(rctx, streams.StreamEvents, b.cfg.Durable)
}
