// Package operations is the HTTP API through which an app makes its hosted
// clients speak (issue 19): create a conversation, send a message, add and
// remove members, change components, leave, update the own leaf. Each call
// carries an Idempotency-Key and is answered at once with an operation id;
// the operation is stored on its group's input subject, so it is
// serialized with the group's input and converge executes it once, in the
// fenced transaction that stores what it sends (docs/outbound.md). Its
// record (GET …/operations/{operation_id}) and the client's events say how
// it went.
package operations

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Routes, under /v1/tenants/{tenant}/clients/{client_id}.
const (
	prefix            = "/v1/tenants/{tenant}/clients/{client_id}"
	RouteCreate       = "POST " + prefix + "/conversations"
	RouteSend         = "POST " + prefix + "/conversations/{group_id}/messages"
	RouteAddMembers   = "POST " + prefix + "/conversations/{group_id}/members"
	RouteRemoveMember = "DELETE " + prefix + "/conversations/{group_id}/members/{inbox_id}"
	RouteUpdate       = "PATCH " + prefix + "/conversations/{group_id}"
	RouteLeave        = "POST " + prefix + "/conversations/{group_id}/leave"
	RouteSelfUpdate   = "POST " + prefix + "/conversations/{group_id}/update"
	RouteOperation    = "GET " + prefix + "/operations/{operation_id}"
)

// HeaderIdempotencyKey names the operation: the same key from the same
// client is the same operation, stored and executed once.
const HeaderIdempotencyKey = "Idempotency-Key"

// Limits of a request.
const (
	maxBody           = 1 << 20
	maxIdempotencyKey = 255
	maxKeyPackages    = 256
)

// Refusals of the operations API.
var (
	// ErrOperationNotFound: no operation of this id of this client.
	ErrOperationNotFound = refusal.New(refusal.NotFound, "operation_not_found", "no such operation of this client")
	// ErrUnavailable: the operation could not be stored; nothing was
	// accepted.
	ErrUnavailable = refusal.New(refusal.Unavailable, "unavailable", "the operation could not be stored; nothing was accepted, retry the request")
	// ErrIdempotencyKeyReused: the key names an operation stored with
	// another request on the same route and group (issue 26).
	ErrIdempotencyKeyReused = refusal.New(refusal.Conflict, "idempotency_key_reused", "this Idempotency-Key was used with another request on this route and conversation")
	// ErrPayloadTooLarge: the message, or the operation, is larger than
	// the fabric can store and send (issue 26).
	ErrPayloadTooLarge = refusal.New(refusal.TooLarge, "payload_too_large", "the message is larger than the fabric can send")
)

// requestHeadroom is what an operation's input message adds to its
// request on FABRIC_IN: its headers (class, message id, the expected
// sequence) and a margin.
const requestHeadroom = 1024

// Clients finds hosted clients.
type Clients interface {
	// ClientInbox returns the inbox of a hosted client of the tenant, or
	// a refusal (not found) when there is none.
	ClientInbox(ctx context.Context, tenant, clientID string) (string, error)
}

// Config is what the API needs.
type Config struct {
	JS       jetstream.JetStream
	Verifier *auth.Verifier
	Clients  Clients
	Now      func() time.Time
	// Quotas bound each tenant's requests; zero fields take defaults.
	Quotas Quotas
	// Registerer receives the quota refusals metric; none when nil.
	Registerer prometheus.Registerer
}

// API serves the operations routes.
type API struct {
	cfg    Config
	limits *limits
}

// New returns the API.
func New(cfg Config) *API {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &API{cfg: cfg, limits: newLimits(cfg.Quotas, cfg.Registerer)}
}

// Mount registers every route on mux.
func (a *API) Mount(mux *http.ServeMux) {
	mux.HandleFunc(RouteCreate, a.handle(a.create))
	mux.HandleFunc(RouteSend, a.handle(a.send))
	mux.HandleFunc(RouteAddMembers, a.handle(a.addMembers))
	mux.HandleFunc(RouteRemoveMember, a.handle(a.removeMember))
	mux.HandleFunc(RouteUpdate, a.handle(a.update))
	mux.HandleFunc(RouteLeave, a.handle(a.simple(schema.OpLeave)))
	mux.HandleFunc(RouteSelfUpdate, a.handle(a.simple(schema.OpSelfUpdate)))
	mux.HandleFunc(RouteOperation, a.getOperation)
}

