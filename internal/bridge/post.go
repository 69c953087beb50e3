package bridge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"
)

// maxReply bounds the destination's answer read into memory: one result
// per message, a few hundred bytes each.
const maxReply = 4 << 20

// RefusedError is the destination refusing a post with a 4xx other than
// 429: the request, its token or its tenant is wrong, and posting it again
// would be refused again.
type RefusedError struct {
	Status  int    // the HTTP status
	Code    string // the error code of the answer ({"error": {"code"}}), or the status
	Message string // the answer's message
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("bridge: the destination refused the post: %d %s: %s", e.Status, e.Code, e.Message)
}

// Fatal reports whether the refusal concerns the bridge rather than a
// message: a token that does not authenticate (401) or is not allowed
// (403), or no transport endpoint at the URL (404). No message is posted
// until it is fixed.
func (e *RefusedError) Fatal() bool {
	return e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden || e.Status == http.StatusNotFound
}

// retryError is a post the destination did not take now: a network error,
// a 429 (after is its Retry-After) or a 5xx.
type retryError struct {
	reason string // the label of fabric_bridge_retries_total
	after  time.Duration
	err    error
}

func (e *retryError) Error() string { return "bridge: " + e.reason + ": " + e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

// encodeBatch is the msgpack intake batch {"messages": [...]} of chunk's
// bodies, each already a msgpack TransportMessage (fabric-native/1), sent
// as stored.
func encodeBatch(chunk []jetstream.Msg) ([]byte, error) {
	raw := make([]msgpack.RawMessage, len(chunk))
	for i, m := range chunk {
		raw[i] = m.Data()
	}
	b, err := msgpack.Marshal(map[string][]msgpack.RawMessage{"messages": raw})
	if err != nil {
		return nil, fmt.Errorf("bridge: encode a batch: %w", err)
	}
	return b, nil
}

// send posts one batch body of n messages and returns the destination's
// n results.
func (b *Bridge) send(ctx context.Context, body []byte, n int) ([]result, error) {
	token, err := b.cfg.Token(ctx)
	if err != nil {
		return nil, &retryError{reason: "token", err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("bridge: %w", err)
	}
	req.Header.Set("Content-Type", "application/msgpack")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	start := time.Now()
	resp, err := b.cfg.HTTPClient.Do(req)
	if err != nil {
		b.metrics.requests.WithLabelValues("error").Observe(time.Since(start).Seconds())
		return nil, &retryError{reason: "network", err: err}
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(io.LimitReader(resp.Body, maxReply))
	b.metrics.requests.WithLabelValues(strconv.Itoa(resp.StatusCode/100) + "xx").Observe(time.Since(start).Seconds())
	if err != nil {
		return nil, &retryError{reason: "network", err: err}
	}
	return readAnswer(resp.StatusCode, resp.Header.Get("Retry-After"), reply, n)
}

// readAnswer reads the destination's answer to a post of n messages: its
// n results, a *RefusedError (a 4xx other than 429) or a *retryError.
func readAnswer(status int, retryAfter string, reply []byte, n int) ([]result, error) {
	switch {
	case status == http.StatusOK:
		var r struct {
			Results []result `json:"results"`
		}
		if err := json.Unmarshal(reply, &r); err != nil || len(r.Results) != n {
			return nil, &retryError{reason: "bad_reply", err: fmt.Errorf("%d results for %d messages (%v)", len(r.Results), n, err)}
		}
		return r.Results, nil
	case status == http.StatusTooManyRequests:
		after, _ := strconv.Atoi(retryAfter)
		return nil, &retryError{reason: "rate_limited", after: time.Duration(min(max(after, 0), 3600)) * time.Second, err: answerError(status, reply)}
	case status >= 400 && status < 500:
		return nil, answerError(status, reply)
	default:
		return nil, &retryError{reason: "unavailable", err: answerError(status, reply)}
	}
}

// answerError reads the API's error body {"error": {"code", "message"}}.
func answerError(status int, reply []byte) *RefusedError {
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(reply, &e) != nil || e.Error.Code == "" {
		e.Error.Code, e.Error.Message = strconv.Itoa(status), http.StatusText(status)
	}
	return &RefusedError{Status: status, Code: e.Error.Code, Message: e.Error.Message}
}
