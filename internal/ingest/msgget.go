package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// msgGetRequest is a STREAM.MSG.GET request: the last message of a
// subject, or the first at or after a sequence on a subject.
type msgGetRequest struct {
	Seq         uint64 `json:"seq,omitempty"`
	LastFor     string `json:"last_by_subj,omitempty"`
	NextForSubj string `json:"next_by_subj,omitempty"`
}

type msgGetResponse struct {
	Error   *jetstream.APIError `json:"error,omitempty"`
	Message *struct {
		Subject string    `json:"subject"`
		Seq     uint64    `json:"seq"`
		Header  []byte    `json:"hdrs"`
		Data    []byte    `json:"data"`
		Time    time.Time `json:"time"`
	} `json:"message"`
}

// storedMsg is a message read from a stream.
type storedMsg struct {
	Subject  string
	Sequence uint64
	Header   nats.Header // set by getMsg only
	Data     []byte
	Time     time.Time // set by getMsg only
}

// getMsg reads a message through the stream leader. Direct get, which the
// jetstream client uses for a stream that allows it, may be answered by a
// lagging replica; the compare-and-set writes on outcome subjects and the
// retries of retained objects need to read what was just written.
func getMsg(ctx context.Context, nc *nats.Conn, stream string, req msgGetRequest) (*storedMsg, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	reply, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, fmt.Errorf("get message: %w", err)
	}
	var resp msgGetResponse
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
	return &storedMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Seq, Header: hdr, Data: resp.Message.Data, Time: resp.Message.Time}, nil
}

// maxMultiLast is the most subjects one batched direct get asks for: the
// server answers at most 1024 messages per request.
const maxMultiLast = 1000

// lastMsgs reads the last message of each subject through a batched direct
// get (DIRECT.GET with multi_last): one request for up to maxMultiLast
// subjects, answered by any replica. Subjects without a message are absent
// from the result. A request that ends without its end-of-batch marker is an
// error, never an empty answer: callers decide on what is not there.
func lastMsgs(ctx context.Context, nc *nats.Conn, stream string, subjects []string) (map[string]*storedMsg, error) {
	out := make(map[string]*storedMsg, len(subjects))
	for len(subjects) > 0 {
		n := min(len(subjects), maxMultiLast)
		if err := lastMsgsChunk(ctx, nc, stream, subjects[:n], out); err != nil {
			return nil, err
		}
		subjects = subjects[n:]
	}
	return out, nil
}

func lastMsgsChunk(ctx context.Context, nc *nats.Conn, stream string, subjects []string, out map[string]*storedMsg) error {
	body, err := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
	}{subjects})
	if err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	// Room for every answer (one per subject and the end marker), so none
	// is dropped, and no more: a synchronous subscription's default buffer
	// would cost half a megabyte a request.
	ch := make(chan *nats.Msg, len(subjects)+1)
	inbox := nc.NewInbox()
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return fmt.Errorf("batch get: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+stream, inbox, body); err != nil {
		return fmt.Errorf("batch get: %w", err)
	}
	for {
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
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		subj := m.Header.Get(jetstream.SubjectHeader)
		if err != nil || subj == "" {
			return errors.New("batch get: a message without subject or sequence")
		}
		out[subj] = &storedMsg{Subject: subj, Sequence: seq, Data: m.Data}
	}
}