// call is an authorized request of one client.
type call struct {
	tenant, client string
}

// builder makes the operation of a request.
type builder func(r *http.Request, c call, req *bus.OperationRequest) error

// authorize checks the token: scope send, or admin, on the path's tenant
// and client, the tenant's request quota, and that the client is hosted.
func (a *API) authorize(r *http.Request) (call, error) {
	claims, err := a.cfg.Verifier.FromRequest(r)
	if err != nil {
		return call{}, err
	}
	c := call{tenant: r.PathValue("tenant"), client: r.PathValue("client_id")}
	if err := claims.Require(auth.ScopeSend, c.tenant, c.client); err != nil {
		if claims.Require(auth.ScopeAdmin, c.tenant, c.client) != nil {
			return call{}, err
		}
	}
	if err := subject.ValidTenant(c.tenant); err != nil {
		return call{}, refusal.BadRequest("%v", err)
	}
	if err := subject.ValidClient(c.client); err != nil {
		return call{}, refusal.BadRequest("%v", err)
	}
	// The tenant's quota before the client's record is read: a refusal
	// costs no read (issue 27).
	if err := a.limits.admit(c.tenant, time.Now()); err != nil {
		return call{}, err
	}
	if _, err := a.cfg.Clients.ClientInbox(r.Context(), c.tenant, c.client); err != nil {
		return call{}, err
	}
	return c, nil
}

// handle authorizes, builds, stores and answers one operation.
func (a *API) handle(build builder) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		acc, err := a.serve(r, build)
		if err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
		httpapi.Write(w, r, http.StatusAccepted, acc)
	}
}

func (a *API) serve(r *http.Request, build builder) (schema.OperationAccepted, error) {
	c, err := a.authorize(r)
	if err != nil {
		return schema.OperationAccepted{}, err
	}
	key := r.Header.Get(HeaderIdempotencyKey)
	if key == "" || len(key) > maxIdempotencyKey {
		return schema.OperationAccepted{}, refusal.BadRequest("an %s header of 1 to %d bytes is required", HeaderIdempotencyKey, maxIdempotencyKey)
	}
	req := bus.OperationRequest{ClientID: c.client, Time: a.cfg.Now().UnixMilli()}
	g := r.PathValue("group_id")
	if g != "" {
		if err := subject.ValidGroup(g); err != nil {
			return schema.OperationAccepted{}, refusal.BadRequest("%v", err)
		}
		req.GroupID, _ = hex.DecodeString(g)
	}
	if err := build(r, c, &req); err != nil {
		return schema.OperationAccepted{}, err
	}
	// The key is scoped by the route's kind and group: the same key on
	// another route or conversation is another operation (issue 26).
	req.ID = bus.OperationID(c.tenant, c.client, key, string(req.Kind), g)
	if req.Kind == schema.OpCreateConversation {
		req.GroupID = bus.OperationGroupID(req.ID)
	}
	if err := a.store(r.Context(), c.tenant, req); err != nil {
		return schema.OperationAccepted{}, err
	}
	return schema.OperationAccepted{OperationID: req.ID, GroupID: req.GroupID, Status: schema.OperationQueued}, nil
}

