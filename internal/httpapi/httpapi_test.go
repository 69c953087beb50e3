package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/vmihailenco/msgpack/v5"
)

type req struct {
	Name  string `json:"name" msgpack:"name"`
	Count int    `json:"count" msgpack:"count"`
}

func TestDecodeJSONAndMsgpack(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"name":"a","count":2}`))
	var got req
	if err := Decode(r, 0, &got); err != nil || got != (req{"a", 2}) {
		t.Fatalf("json: %+v %v", got, err)
	}
	b, _ := msgpack.Marshal(req{"b", 3})
	r = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(string(b)))
	r.Header.Set("Content-Type", ContentTypeMsgpack)
	got = req{}
	if err := Decode(r, 0, &got); err != nil || got != (req{"b", 3}) {
		t.Fatalf("msgpack: %+v %v", got, err)
	}
}

func TestDecodeRefusesBadBodies(t *testing.T) {
	for name, tc := range map[string]struct {
		body   string
		limit  int64
		status int
		want   string
	}{
		"unknown member": {`{"name":"a","extra":1}`, 0, 400, "extra"},
		"wrong type":     {`{"name":1}`, 0, 400, `"name"`},
		"not json":       {`{`, 0, 400, "malformed JSON"},
		"trailing":       {`{"name":"a"} {}`, 0, 400, "trailing"},
		"empty":          {``, 0, 400, "empty"},
		"too large":      {`{"name":"aaaaaaaaaaaa"}`, 8, 413, "exceeds 8"},
	} {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tc.body))
		err := Decode(r, tc.limit, &req{})
		var he *refusal.Error
		if !errors.As(err, &he) || Status(err) != tc.status || !strings.Contains(he.Message, tc.want) {
			t.Errorf("%s: err = %v, want %d containing %q", name, err, tc.status, tc.want)
		}
	}
}

func TestWriteErrorShapes(t *testing.T) {
	for name, tc := range map[string]struct {
		err    error
		status int
		code   string
	}{
		"api":      {refusal.BadRequest("member %q missing", "group"), 400, "bad_request"},
		"auth":     {auth.ErrForbidden.With("token lacks scope"), 403, "forbidden"},
		"internal": {errors.New("secret detail"), 500, "internal"},
	} {
		w := httptest.NewRecorder()
		WriteError(w, httptest.NewRequest(http.MethodGet, "/", nil), tc.err)
		var body struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if w.Code != tc.status || body.Error.Code != tc.code || strings.Contains(body.Error.Message, "secret") {
			t.Errorf("%s: %d %+v", name, w.Code, body)
		}
	}
}

func TestWriteNegotiatesMsgpack(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Accept", ContentTypeMsgpack)
	w := httptest.NewRecorder()
	Write(w, r, 200, req{"x", 1})
	var got req
	if err := msgpack.Unmarshal(w.Body.Bytes(), &got); err != nil || got != (req{"x", 1}) || w.Header().Get("Content-Type") != ContentTypeMsgpack {
		t.Fatalf("got %+v %v %q", got, err, w.Header().Get("Content-Type"))
	}
}
