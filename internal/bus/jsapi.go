package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus/streams"
)

// The JetStream reads the jetstream client has no call for: a read from the
// stream leader on a stream that allows direct gets (the client would send
// it to any replica), pipelined batched direct gets, and direct gets of a KV
// key without the bucket's STREAM.INFO (a role may read a record it is not
// allowed to look the bucket up for). Every request starts with the API
// prefix of the caller's JetStream context, so a JetStream domain or an
// imported API prefix is honoured as the client's own requests do.

// defaultReadTimeout bounds a read whose context has no deadline.
const defaultReadTimeout = 5 * time.Second

// APIPrefix is the JetStream API prefix js sends its requests with, ending
// in a dot: $JS.API., $JS.<domain>.API. or the configured prefix.
func APIPrefix(js jetstream.JetStream) string {
	o := js.Options()
	switch {
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	}
	return jetstream.DefaultAPIPrefix
}

// MsgRequest selects one stored message: the last on LastBySubject, or the
// first at or after Seq (on NextBySubject when it is set).
type MsgRequest struct {
	Seq           uint64 `json:"seq,omitempty"`
	LastBySubject string `json:"last_by_subj,omitempty"`
	NextBySubject string `json:"next_by_subj,omitempty"`
}

// StoredMsg is a message read from a stream. Header and Time are set by
// GetMsg only.
type StoredMsg struct {
	Subject  string
	Sequence uint64
	Header   nats.Header
	Data     []byte
	Time     time.Time
}

// GetMsg reads a message of stream through the stream leader. A direct get
// may be answered by a lagging replica; compare-and-set writes and fences
// need to read what was just written. jetstream.ErrMsgNotFound when there
// is none.
func GetMsg(ctx context.Context, js jetstream.JetStream, stream string, req MsgRequest) (*StoredMsg, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	ctx, cancel := withReadTimeout(ctx)
	defer cancel()
	reply, err := js.Conn().RequestWithContext(ctx, APIPrefix(js)+"STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, fmt.Errorf("get message: %w", err)
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error,omitempty"`
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Header  []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return nil, fmt.Errorf("get message: %w", err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return nil, jetstream.ErrMsgNotFound
		}
		return nil, resp.Error
	}
	if resp.Message == nil {
		return nil, jetstream.ErrInvalidJetStreamResponse
	}
	var hdr nats.Header
	if len(resp.Message.Header) > 0 {
		if hdr, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return nil, fmt.Errorf("get message: %w", err)
		}
	}
	return &StoredMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Seq, Header: hdr, Data: resp.Message.Data, Time: resp.Message.Time}, nil
}

// KVGetLeader reads a KV bucket's key from the bucket stream's leader, as
// GetMsg reads a stream: a KV get (KVGet, the KV client's) is a direct get, which any
// replica (or a mirror with MirrorDirect) may answer from behind, while a
// compare-and-set needs the revision just written and a read that follows
// an event the change the event reports (EVENT-010). found is false for a
// key never written, deleted or purged.
func KVGetLeader(ctx context.Context, js jetstream.JetStream, bucket, key string) (value []byte, revision uint64, found bool, err error) {
	m, err := GetMsg(ctx, js, streams.KVStream(bucket), MsgRequest{LastBySubject: streams.KVSubject(bucket, key)})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, 0, false, nil
	}
	if err != nil {
		return nil, 0, false, err
	}
	if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return nil, m.Sequence, false, nil
	}
	return m.Data, m.Sequence, true, nil
}

// maxMultiLast is the most subjects one batched direct get asks for: the
// server answers at most 1024 messages per request.
const maxMultiLast = 1000

// LastMsgs reads the last message of each subject of stream through batched
// direct gets (multi_last): one request for up to maxMultiLast subjects,
// answered by any replica. Subjects without a message are absent from the
// result. A request that ends without its end-of-batch marker is an error,
// never an empty answer: callers decide on what is not there.
func LastMsgs(ctx context.Context, js jetstream.JetStream, stream string, subjects []string) (map[string]*StoredMsg, error) {
	out := map[string]*StoredMsg{} // sized by the answers: most subjects have none
	for len(subjects) > 0 {
		n := min(len(subjects), maxMultiLast)
		body, err := json.Marshal(struct {
			MultiLast []string `json:"multi_last"`
		}{subjects[:n]})
		if err != nil {
			return nil, err
		}
		err = directBatch(ctx, js, stream, body, n, func(m *nats.Msg) error {
			seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
			subj := m.Header.Get(jetstream.SubjectHeader)
			if err != nil || subj == "" {
				return errors.New("a message without subject or sequence")
			}
			out[subj] = &StoredMsg{Subject: subj, Sequence: seq, Data: m.Data}
			return nil
		})
		if err != nil {
			return nil, err
		}
		subjects = subjects[n:]
	}
	return out, nil
}