// store puts the operation on its group's input subject, once: the subject
// is the operation's dedup record, so a repeated Idempotency-Key with the
// same request stores nothing new, and one with another request is
// refused (ErrIdempotencyKeyReused). Then its first record, queued,
// unless one is there. An operation that does not fit the server's
// max_payload is refused (ErrPayloadTooLarge), not answered 503 for ever.
// Its bytes are charged to the tenant's quotas first.
func (a *API) store(ctx context.Context, tenant string, req bus.OperationRequest) error {
	data, err := bus.EncodeOperation(req)
	if err != nil {
		return err
	}
	if limit := int(a.cfg.JS.Conn().MaxPayload()) - requestHeadroom; len(data) > limit {
		return ErrPayloadTooLarge.With("the operation is %d bytes encoded; at most %d fit the server's max_payload", len(data), limit)
	}
	release, err := a.limits.charge(tenant, len(data), time.Now())
	if err != nil {
		return err
	}
	idHex := hex.EncodeToString(req.ID)
	subj, err := subject.Input(tenant, hex.EncodeToString(req.GroupID), idHex)
	if err != nil {
		return refusal.BadRequest("%v", err)
	}
	msg := nats.NewMsg(subj)
	msg.Data = data
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	msg.Header.Set(bus.HeaderClass, string(bus.ClassOperation))
	msg.Header.Set(bus.HeaderMessageID, idHex)
	if _, err := a.cfg.JS.PublishMsg(ctx, msg); err != nil {
		release() // nothing new stored
		if !wrongLast(err) {
			return ErrUnavailable.Because(err)
		}
		if err := a.sameRequest(ctx, tenant, req); err != nil {
			return err
		}
	}
	rec, err := bus.OperationRecordMsg(tenant, req.Record(schema.OperationQueued, a.cfg.Now()))
	if err != nil {
		return err
	}
	rec.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	// The operation is stored: a lost first record only delays what GET
	// shows until converge writes the next.
	_, _ = a.cfg.JS.PublishMsg(ctx, rec)
	return nil
}

// sameRequest refuses a request whose operation is stored with another
// request (Idempotency-Key reuse, as Stripe answers it: the same key and
// request are the same answer, the same key and another request 409). The
// requests are compared without the time they were accepted. A stored
// input that is gone (past FABRIC_IN's MaxAge) refuses nothing.
func (a *API) sameRequest(ctx context.Context, tenant string, req bus.OperationRequest) error {
	subj, err := subject.StoredInput(tenant, hex.EncodeToString(req.GroupID), hex.EncodeToString(req.ID))
	if err != nil {
		return refusal.BadRequest("%v", err)
	}
	m, err := bus.GetMsg(ctx, a.cfg.JS, streams.StreamInput, bus.MsgRequest{LastBySubject: subj})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return ErrUnavailable.Because(err)
	}
	stored, err := bus.DecodeOperation(m.Data)
	if err != nil {
		return ErrIdempotencyKeyReused
	}
	stored.Time, req.Time = 0, 0
	was, err := bus.EncodeOperation(stored)
	if err != nil {
		return err
	}
	now, err := bus.EncodeOperation(req)
	if err != nil {
		return err
	}
	if !bytes.Equal(was, now) {
		return ErrIdempotencyKeyReused
	}
	return nil
}

// wrongLast reports a create-if-absent that found the subject taken.
func wrongLast(err error) bool {
	var ae *jetstream.APIError
	return errors.As(err, &ae) && ae.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// getOperation answers GET …/operations/{operation_id} with the current
// record.
func (a *API) getOperation(w http.ResponseWriter, r *http.Request) {
	rec, err := a.operation(r)
	if err != nil {
		httpapi.WriteError(w, r, err)
		return
	}
	httpapi.Write(w, r, http.StatusOK, rec)
}

// operation reads the current record of the request's operation_id.
func (a *API) operation(r *http.Request) (schema.Operation, error) {
	c, err := a.authorize(r)
	if err != nil {
		return schema.Operation{}, err
	}
	subj, err := subject.Operation(c.tenant, r.PathValue("operation_id"))
	if err != nil {
		return schema.Operation{}, refusal.BadRequest("%v", err)
	}
	raw, err := bus.GetMsg(r.Context(), a.cfg.JS, streams.StreamEvents, bus.MsgRequest{LastBySubject: subj})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return schema.Operation{}, ErrOperationNotFound
	}
	if err != nil {
		return schema.Operation{}, err
	}
	rec, err := bus.DecodeOperationRecord(raw.Data)
	if err != nil || rec.ClientID != c.client {
		return schema.Operation{}, ErrOperationNotFound
	}
	return rec, nil
}

