// Package httpapi holds the HTTP conventions every role shares (DESIGN §10):
// bodies in JSON by default or msgpack with Content-Type application/msgpack,
// errors as {"error": {"code", "message"}} with a fitting status, and a bound
// on every request body.
package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/vmihailenco/msgpack/v5"
)

// ContentTypeMsgpack selects msgpack bodies.
const ContentTypeMsgpack = "application/msgpack"

// DefaultMaxBody bounds a request body unless a handler sets its own bound.
const DefaultMaxBody = 1 << 20

// Error is a refusal with an HTTP status, a stable code and a message for the
// caller. Messages name the problem, never secret or private values.
type Error struct {
	Status  int    `json:"-" msgpack:"-"`
	Code    string `json:"code" msgpack:"code"`
	Message string `json:"message" msgpack:"message"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Errorf returns an *Error with status, code and a formatted message.
func Errorf(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// BadRequest is a 400 with code "bad_request".
func BadRequest(format string, args ...any) *Error {
	return Errorf(http.StatusBadRequest, "bad_request", format, args...)
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

// ReadBody reads at most limit bytes of the request body. A larger body is a
// 413 *Error.
func ReadBody(r *http.Request, limit int64) ([]byte, error) {
	if limit <= 0 {
		limit = DefaultMaxBody
	}
	var b []byte
	var err error
	if n := r.ContentLength; n >= 0 && n <= limit {
		// The size is announced: one buffer of it, no regrowth. A body
		// that is not the length it announced fails in the server's read.
		b = make([]byte, n)
		_, err = io.ReadFull(r.Body, b)
	} else {
		b, err = io.ReadAll(io.LimitReader(r.Body, limit+1))
	}
	if err != nil {
		return nil, BadRequest("read body: %v", err)
	}
	if int64(len(b)) > limit {
		return nil, Errorf(http.StatusRequestEntityTooLarge, "body_too_large", "body exceeds %d bytes", limit)
	}
	return b, nil
}

// Decode reads the request body, bounded by limit, into v: msgpack when the
// request says so, JSON otherwise. Unknown members are refused. Errors are
// 400 or 413 *Errors naming what is wrong.
func Decode(r *http.Request, limit int64, v any) error {
	b, err := ReadBody(r, limit)
	if err != nil {
		return err
	}
	if len(b) == 0 {
		return BadRequest("empty body")
	}
	if IsMsgpack(r) {
		dec, err := schema.NewMsgpackDecoder(b)
		if err != nil {
			return BadRequest("malformed msgpack: %v", err)
		}
		dec.DisallowUnknownFields(true)
		if err := dec.Decode(v); err != nil {
			return BadRequest("malformed msgpack: %v", err)
		}
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return BadRequest("malformed JSON: %v", describeJSONError(err))
	}
	if dec.More() {
		return BadRequest("malformed JSON: trailing data after the object")
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

// WriteError sends err as {"error": {"code", "message"}}. An *Error or an
// *auth.Error keeps its status and message; anything else is a 500 whose
// message reveals nothing, and is logged.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	var (
		he *Error
		ae *auth.Error
	)
	switch {
	case errors.As(err, &he):
	case errors.As(err, &ae):
		he = &Error{Status: ae.Status, Code: ae.Code, Message: ae.Reason}
	default:
		slog.Error("request failed", "method", r.Method, "route", r.Pattern, "err", err)
		he = &Error{Status: http.StatusInternalServerError, Code: "internal", Message: "internal error"}
	}
	Write(w, r, he.Status, struct {
		Error *Error `json:"error" msgpack:"error"`
	}{he})
}
