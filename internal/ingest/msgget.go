package ingest

import (
	"context"
	"encoding/json"
	"fmt"
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
		Data    []byte    `json:"data"`
		Time    time.Time `json:"time"`
	} `json:"message"`
}

// storedMsg is a message read from a stream.
type storedMsg struct {
	Subject  string
	Sequence uint64
	Data     []byte
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
	return &storedMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Seq, Data: resp.Message.Data}, nil
}