func (a *API) create(r *http.Request, c call, req *bus.OperationRequest) error {
	var b schema.CreateConversation
	if err := httpapi.Decode(r, maxBody, &b); err != nil {
		return err
	}
	req.Kind = schema.OpCreateConversation
	set, err := patchedSet(components.Set{}, b.Changes())
	if err != nil {
		return err
	}
	if b.DMKeyPackage != nil {
		if len(b.KeyPackages) > 0 {
			return refusal.BadRequest("a DM has one member besides the client: dm_key_package without key_packages")
		}
		peer, err := engine.KeyPackageInboxID(b.DMKeyPackage)
		if err != nil {
			return refusal.BadRequest("dm_key_package: %v", err)
		}
		own, err := a.cfg.Clients.ClientInbox(r.Context(), c.tenant, c.client)
		if err != nil {
			return err
		}
		members, err := dmMembers(own, peer)
		if err != nil {
			return err
		}
		set.Conversation = &components.ConversationState{Kind: components.KindDM, Members: members}
		b.KeyPackages = []schema.Bytes{b.DMKeyPackage}
	}
	if req.KeyPackages, err = keyPackages(b.KeyPackages, 0); err != nil {
		return err
	}
	if req.Components, err = components.Encode(set); err != nil {
		return refusal.BadRequest("components: %v", err)
	}
	return nil
}

// dmMembers names a DM's two inboxes, lower first.
func dmMembers(a, b string) ([2]components.AccountID, error) {
	x, err := components.ParseInboxID(a)
	if err != nil {
		return [2]components.AccountID{}, err
	}
	y, err := components.ParseInboxID(b)
	if err != nil {
		return [2]components.AccountID{}, refusal.BadRequest("dm_key_package: %v", err)
	}
	if x == y {
		return [2]components.AccountID{}, refusal.BadRequest("dm_key_package is of the client's own inbox")
	}
	if strings.Compare(a, b) > 0 {
		x, y = y, x
	}
	return [2]components.AccountID{x, y}, nil
}

// patchedSet applies a components body to set, as converge applies a
// patch, and checks that the result encodes.
func patchedSet(set components.Set, b schema.ConversationChanges) (components.Set, error) {
	p := patch(b)
	if p.Name != nil || p.Description != nil {
		set.Profile = &components.ProfileState{}
		if p.Name != nil {
			set.Profile.Name = *p.Name
		}
		if p.Description != nil {
			set.Profile.Description = *p.Description
		}
	}
	if p.ImageURL != nil {
		set.Avatar = &components.AvatarState{URL: *p.ImageURL}
	}
	if p.DisappearingSecs != nil {
		set.Retention = &components.RetentionState{DisappearingSecs: *p.DisappearingSecs}
	}
	for _, id := range p.Admins {
		acct, err := components.ParseInboxID(id)
		if err != nil {
			return components.Set{}, refusal.BadRequest("admins: %v", err)
		}
		set.Admins = append(set.Admins, acct)
	}
	if _, err := components.Encode(set); err != nil {
		return components.Set{}, refusal.BadRequest("components: %v", err)
	}
	return set, nil
}

func patch(b schema.ConversationChanges) *bus.ComponentsPatch {
	return &bus.ComponentsPatch{Name: b.Name, Description: b.Description, ImageURL: b.ImageURL, DisappearingSecs: b.DisappearingSecs, Admins: b.Admins}
}

// keyPackages refuses KeyPackages that do not parse.
func keyPackages(kps []schema.Bytes, least int) ([][]byte, error) {
	if len(kps) < least || len(kps) > maxKeyPackages {
		return nil, refusal.BadRequest("key_packages: %d to %d KeyPackages", least, maxKeyPackages)
	}
	var out [][]byte
	for i, kp := range kps {
		if _, err := engine.KeyPackageInboxID(kp); err != nil {
			return nil, refusal.BadRequest("key_packages[%d]: %v", i, err)
		}
		out = append(out, kp)
	}
	return out, nil
}

