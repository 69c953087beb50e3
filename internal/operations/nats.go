package operations

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// NATS request-reply (issue 19): an operation is requested on
// fabric.operate.<tenant>.<client_id>.<verb> (subject.OperateRequest) with
// the body and headers of its HTTP route (Authorization,
// Idempotency-Key, Content-Type, Accept), the path's group and inbox ids
// in headers; the verb is the operation's kind, or VerbOperation to read
// a record. The reply is the HTTP answer: its body, Content-Type, its
// status in Fabric-Status and, for a refusal, its code in Fabric-Error
// (and Retry-After). Who may request is decided by NATS permissions and,
// as on HTTP, by the bearer token.
const (
	// QueueGroup is the queue group the client API's instances answer
	// operation requests in.
	QueueGroup = "fabric-operations"
	// HeaderGroupID carries {group_id} of the route, lowercase hex.
	HeaderGroupID = "Fabric-Group-Id"
	// HeaderInboxID carries {inbox_id} of remove_member.
	HeaderInboxID = "Fabric-Inbox-Id"
	// VerbOperation reads an operation record: bus.HeaderOperationID
	// names it.
	VerbOperation = "operation"
)

// Bounds of the NATS responder: requests served at once, requests waiting
// (beyond it the server drops them and the requester times out; a retry
// with the same Idempotency-Key is the same operation), and how long one
// may take, also after Run's context ends.
const (
	natsSlots   = 64
	natsPending = 1024
	natsTimeout = 10 * time.Second
)

// natsVerbs are the operations requestable over NATS, by verb.
func (a *API) natsVerbs() map[string]builder {
	return map[string]builder{
		string(schema.OpCreateConversation): a.create,
		string(schema.OpSendMessage):        a.send,
		string(schema.OpAddMembers):         a.addMembers,
		string(schema.OpRemoveMember):       a.removeMember,
		string(schema.OpUpdateConversation): a.update,
		string(schema.OpLeave):              a.simple(schema.OpLeave),
		string(schema.OpSelfUpdate):         a.simple(schema.OpSelfUpdate),
	}
}

// Run answers operation requests on NATS until ctx ends, then lets those
// in flight finish (ops.Component).
func (a *API) Run(ctx context.Context) error {
	ch := make(chan *nats.Msg, natsPending)
	sub, err := a.cfg.JS.Conn().ChanQueueSubscribe(subject.OperateRequestPattern, QueueGroup, ch)
	if err != nil {
		return fmt.Errorf("operations: subscribe: %w", err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer func() { _ = sub.Unsubscribe() }()
	verbs := a.natsVerbs()
	slots := make(chan struct{}, natsSlots)
	for {
		var m *nats.Msg
		select {
		case <-ctx.Done():
			return nil
		case m = <-ch:
		}
		select {
		case <-ctx.Done():
			return nil
		case slots <- struct{}{}:
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), natsTimeout)
			defer cancel()
			a.answerNATS(rctx, verbs, m)
		}()
	}
}

// answerNATS serves one request as its HTTP route would and replies.
func (a *API) answerNATS(ctx context.Context, verbs map[string]builder, m *nats.Msg) {
	if m.Reply == "" {
		return // nobody to tell the operation id
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, "/", bytes.NewReader(m.Data))
	if err != nil {
		return
	}
	r.ContentLength = int64(len(m.Data))
	for k, vs := range m.Header {
		for _, v := range vs {
			r.Header.Add(k, v) // NATS header names keep their case; HTTP's are canonical
		}
	}
	status, body, err := a.serveNATS(r, verbs, m.Subject)
	w := &natsReply{h: http.Header{}}
	if err != nil {
		httpapi.WriteError(w, r, err)
		w.h.Set(bus.HeaderReplyError, refusal.Code(err))
	} else {
		httpapi.Write(w, r, status, body)
	}
	out := nats.NewMsg(m.Reply)
	out.Header = nats.Header(w.h)
	out.Header.Set(bus.HeaderReplyStatus, strconv.Itoa(w.status))
	out.Data = w.body.Bytes()
	_ = m.RespondMsg(out) // a requester gone retries with its Idempotency-Key
}

func (a *API) serveNATS(r *http.Request, verbs map[string]builder, subj string) (int, any, error) {
	tenant, client, verb, err := subject.ParseOperateRequest(subj)
	if err != nil {
		return 0, nil, refusal.BadRequest("operation subject: %v", err)
	}
	r.SetPathValue("tenant", tenant)
	r.SetPathValue("client_id", client)
	r.SetPathValue("group_id", r.Header.Get(HeaderGroupID))
	r.SetPathValue("inbox_id", r.Header.Get(HeaderInboxID))
	r.SetPathValue("operation_id", r.Header.Get(bus.HeaderOperationID))
	if verb == VerbOperation {
		rec, err := a.operation(r)
		return http.StatusOK, rec, err
	}
	build, ok := verbs[verb]
	if !ok {
		return 0, nil, refusal.BadRequest("no operation %q", verb)
	}
	if verb != string(schema.OpCreateConversation) && r.PathValue("group_id") == "" {
		return 0, nil, refusal.BadRequest("%s needs a %s header", verb, HeaderGroupID)
	}
	acc, err := a.serve(r, build)
	return http.StatusAccepted, acc, err
}

// natsReply is the HTTP answer a NATS reply carries.
type natsReply struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func (w *natsReply) Header() http.Header { return w.h }

func (w *natsReply) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *natsReply) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(b)
}
