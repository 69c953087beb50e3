// Package wire is the WebSocket frame protocol between the gateway and the
// SDK (DESIGN §10): objects with an op, in JSON text frames under the
// subprotocol fabric.v1.json or msgpack binary frames under fabric.v1.msgpack.
//
// App to gateway: subscribe {id, client_id, filter}, credit {sub, n},
// unsubscribe {sub}. Gateway to app: subscribed {id, sub, seq}, event {sub,
// seq, event}, ended {sub, reason}, error {id?, code, message}.
//
// A connection opened without an Authorization header (a browser's)
// authenticates with its first frame, connect {token}, answered connected;
// a refusal closes the connection with one of the Close codes.
//
// Beyond DESIGN §10, subscribe may carry after_seq and held to resume a
// subscription after a reconnect, and event and subscribed carry the stream
// sequence (seq) the SDK resumes from. The event frame of a lagged carries
// at_most: true when its discarded is an upper bound (EVENT-031).
//
// Output frames are appended by hand so the encoded event, shared by every
// subscription it is handed to, is copied in without re-encoding.
package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// Subprotocols of GET /v1/events.
const (
	SubprotocolJSON    = "fabric.v1.json"
	SubprotocolMsgpack = "fabric.v1.msgpack"
)

// Ops of a frame.
const (
	OpConnect     = "connect"
	OpConnected   = "connected"
	OpSubscribe   = "subscribe"
	OpCredit      = "credit"
	OpUnsubscribe = "unsubscribe"
	OpSubscribed  = "subscribed"
	OpEvent       = "event"
	OpEnded       = "ended"
	OpError       = "error"
)

// Reasons an ended frame carries.
const (
	// ReasonUnsubscribed answers the app's unsubscribe.
	ReasonUnsubscribed = "unsubscribed"
	// ReasonShutdown ends subscriptions when the gateway drains.
	ReasonShutdown = "shutdown"
	// ReasonTokenExpired ends the subscriptions of a connection whose
	// bearer token expired; the connection then closes.
	ReasonTokenExpired = "token_expired"
)

// Error codes an error frame carries.
const (
	CodeMalformedFrame       = "malformed_frame"
	CodeFrameTooLarge        = "frame_too_large"
	CodeUnknownOp            = "unknown_op"
	CodeInvalidFilter        = "invalid_filter"
	CodeForbidden            = "forbidden"
	CodeTooManySubscriptions = "too_many_subscriptions"
	CodeUnknownSubscription  = "unknown_subscription"
	CodeBadCredit            = "bad_credit"
	CodeUnavailable          = "unavailable"
	CodeUnauthenticated      = "unauthenticated"
	CodeUnknownClient        = "unknown_client"
)

// Codes are every code an error frame can carry.
var Codes = []string{CodeMalformedFrame, CodeFrameTooLarge, CodeUnknownOp, CodeInvalidFilter, CodeForbidden,
	CodeTooManySubscriptions, CodeUnknownSubscription, CodeBadCredit, CodeUnavailable, CodeUnauthenticated, CodeUnknownClient}

// Close codes (RFC 6455 §7.4.2, private use) of a connection refused at
// its connect frame; the close reason says why.
const (
	CloseBadConnect         = 4400 // the first frame is not a connect frame with a token
	CloseUnauthenticated    = 4401 // the token is missing, invalid or expired
	CloseForbidden          = 4403 // the token lacks the events scope
	CloseConnectTimeout     = 4408 // no connect frame within the gateway's connect timeout
	CloseTooManyConnections = 4429 // the tenant has its most open connections
)

// CloseCodes are the error codes the close codes stand for, as an error
// frame or an HTTP refusal would carry them.
var CloseCodes = map[int]string{
	CloseBadConnect:         CodeMalformedFrame,
	CloseUnauthenticated:    CodeUnauthenticated,
	CloseForbidden:          CodeForbidden,
	CloseConnectTimeout:     "connect_timeout",
	CloseTooManyConnections: "too_many_connections",
}

// InitialCredit is the credit a subscription starts with: the bound of
// EVENT-030, counted end to end.
const InitialCredit = 1024

// Encoding is a frame encoding.
type Encoding uint8

// The two encodings.
const (
	JSON Encoding = iota
	Msgpack
)

// Subprotocol returns the subprotocol that selects e.
func (e Encoding) Subprotocol() string {
	if e == Msgpack {
		return SubprotocolMsgpack
	}
	return SubprotocolJSON
}

// EncodingOf returns the encoding a subprotocol selects.
func EncodingOf(subprotocol string) (Encoding, bool) {
	switch subprotocol {
	case SubprotocolJSON:
		return JSON, true
	case SubprotocolMsgpack:
		return Msgpack, true
	}
	return 0, false
}