func (a *API) send(r *http.Request, _ call, req *bus.OperationRequest) error {
	var b schema.SendMessage
	if err := httpapi.Decode(r, maxBody, &b); err != nil {
		return err
	}
	p, err := payload(b)
	if err != nil {
		return refusal.BadRequest("%v", err)
	}
	req.Kind = schema.OpSendMessage
	if req.Payload, err = apppayload.Encode(p); err != nil {
		return refusal.BadRequest("%v", err)
	}
	// Sealed and enveloped, the message must fit the server's max_payload
	// (issue 26): a larger one could never be sent.
	if limit := bus.MaxSendPayload(a.cfg.JS.Conn().MaxPayload()); len(req.Payload) > limit {
		return ErrPayloadTooLarge.With("the message's content is %d bytes encoded; at most %d can be sent", len(req.Payload), limit)
	}
	return nil
}

// errOneContent: a send names exactly one content.
var errOneContent = errors.New("a message is one of: text (with reply_to for a reply), reaction, delete, content_type with content")

func payload(b schema.SendMessage) (apppayload.Payload, error) {
	n := 0
	for _, set := range []bool{b.Text != nil, b.Reaction != nil, b.Delete != nil, b.ContentType != nil} {
		if set {
			n++
		}
	}
	switch {
	case n != 1 || (b.ReplyTo != nil && b.Text == nil):
		return apppayload.Payload{}, errOneContent
	case b.Text != nil && b.ReplyTo != nil:
		return apppayload.NewReply(b.ReplyTo, apppayload.NewText(*b.Text))
	case b.Text != nil:
		return apppayload.NewText(*b.Text), nil
	case b.Reaction != nil:
		action := apppayload.ReactionAdded
		if b.Reaction.Removed {
			action = apppayload.ReactionRemoved
		}
		return apppayload.NewReaction(apppayload.Reaction{Reference: b.Reaction.Reference, Action: action, Content: b.Reaction.Emoji, Schema: apppayload.SchemaUnicode})
	case b.Delete != nil:
		return apppayload.NewDeletion(b.Delete)
	}
	params := b.Parameters
	if params == nil {
		params = map[string]string{}
	}
	ct := apppayload.ContentType{AuthorityID: b.ContentType.AuthorityID, TypeID: b.ContentType.TypeID, VersionMajor: b.ContentType.VersionMajor}
	return apppayload.Payload{ContentType: ct, Parameters: params, Content: b.Content}, nil
}

func (a *API) addMembers(r *http.Request, _ call, req *bus.OperationRequest) error {
	var b schema.AddMembers
	if err := httpapi.Decode(r, maxBody, &b); err != nil {
		return err
	}
	kps, err := keyPackages(b.KeyPackages, 1)
	if err != nil {
		return err
	}
	req.Kind, req.KeyPackages = schema.OpAddMembers, kps
	return nil
}

func (a *API) removeMember(r *http.Request, _ call, req *bus.OperationRequest) error {
	inbox := r.PathValue("inbox_id")
	if _, err := components.ParseInboxID(inbox); err != nil {
		return refusal.BadRequest("inbox id: %v", err)
	}
	req.Kind, req.InboxID = schema.OpRemoveMember, inbox
	return nil
}

func (a *API) update(r *http.Request, _ call, req *bus.OperationRequest) error {
	var b schema.ConversationChanges
	if err := httpapi.Decode(r, maxBody, &b); err != nil {
		return err
	}
	if _, err := patchedSet(components.Set{}, b); err != nil {
		return err
	}
	if b.Name == nil && b.Description == nil && b.ImageURL == nil && b.DisappearingSecs == nil && b.Admins == nil {
		return refusal.BadRequest("nothing to change: name, description, image_url, disappearing_secs or admins")
	}
	req.Kind, req.Patch = schema.OpUpdateConversation, patch(b)
	return nil
}

func (a *API) simple(kind schema.OperationKind) builder {
	return func(_ *http.Request, _ call, req *bus.OperationRequest) error {
		req.Kind = kind
		return nil
	}
}
