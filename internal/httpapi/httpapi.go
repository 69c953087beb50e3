// Package httpapi holds the HTTP conventions every role shares (DESIGN §10):
// bodies in JSON by default or msgpack with Content-Type application/msgpack,
// errors as {"error": {"code", "message"}} with the status of their refusal
// kind (the one place a refusal becomes an HTTP status), and a bound on
// every request body.
package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"strconv"

	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/vmihailenco/msgpack/v5"
)

// ContentTypeMsgpack selects msgpack bodies.
const ContentTypeMsgpack = "application/msgpack"

// DefaultMaxBody bounds a request body unless a handler sets its own bound.
const DefaultMaxBody = 1 << 20

// ErrBodyTooLarge refuses a request body over its bound.
var ErrBodyTooLarge = refusal.New(refusal.TooLarge, "body_too_large", "body too large")

// statuses is the HTTP status of every refusal kind.
var statuses = map[refusal.Kind]int{
	refusal.Invalid:         http.StatusBadRequest,
	refusal.TooLarge:        http.StatusRequestEntityTooLarge,
	refusal.Unauthenticated: http.StatusUnauthorized,
	refusal.Forbidden:       http.StatusForbidden,
	refusal.NotFound:        http.StatusNotFound,
	refusal.Conflict:        http.StatusConflict,
	refusal.Unprocessable:   http.StatusUnprocessableEntity,
	refusal.RateLimited:     http.StatusTooManyRequests,
	refusal.Unavailable:     http.StatusServiceUnavailable,
	refusal.StorageFull:     http.StatusInsufficientStorage,
	refusal.NotOffered:      http.StatusNotImplemented,
}

// Status is the HTTP status err answers with: its refusal kind's, 500 for
// an error that is no refusal.
func Status(err error) int {
	var re *refusal.Error
	if errors.As(err, &re) {
		if s, ok := statuses[re.Kind]; ok {
			return s
		}
	}
	return http.StatusInternalServerError
}

// IsMsgpack reports whether the request body is msgpack.
func IsMsgpack(r *http.Request) bool {
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return mt == ContentTypeMsgpack
}

// wantsMsgpack reports whether the response should be msgpack: the caller
// asked for it with Accept, or sent msgpack and did not ask for anything else.
func wantsMsgpack(r *http.Request) bool {
	if accept := r.Header.Get("Accept"); accept != "" {
		mt, _, _ := mime.ParseMediaType(accept)
		return mt == ContentTypeMsgpack
	}
	return IsMsgpack(r)
}

// ReadBody reads at most limit bytes of the request body. A larger body is
// ErrBodyTooLarge.
func ReadBody(r *http.Request, limit int64) ([]byte, error) {
	return ReadBodyInto(r, limit, nil)
}

// ReadBodyInto is ReadBody reading into buf when the announced body fits
// its capacity, so a caller may reuse buffers.
func ReadBodyInto(r *http.Request, limit int64, buf []byte) ([]byte, error) {
	if limit <= 0 {
		limit = DefaultMaxBody
	}
	var b []byte
	var err error
	if n := r.ContentLength; n >= 0 && n <= limit {
		// The size is announced: one buffer of it, no regrowth. A body
		// that is not the length it announced fails in the server's read.
		if int64(cap(buf)) >= n {
			b = buf[:n]
		} else {
			b = make([]byte, n)
		}
		_, err = io.ReadFull(r.Body, b)
	} else {
		b, err = io.ReadAll(io.LimitReader(r.Body, limit+1))
	}
	if err != nil {
		return nil, refusal.BadRequest("read body: %v", err)
	}
	if int64(len(b)) > limit {
		return nil, ErrBodyTooLarge.With("body exceeds %d bytes", limit)
	}
	return b, nil
}

// Decode reads the request body, bounded by limit, into v: msgpack when the
// request says so, JSON otherwise. Unknown members are refused. Errors are
// refusal.ErrBadRequest or ErrBodyTooLarge naming what is wrong.
func Decode(r *http.Request, limit int64, v any) error {
	b, err := ReadBody(r, limit)
	if err != nil {
		return err
	}
	if len(b) == 0 {
		return refusal.BadRequest("empty body")
	}
	if IsMsgpack(r) {
		dec, err := schema.NewMsgpackDecoder(b)
		if err != nil {
			return refusal.BadRequest("malformed msgpack: %v", err)
		}
		dec.DisallowUnknownFields(true)
		if err := dec.Decode(v); err != nil {
			return refusal.BadRequest("malformed msgpack: %v", err)
		}
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return refusal.BadRequest("malformed JSON: %v", describeJSONError(err))
	}
	if dec.More() {
		return refusal.BadRequest("malformed JSON: trailing data after the object")
	}
	return nil
}

func describeJSONError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return fmt.Sprintf("member %q: want %s", te.Field, te.Type)
	}
	return err.Error()
}

// Write sends v with status, as msgpack or JSON to match the request.
func Write(w http.ResponseWriter, r *http.Request, status int, v any) {
	var (
		body []byte
		err  error
		ct   = "application/json"
	)
	if wantsMsgpack(r) {
		ct = ContentTypeMsgpack
		body, err = msgpack.Marshal(v)
	} else {
		body, err = json.Marshal(v)
	}
	if err != nil {
		slog.Error("encode response", "err", err)
		http.Error(w, `{"error":{"code":"internal","message":"encode response"}}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// WriteError sends err as {"error": {"code", "message"}} with its status,
// and Retry-After when the refusal says when to retry. An error that is no
// refusal is a 500 whose message reveals nothing, and is logged.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	var re *refusal.Error
	if !errors.As(err, &re) {
		slog.Error("request failed", "method", r.Method, "route", r.Pattern, "err", err)
		re = refusal.Internal
	}
	if re.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(re.RetryAfter.Seconds()))))
	}
	Write(w, r, Status(err), struct {
		Error *refusal.Error `json:"error" msgpack:"error"`
	}{re})
}