// NextMsgs reads up to n messages of stream stored on subj at or after seq
// with one batched direct get (ADR-31 next_by_subj, batch), answered by any
// replica. jetstream.ErrMsgNotFound when there is none.
func NextMsgs(ctx context.Context, js jetstream.JetStream, stream, subj string, seq uint64, n int) ([]*nats.Msg, error) {
	body, err := json.Marshal(struct {
		Seq        uint64 `json:"seq"`
		NextBySubj string `json:"next_by_subj"`
		Batch      int    `json:"batch"`
	}{seq, subj, n})
	if err != nil {
		return nil, err
	}
	var msgs []*nats.Msg
	err = directBatch(ctx, js, stream, body, n, func(m *nats.Msg) error {
		msgs = append(msgs, m)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(msgs) == 0 {
		return nil, jetstream.ErrMsgNotFound
	}
	return msgs, nil
}

// directBatch sends one batched direct get and hands each message of the
// answer to each, up to n of them, until the server's end of batch (204, or
// 404 when nothing matched).
func directBatch(ctx context.Context, js jetstream.JetStream, stream string, body []byte, n int, each func(*nats.Msg) error) error {
	ctx, cancel := withReadTimeout(ctx)
	defer cancel()
	nc := js.Conn()
	// Room for every answer (n and the end marker), so none is dropped, and
	// no more: a synchronous subscription's default buffer would cost half a
	// megabyte a request.
	ch := make(chan *nats.Msg, n+1)
	inbox := nc.NewInbox()
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return fmt.Errorf("batch get: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(APIPrefix(js)+"DIRECT.GET."+stream, inbox, body); err != nil {
		return fmt.Errorf("batch get: %w", err)
	}
	for got := 0; ; got++ {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-ctx.Done():
			return fmt.Errorf("batch get: %w", ctx.Err())
		}
		if status := m.Header.Get("Status"); status != "" && len(m.Data) == 0 {
			switch status {
			case "204", "404": // end of batch; no message at all
				return nil
			}
			return fmt.Errorf("batch get: status %s %s", status, m.Header.Get("Description"))
		}
		if got == n {
			return errors.New("batch get: more messages than asked for")
		}
		if err := each(m); err != nil {
			return fmt.Errorf("batch get: %w", err)
		}
	}
}

// DirectRequest selects one stored message for a direct get: the last on
// LastBySubject, or the first on NextBySubject at or after StartTime.
type DirectRequest struct {
	LastBySubject string
	NextBySubject string
	StartTime     time.Time
}

// DirectGet reads one message of stream by a direct get, answered by any
// replica. jetstream.ErrMsgNotFound when there is none; the answer carries
// the stream's headers (jetstream.SequenceHeader, ...).
func DirectGet(ctx context.Context, js jetstream.JetStream, stream string, req DirectRequest) (*nats.Msg, error) {
	ctx, cancel := withReadTimeout(ctx)
	defer cancel()
	subj := APIPrefix(js) + "DIRECT.GET." + stream
	var body []byte
	if req.LastBySubject != "" {
		// The subject in the request's subject, so permissions can grant the
		// read of one key and not the stream.
		subj += "." + req.LastBySubject
	} else {
		var err error
		if body, err = json.Marshal(struct {
			StartTime  time.Time `json:"start_time"`
			NextBySubj string    `json:"next_by_subj"`
		}{req.StartTime.UTC(), req.NextBySubject}); err != nil {
			return nil, err
		}
	}
	m, err := js.Conn().RequestWithContext(ctx, subj, body)
	if err != nil {
		return nil, fmt.Errorf("direct get: %w", err)
	}
	switch st := m.Header.Get("Status"); st {
	case "":
		return m, nil
	case "404":
		return nil, jetstream.ErrMsgNotFound
	default:
		return nil, fmt.Errorf("direct get: status %s", st)
	}
}

// KVGet reads key's value in bucket by a direct get, answered by any
// replica. ok is false when the key has no value or was deleted.
func KVGet(ctx context.Context, js jetstream.JetStream, bucket, key string) (value []byte, ok bool, err error) {
	m, err := DirectGet(ctx, js, streams.KVStream(bucket), DirectRequest{LastBySubject: streams.KVSubject(bucket, key)})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", bucket, err)
	}
	if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return nil, false, nil
	}
	return m.Data, true, nil
}

func withReadTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, defaultReadTimeout)
}

// JetStream API subjects as NATS permissions name them: the local domain's,
// as the server checks a request to $JS.<domain>.API. against the subject
// it maps to (deploy/nats/accounts.conf spells the same).
const (
	PermAPIInfo        = "$JS.API.INFO"
	PermStreamInfo     = "$JS.API.STREAM.INFO."
	PermStreamCreate   = "$JS.API.STREAM.CREATE."
	PermMsgGet         = "$JS.API.STREAM.MSG.GET."
	PermMsgDelete      = "$JS.API.STREAM.MSG.DELETE."
	PermStreamPurge    = "$JS.API.STREAM.PURGE."
	PermDirectGet      = "$JS.API.DIRECT.GET."
	PermConsumerCreate = "$JS.API.CONSUMER.CREATE."
	PermConsumerInfo   = "$JS.API.CONSUMER.INFO."
	PermConsumerDelete = "$JS.API.CONSUMER.DELETE."
	PermConsumerNext   = "$JS.API.CONSUMER.MSG.NEXT."
	// PermFlowControl starts the flow control subjects of a stream's push
	// consumers (a KV watch), $JS.FC.<stream>.>.
	PermFlowControl = "$JS.FC."
	// PermAck starts the acknowledgement subjects of a stream's consumers,
	// $JS.ACK.<stream>.>.
	PermAck = "$JS.ACK."
)