// Frame is one frame in either direction. Which members are set depends on
// Op.
type Frame struct {
	Op       string
	ID       uint64
	Sub      uint64
	ClientID string
	Filter   *schema.EventFilter
	N        int64
	// Seq is an event's stream sequence; in a lagged event, the sequence of
	// the last event it counts, after which a resume continues (EVENT-031);
	// in subscribed, the sequence the subscription starts after (its
	// registration point).
	Seq uint64
	// AfterSeq, in subscribe, resumes a subscription the SDK held on an
	// earlier connection: events stored after it are replayed first.
	AfterSeq uint64
	// StartTime, in subscribe, starts a subscription from the stream: the
	// client's events stored at or after this time (unix milliseconds) are
	// replayed first, then live ones.
	StartTime int64
	// FromStart, in subscribe, starts a subscription from the first of the
	// client's events the stream holds.
	FromStart bool
	// Held, in subscribe, counts events of the resumed subscription the SDK
	// still holds; they stay counted against the bound until credited.
	Held int64
	// EventID, on an event frame, is the event's id (64 lowercase hex
	// digits), by which a later fabric.commit_superseded's
	// withdrawn_event_ids names it; none on a lagged.
	EventID string
	// Event is the ClientEvent already encoded in the frame's encoding.
	Event []byte
	// AtMost, on the event frame of a lagged, marks its discarded as an
	// upper bound: it counts stream sequences the gateway could not read or
	// decode, not only events the filter selected (EVENT-031).
	AtMost  bool
	Reason  string
	Code    string
	Message string
	// Token, in connect, is the bearer token of a connection opened
	// without an Authorization header.
	Token string
}

// ErrMalformed is wrapped by every Decode error.
var ErrMalformed = errors.New("malformed frame")

// ErrInvalidFilter is wrapped, beside ErrMalformed, when only the filter of
// an otherwise well-formed frame is wrong; Decode then still returns the
// frame's op and id so the error can answer the request.
var ErrInvalidFilter = errors.New("invalid filter")

type jsonFrame struct {
	Op        string          `json:"op"`
	ID        uint64          `json:"id,omitempty"`
	Sub       uint64          `json:"sub,omitempty"`
	ClientID  string          `json:"client_id,omitempty"`
	Filter    json.RawMessage `json:"filter,omitempty"`
	N         int64           `json:"n,omitempty"`
	Seq       uint64          `json:"seq,omitempty"`
	AfterSeq  uint64          `json:"after_seq,omitempty"`
	StartTime int64           `json:"start_time,omitempty"`
	FromStart bool            `json:"from_start,omitempty"`
	Held      int64           `json:"held,omitempty"`
	EventID   string          `json:"event_id,omitempty"`
	Event     json.RawMessage `json:"event,omitempty"`
	AtMost    bool            `json:"at_most,omitempty"`
	Reason    string          `json:"reason,omitempty"`
	Code      string          `json:"code,omitempty"`
	Message   string          `json:"message,omitempty"`
	Token     string          `json:"token,omitempty"`
}

type msgpackFrame struct {
	Op        string             `msgpack:"op"`
	ID        uint64             `msgpack:"id,omitempty"`
	Sub       uint64             `msgpack:"sub,omitempty"`
	ClientID  string             `msgpack:"client_id,omitempty"`
	Filter    msgpack.RawMessage `msgpack:"filter,omitempty"`
	N         int64              `msgpack:"n,omitempty"`
	Seq       uint64             `msgpack:"seq,omitempty"`
	AfterSeq  uint64             `msgpack:"after_seq,omitempty"`
	StartTime int64              `msgpack:"start_time,omitempty"`
	FromStart bool               `msgpack:"from_start,omitempty"`
	Held      int64              `msgpack:"held,omitempty"`
	EventID   string             `msgpack:"event_id,omitempty"`
	Event     msgpack.RawMessage `msgpack:"event,omitempty"`
	AtMost    bool               `msgpack:"at_most,omitempty"`
	Reason    string             `msgpack:"reason,omitempty"`
	Code      string             `msgpack:"code,omitempty"`
	Message   string             `msgpack:"message,omitempty"`
	Token     string             `msgpack:"token,omitempty"`
}

