package client

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// Reader reads what a hosted client holds over the read API
// (docs/read-api.md): its conversations, their members and messages, its
// consent and identity records. A read issued when an event arrives, from
// a callback too, sees the change the event reports (EVENT-010).
type Reader struct {
	base, tenant string
	token        func(context.Context) (string, error)
	http         *http.Client
	json         bool
}

// ReaderOption configures a Reader.
type ReaderOption func(*Reader)

// ReaderHTTPClient sets the HTTP client of a Reader.
func ReaderHTTPClient(c *http.Client) ReaderOption { return func(r *Reader) { r.http = c } }

// ReaderTokenFunc obtains the bearer token (scope read) for every call;
// the token given to NewReader is then ignored.
func ReaderTokenFunc(f func(context.Context) (string, error)) ReaderOption {
	return func(r *Reader) { r.token = f }
}

// ReaderJSON makes a Reader ask for JSON answers (the default is msgpack).
func ReaderJSON() ReaderOption { return func(r *Reader) { r.json = true } }

// NewReader returns a Reader of a tenant's clients at the fabric's HTTP
// API base URL (e.g. http://localhost:8080), with a token of scope read or
// admin that names the clients it reads.
func NewReader(baseURL, tenant, token string, opts ...ReaderOption) *Reader {
	r := &Reader{base: strings.TrimRight(baseURL, "/"), tenant: tenant, http: http.DefaultClient,
		token: func(context.Context) (string, error) { return token, nil }}
	for _, o := range opts {
		o(r)
	}
	return r
}

// APIError is an error answer of the HTTP API (the read API, operations).
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("fabric API: %d %s: %s", e.Status, e.Code, e.Message)
}

// ErrNotFound is matched by an APIError of status 404 (errors.Is): an
// unknown client, conversation or message.
var ErrNotFound = errors.New("client: not found")

// Is makes a 404 match ErrNotFound.
func (e *APIError) Is(target error) bool {
	return target == ErrNotFound && e.Status == http.StatusNotFound
}

// Page is a page request: at most Limit items (0: the server's default)
// after Cursor, a previous page's NextCursor ("" for the first page).
type Page struct {
	Limit  int
	Cursor string
}

func (p Page) values() url.Values {
	v := url.Values{}
	if p.Limit != 0 {
		v.Set("limit", strconv.Itoa(p.Limit))
	}
	if p.Cursor != "" {
		v.Set("cursor", p.Cursor)
	}
	return v
}

// ConversationQuery selects conversations; zero fields select all.
type ConversationQuery struct {
	Page
	Type         schema.ConversationType
	ConsentState schema.ConsentState
	Paused       *bool
	UpdatedSince time.Time
}

// MessageQuery selects messages; zero fields select all, oldest first.
type MessageQuery struct {
	Page
	ContentTypes []schema.ContentTypeID
	SentAfter    time.Time
	SentBefore   time.Time
	Descending   bool
}

// Conversations returns a page of a client's conversations, newest
// activity first.
func (r *Reader) Conversations(ctx context.Context, clientID string, q ConversationQuery) (schema.ConversationPage, error) {
	v := q.values()
	if q.Type != "" {
		v.Set("type", string(q.Type))
	}
	if q.ConsentState != "" {
		v.Set("consent_state", string(q.ConsentState))
	}
	if q.Paused != nil {
		v.Set("paused", strconv.FormatBool(*q.Paused))
	}
	if !q.UpdatedSince.IsZero() {
		v.Set("updated_since", strconv.FormatInt(q.UpdatedSince.UnixMilli(), 10))
	}
	var out schema.ConversationPage
	return out, r.get(ctx, clientID, "/conversations", v, &out)
}

// Conversation returns one conversation of a client.
func (r *Reader) Conversation(ctx context.Context, clientID string, groupID []byte) (schema.Conversation, error) {
	var out schema.Conversation
	return out, r.get(ctx, clientID, "/conversations/"+hex.EncodeToString(groupID), nil, &out)
}

// Members returns a conversation's members.
func (r *Reader) Members(ctx context.Context, clientID string, groupID []byte) (schema.MemberList, error) {
	var out schema.MemberList
	return out, r.get(ctx, clientID, "/conversations/"+hex.EncodeToString(groupID)+"/members", nil, &out)
}

// Messages returns a page of a conversation's messages in canonical order.
func (r *Reader) Messages(ctx context.Context, clientID string, groupID []byte, q MessageQuery) (schema.MessagePage, error) {
	v := q.values()
	if len(q.ContentTypes) > 0 {
		s := make([]string, len(q.ContentTypes))
		for i, t := range q.ContentTypes {
			s[i] = fmt.Sprintf("%s/%s:%d", t.AuthorityID, t.TypeID, t.VersionMajor)
		}
		v.Set("content_types", strings.Join(s, ","))
	}
	if !q.SentAfter.IsZero() {
		v.Set("sent_after", strconv.FormatInt(q.SentAfter.UnixMilli(), 10))
	}
	if !q.SentBefore.IsZero() {
		v.Set("sent_before", strconv.FormatInt(q.SentBefore.UnixMilli(), 10))
	}
	if q.Descending {
		v.Set("direction", "descending")
	}
	var out schema.MessagePage
	return out, r.get(ctx, clientID, "/conversations/"+hex.EncodeToString(groupID)+"/messages", v, &out)
}

// Message returns one message a client holds.
func (r *Reader) Message(ctx context.Context, clientID string, messageID []byte) (schema.Message, error) {
	var out schema.Message
	return out, r.get(ctx, clientID, "/messages/"+hex.EncodeToString(messageID), nil, &out)
}

// Consent returns a page of a client's consent records.
func (r *Reader) Consent(ctx context.Context, clientID string, p Page) (schema.ConsentPage, error) {
	var out schema.ConsentPage
	return out, r.get(ctx, clientID, "/consent", p.values(), &out)
}

// Identities returns a page of the association states a client holds.
func (r *Reader) Identities(ctx context.Context, clientID string, p Page) (schema.IdentityPage, error) {
	var out schema.IdentityPage
	return out, r.get(ctx, clientID, "/identities", p.values(), &out)
}

// maxAnswer bounds an answer's body.
const maxAnswer = 64 << 20

func (r *Reader) get(ctx context.Context, clientID, path string, q url.Values, out any) error {
	u := r.base + "/v1/tenants/" + url.PathEscape(r.tenant) + "/clients/" + url.PathEscape(clientID) + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("client: read: %w", err)
	}
	tok, err := r.token(ctx)
	if err != nil {
		return fmt.Errorf("client: read: token: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	mt := "application/msgpack"
	if r.json {
		mt = "application/json"
	}
	req.Header.Set("Accept", mt)
	resp, err := r.http.Do(req)
	if err != nil {
		return fmt.Errorf("client: read: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return fmt.Errorf("client: read: %w", err)
	}
	isJSON := strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json")
	decode := func(v any) error {
		if isJSON {
			return json.Unmarshal(body, v)
		}
		return schema.UnmarshalMsgpack(body, v)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Code    string `json:"code" msgpack:"code"`
				Message string `json:"message" msgpack:"message"`
			} `json:"error" msgpack:"error"`
		}
		_ = decode(&e)
		return &APIError{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message}
	}
	if err := decode(out); err != nil {
		return fmt.Errorf("client: read: decode answer: %w", err)
	}
	return nil
}