// Decode parses one frame. Members a frame does not define are refused, so a
// misspelt member is an error, not a silent default. Errors wrap
// ErrMalformed, and also ErrInvalidFilter when only the filter is wrong.
func Decode(enc Encoding, b []byte) (Frame, error) {
	var (
		f      Frame
		filter []byte
	)
	if enc == Msgpack {
		var m msgpackFrame
		d, err := schema.NewMsgpackDecoder(b)
		if err != nil {
			return Frame{}, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		d.DisallowUnknownFields(true)
		if err := d.Decode(&m); err != nil {
			return Frame{}, fmt.Errorf("%w: %s", ErrMalformed, describe(err, "msgpack map"))
		}
		f = Frame{Op: m.Op, ID: m.ID, Sub: m.Sub, ClientID: m.ClientID, N: m.N,
			Seq: m.Seq, AfterSeq: m.AfterSeq, StartTime: m.StartTime, FromStart: m.FromStart, Held: m.Held, EventID: m.EventID, Event: m.Event, AtMost: m.AtMost, Reason: m.Reason, Code: m.Code, Message: m.Message, Token: m.Token}
		filter = m.Filter
	} else {
		var j jsonFrame
		d := json.NewDecoder(bytes.NewReader(b))
		d.DisallowUnknownFields()
		if err := d.Decode(&j); err != nil {
			return Frame{}, fmt.Errorf("%w: %s", ErrMalformed, describe(err, "JSON object"))
		}
		if d.More() {
			return Frame{}, fmt.Errorf("%w: trailing data", ErrMalformed)
		}
		f = Frame{Op: j.Op, ID: j.ID, Sub: j.Sub, ClientID: j.ClientID, N: j.N,
			Seq: j.Seq, AfterSeq: j.AfterSeq, StartTime: j.StartTime, FromStart: j.FromStart, Held: j.Held, EventID: j.EventID, Event: j.Event, AtMost: j.AtMost, Reason: j.Reason, Code: j.Code, Message: j.Message, Token: j.Token}
		filter = j.Filter
	}
	if filter != nil {
		var ef schema.EventFilter
		var err error
		if enc == Msgpack {
			err = ef.UnmarshalMsgpack(filter)
		} else {
			err = ef.UnmarshalJSON(filter)
		}
		if err != nil {
			return Frame{Op: f.Op, ID: f.ID}, fmt.Errorf("%w: %w: %v", ErrMalformed, ErrInvalidFilter, err)
		}
		f.Filter = &ef
	}
	return f, nil
}

// describe says what is wrong with a frame the decoder refused, in the
// protocol's words: the decoders' own errors name Go types and fields.
func describe(err error, shape string) string {
	var typ *json.UnmarshalTypeError
	if errors.As(err, &typ) && typ.Field != "" {
		return fmt.Sprintf("member %q has the wrong type", typ.Field)
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return "unknown member " + name
	}
	if i := strings.Index(msg, "unknown field "); i >= 0 && strings.HasPrefix(msg, "msgpack:") {
		return "unknown member " + msg[i+len("unknown field "):]
	}
	return "not a " + shape + " of the protocol's members"
}

// Append appends f to dst in encoding enc. Event, when set, must already be
// encoded in enc; it is copied as is.
func Append(enc Encoding, dst []byte, f *Frame) []byte {
	w := appender{buf: dst, json: enc == JSON}
	n := 1
	count := func(set bool) {
		if set {
			n++
		}
	}
	count(f.ID != 0)
	count(f.Sub != 0)
	count(f.ClientID != "")
	count(f.Filter != nil)
	count(f.N != 0)
	count(f.Seq != 0)
	count(f.AfterSeq != 0)
	count(f.StartTime != 0)
	count(f.FromStart)
	count(f.Held != 0)
	count(f.EventID != "")
	count(f.Event != nil)
	count(f.AtMost)
	count(f.Reason != "")
	count(f.Code != "")
	count(f.Message != "")
	count(f.Token != "")
	w.mapStart(n)
	w.str("op", f.Op)
	if f.ID != 0 {
		w.uint("id", f.ID)
	}
	if f.Sub != 0 {
		w.uint("sub", f.Sub)
	}
	if f.ClientID != "" {
		w.str("client_id", f.ClientID)
	}
	if f.Filter != nil {
		w.key("filter")
		var err error
		n := len(w.buf)
		if w.json {
			w.buf, err = f.Filter.AppendJSON(w.buf)
		} else {
			w.buf, err = f.Filter.AppendMsgpack(w.buf)
		}
		if err != nil {
			// An invalid filter is sent as none, which the gateway refuses;
			// the SDK validates before it gets here.
			w.buf = w.buf[:n]
			if w.json {
				w.buf = append(w.buf, "null"...)
			} else {
				w.buf = append(w.buf, 0xc0)
			}
		}
	}
	if f.N != 0 {
		w.int("n", f.N)
	}
	if f.Seq != 0 {
		w.uint("seq", f.Seq)
	}
	if f.AfterSeq != 0 {
		w.uint("after_seq", f.AfterSeq)
	}
	if f.StartTime != 0 {
		w.int("start_time", f.StartTime)
	}
	if f.FromStart {
		w.bool("from_start")
	}
	if f.Held != 0 {
		w.int("held", f.Held)
	}
	if f.EventID != "" {
		w.str("event_id", f.EventID)
	}
	if f.Event != nil {
		w.key("event")
		w.buf = append(w.buf, f.Event...)
	}
	if f.AtMost {
		w.bool("at_most")
	}
	if f.Reason != "" {
		w.str("reason", f.Reason)
	}
	if f.Code != "" {
		w.str("code", f.Code)
	}
	if f.Message != "" {
		w.str("message", f.Message)
	}
	if f.Token != "" {
		w.str("token", f.Token)
	}
	if w.json {
		w.buf = append(w.buf, '}')
	}
	return w.buf
}

// AppendLagged appends the ClientEvent lagged {discarded: n} in enc
// (EVENT-031).
func AppendLagged(enc Encoding, dst []byte, n uint64) []byte {
	if enc == JSON {
		dst = append(dst, `{"kind":"lagged","lagged":{"discarded":`...)
		dst = strconv.AppendUint(dst, n, 10)
		return append(dst, "}}"...)
	}
	w := appender{buf: dst}
	w.mapStart(2)
	w.str("kind", string(schema.KindLagged))
	w.key("lagged")
	w.mapStart(1)
	w.uint("discarded", n)
	return w.buf
}

// appender writes the few shapes frames need, in msgpack or JSON.
type appender struct {
	buf   []byte
	json  bool
	first bool
}

func (w *appender) mapStart(n int) {
	if w.json {
		w.buf = append(w.buf, '{')
		w.first = true
		return
	}
	if n < 16 {
		w.buf = append(w.buf, 0x80|byte(n))
		return
	}
	w.buf = append(w.buf, 0xde, byte(n>>8), byte(n))
}

func (w *appender) key(k string) {
	if w.json {
		if !w.first {
			w.buf = append(w.buf, ',')
		}
		w.first = false
		w.buf = append(w.buf, '"')
		w.buf = append(w.buf, k...) // keys are this package's constants
		w.buf = append(w.buf, '"', ':')
		return
	}
	w.rawStr(k)
}

func (w *appender) rawStr(s string) {
	switch n := len(s); {
	case n < 32:
		w.buf = append(w.buf, 0xa0|byte(n))
	case n < 1<<8:
		w.buf = append(w.buf, 0xd9, byte(n))
	case n < 1<<16:
		w.buf = append(w.buf, 0xda, byte(n>>8), byte(n))
	default:
		w.buf = append(w.buf, 0xdb, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	w.buf = append(w.buf, s...)
}

// bool appends k: true; a false member is left out.
func (w *appender) bool(k string) {
	w.key(k)
	if w.json {
		w.buf = append(w.buf, "true"...)
	} else {
		w.buf = append(w.buf, 0xc3)
	}
}

func (w *appender) str(k, v string) {
	w.key(k)
	if w.json {
		if plain(v) {
			w.buf = append(w.buf, '"')
			w.buf = append(w.buf, v...)
			w.buf = append(w.buf, '"')
			return
		}
		b, _ := json.Marshal(v) // escapes as JSON, unlike strconv.Quote
		w.buf = append(w.buf, b...)
		return
	}
	w.rawStr(v)
}

func (w *appender) uint(k string, v uint64) {
	w.key(k)
	if w.json {
		w.buf = strconv.AppendUint(w.buf, v, 10)
		return
	}
	switch {
	case v < 128:
		w.buf = append(w.buf, byte(v))
	case v < 1<<8:
		w.buf = append(w.buf, 0xcc, byte(v))
	case v < 1<<16:
		w.buf = append(w.buf, 0xcd, byte(v>>8), byte(v))
	case v < 1<<32:
		w.buf = append(w.buf, 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	default:
		w.buf = append(w.buf, 0xcf, byte(v>>56), byte(v>>48), byte(v>>40), byte(v>>32),
			byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
}

func (w *appender) int(k string, v int64) {
	if v >= 0 {
		w.uint(k, uint64(v))
		return
	}
	w.key(k)
	if w.json {
		w.buf = strconv.AppendInt(w.buf, v, 10)
		return
	}
	u := uint64(v)
	w.buf = append(w.buf, 0xd3, byte(u>>56), byte(u>>48), byte(u>>40), byte(u>>32),
		byte(u>>24), byte(u>>16), byte(u>>8), byte(u))
}

// plain reports whether s needs no JSON escaping.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}
