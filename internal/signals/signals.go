// Package signals accepts the local changes a tenant's runtime reports for
// a hosted client (DESIGN §6): message.status_changed, message.deleted with
// cause deleted_locally, client.rejected_by_server, client.lockout_changed,
// notifications.failed, archive.restored and the attachment.* kinds. Each
// signal is a ClientEvent, validated, refused when convergence or the client
// stores own its kind, and routed to the client's event subject, or for a
// lockout to every client sharing the credential (EVENT-055). The runtime
// reports the state of each app stream instead of connection.state_changed:
// the fabric keeps the client's open streams, computes the client's one
// connection state over them and emits its changes (EVENT-027).
//
// A signal is exactly-once by its Idempotency-Key: the event id derives from
// tenant, client and key, and a repeated key answers what the first request
// answered and emits nothing. Signals of one group, one attachment key, or
// one credential handle are emitted in the order they are accepted
// (EVENT-012, EVENT-057): each goes through one fabric-stores key that
// serializes its writers (package outbox).
package signals

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/clientstore/outbox"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// IdempotencyHeader carries a signal's idempotency key.
const IdempotencyHeader = "Idempotency-Key"

// ReplayedHeader is set to "true" on the answer to a repeated key.
const ReplayedHeader = "Idempotent-Replayed"

// Bounds of a signal request.
const (
	maxBody = 64 << 10
	// MaxIdempotencyKey bounds the key's length.
	MaxIdempotencyKey = 255
	// recentKeys is how many applied keys an ordering record remembers, so
	// a retry after a crash between applying and answering emits nothing.
	recentKeys = 128
)

// Config configures a Service.
type Config struct {
	// JS reaches fabric-clients, fabric-stores and FABRIC_EVENTS.
	JS jetstream.JetStream
	// Verifier checks bearer tokens; signals need the signals scope.
	Verifier *auth.Verifier
	// Logger receives diagnostics; slog.Default when nil.
	Logger *slog.Logger
	// Registerer receives the metrics; none are registered when nil.
	Registerer prometheus.Registerer
}

// Service serves POST /v1/tenants/{tenant}/clients/{client_id}/signals.
type Service struct {
	js      jetstream.JetStream // the read model's records (state.go)
	verify  *auth.Verifier
	log     *slog.Logger
	clients jetstream.KeyValue
	stores  jetstream.KeyValue
	out     *outbox.Outbox
	metrics *metrics
}

// New opens the buckets the service needs.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.JS == nil || cfg.Verifier == nil {
		return nil, errors.New("signals: JS and Verifier are required")
	}
	s := &Service{js: cfg.JS, verify: cfg.Verifier, log: cfg.Logger, metrics: newMetrics(cfg.Registerer)}
	if s.log == nil {
		s.log = slog.Default()
	}
	var err error
	if s.clients, err = cfg.JS.KeyValue(ctx, streams.BucketClients); err != nil {
		return nil, fmt.Errorf("signals: open %s: %w", streams.BucketClients, err)
	}
	if s.stores, err = cfg.JS.KeyValue(ctx, streams.BucketStores); err != nil {
		return nil, fmt.Errorf("signals: open %s: %w", streams.BucketStores, err)
	}
	groups, err := cfg.JS.KeyValue(ctx, streams.BucketGroups)
	if err != nil {
		return nil, fmt.Errorf("signals: open %s: %w", streams.BucketGroups, err)
	}
	s.out = outbox.New(cfg.JS, s.stores, outbox.EventBus(cfg.JS, groups))
	return s, nil
}

// Handler serves the signals endpoint (see Mount).
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	s.Mount(mux)
	return mux
}

// Mount adds POST /v1/tenants/{tenant}/clients/{client_id}/signals and
// …/connection (a stream's state) to mux.
func (s *Service) Mount(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/tenants/{tenant}/clients/{client_id}/signals", s.serveHTTP)
	mux.HandleFunc("POST /v1/tenants/{tenant}/clients/{client_id}/connection", s.serveConnection)
}

// Answer is the answer to a signal.
type Answer struct {
	// Emitted counts the events the signal caused: 1 for most signals, 0
	// for a connection state or lockout state the client already had, one
	// per sharing client for a lockout change.
	Emitted int `json:"emitted" msgpack:"emitted"`
	// Connection, answering a stream report, is the client's connection
	// state over its open streams after the report (EVENT-027).
	Connection schema.ConnectionState `json:"connection,omitempty" msgpack:"connection,omitempty"`
}

// idemRecord is what fabric-stores keeps per idempotency key. It is
// created before the signal is applied, so a key reused for another signal
// is refused even when the first request never answered.
type idemRecord struct {
	// Digest is SHA-256 of the signal's msgpack encoding.
	Digest []byte `msgpack:"digest"`
	// Done is set with Answer once the signal is applied and emitted.
	Done   bool   `msgpack:"done"`
	Answer Answer `msgpack:"answer"`
}

func (s *Service) serveHTTP(w http.ResponseWriter, r *http.Request) {
	kind, ans, replayed, err := s.handle(r)
	s.answer(w, r, kind, ans, replayed, err)
}

// answer writes a request's answer and counts it.
func (s *Service) answer(w http.ResponseWriter, r *http.Request, kind schema.EventKind, ans Answer, replayed bool, err error) {
	if err != nil {
		s.metrics.refusals.WithLabelValues(refusal.Code(err)).Inc()
		httpapi.WriteError(w, r, err)
		return
	}
	result := resultEmitted
	switch {
	case replayed:
		result = resultReplayed
	case ans.Emitted == 0:
		result = resultUnchanged
	}
	s.metrics.accepted.WithLabelValues(string(kind), result).Inc()
	if replayed {
		w.Header().Set(ReplayedHeader, "true")
	}
	httpapi.Write(w, r, http.StatusOK, ans)
}

// handle answers one request; kind is the accepted signal's kind.
func (s *Service) handle(r *http.Request) (kind schema.EventKind, ans Answer, replayed bool, err error) {
	ctx := r.Context()
	t, err := clientstore.Authorize(r, s.verify, auth.ScopeSignals)
	if err != nil {
		return "", Answer{}, false, err
	}
	key := r.Header.Get(IdempotencyHeader)
	if err := checkIdempotencyKey(key); err != nil {
		return "", Answer{}, false, err
	}
	ev, err := decodeSignal(r)
	if err != nil {
		return "", Answer{}, false, err
	}
	client, err := s.lookup(ctx, t)
	if err != nil {
		return "", Answer{}, false, err
	}
	ans, replayed, err = s.Report(ctx, client, key, ev)
	return ev.Kind, ans, replayed, err
}

// lookup loads the client a request names; 404 when the tenant has none.
func (s *Service) lookup(ctx context.Context, t clientstore.Target) (clientstore.Record, error) {
	client, err := clientstore.Lookup(ctx, s.clients, t.Tenant, t.ClientID)
	if errors.Is(err, clientstore.ErrNotFound) {
		return clientstore.Record{}, clientstore.ErrUnknownClient
	}
	return client, err
}

// checkIdempotencyKey checks the header: 1 to MaxIdempotencyKey visible
// ASCII characters.
func checkIdempotencyKey(key string) error {
	if key == "" {
		return refusal.BadRequest("%s header is required", IdempotencyHeader)
	}
	if len(key) > MaxIdempotencyKey {
		return refusal.BadRequest("%s is longer than %d characters", IdempotencyHeader, MaxIdempotencyKey)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return refusal.BadRequest("%s holds a character outside visible ASCII", IdempotencyHeader)
		}
	}
	return nil
}

// decodeSignal reads the body as a ClientEvent (msgpack or JSON, strict),
// validates it and checks that its kind is a signal.
func decodeSignal(r *http.Request) (schema.ClientEvent, error) {
	body, err := httpapi.ReadBody(r, maxBody)
	if err != nil {
		return schema.ClientEvent{}, err
	}
	return parseSignal(body, httpapi.IsMsgpack(r))
}

// parseSignal decodes and checks a signal body. Errors are refusals:
// refusal.ErrBadRequest for bytes that do not decode, ErrInvalidEvent for an
// event the contract refuses, ErrKindNotSignal for a kind that is not a
// signal.
func parseSignal(body []byte, isMsgpack bool) (schema.ClientEvent, error) {
	var (
		ev  schema.ClientEvent
		err error
	)
	if len(body) == 0 {
		return ev, refusal.BadRequest("empty body")
	}
	if isMsgpack {
		err = ev.UnmarshalMsgpack(body)
	} else {
		err = ev.UnmarshalJSON(body)
	}
	var ve *schema.ValidationError
	switch {
	case errors.As(err, &ve):
		return ev, ErrInvalidEvent.Because(err)
	case err != nil:
		return ev, refusal.BadRequest("%v", err)
	}
	// The decoders validate; validate again so that nothing depends on it.
	if err := ev.Validate(); err != nil {
		return ev, ErrInvalidEvent.Because(err)
	}
	if e := refuseKind(ev); e != nil {
		return ev, e
	}
	return ev, nil
}

// Report applies a signal of client under an idempotency key and emits its
// events. replayed is true when the key was seen before; the answer is then
// the first one and nothing is emitted. An invalid event or a kind that is
// not a signal is ErrInvalidEvent or ErrKindNotSignal.
func (s *Service) Report(ctx context.Context, client clientstore.Record, key string, ev schema.ClientEvent) (ans Answer, replayed bool, err error) {
	if err := ev.Validate(); err != nil {
		return Answer{}, false, ErrInvalidEvent.Because(err)
	}
	if e := refuseKind(ev); e != nil {
		return Answer{}, false, e
	}
	body, err := ev.MarshalMsgpack()
	if err != nil {
		return Answer{}, false, fmt.Errorf("signals: encode: %w", err)
	}
	return s.once(ctx, client, key, body, func(keyDigest string) (Answer, bool, error) {
		return s.apply(ctx, client, keyDigest, ev)
	})
}

// once applies a request of client, whose msgpack body is body, at most
// once per idempotency key: a repeated key answers the first answer, a key
// held for another body is a 422.
func (s *Service) once(ctx context.Context, client clientstore.Record, key string, body []byte,
	apply func(keyDigest string) (Answer, bool, error)) (ans Answer, replayed bool, err error) {
	digest := sha256.Sum256(body)
	keyDigest := digestHex(key)
	ikey, err := subject.Key(client.Tenant, client.ClientID, "signal", keyDigest)
	if err != nil {
		return Answer{}, false, fmt.Errorf("signals: key: %w", err)
	}
	rec, err := s.claimKey(ctx, ikey, digest[:])
	if err != nil {
		return Answer{}, false, err
	}
	if rec.Done {
		return rec.Answer, true, nil
	}
	// A new key, the retry of a request that did not finish, or a
	// concurrent twin: the ordering record applies each key once.
	ans, replayed, err = apply(keyDigest)
	if err != nil {
		return Answer{}, false, emitError(err)
	}
	b, err := msgpack.Marshal(idemRecord{Digest: digest[:], Done: true, Answer: ans})
	if err != nil {
		return Answer{}, false, fmt.Errorf("signals: encode idempotency record: %w", err)
	}
	if _, err := s.stores.Put(ctx, ikey, b); err != nil {
		return Answer{}, false, fmt.Errorf("signals: store idempotency record: %w", err)
	}
	return ans, replayed, nil
}

// claimKey creates the idempotency record of a key for a signal, or loads
// the one that exists. A key held for another signal is a 422.
func (s *Service) claimKey(ctx context.Context, ikey string, digest []byte) (idemRecord, error) {
	b, err := msgpack.Marshal(idemRecord{Digest: digest})
	if err != nil {
		return idemRecord{}, fmt.Errorf("signals: encode idempotency record: %w", err)
	}
	_, err = s.stores.Create(ctx, ikey, b)
	if err == nil {
		return idemRecord{Digest: digest}, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return idemRecord{}, fmt.Errorf("signals: store idempotency record: %w", err)
	}
	rec, found, err := s.loadIdem(ctx, ikey)
	if err != nil {
		return idemRecord{}, err
	}
	if !found {
		return idemRecord{}, clientstore.ErrContention.With("the idempotency record changed, retry")
	}
	if string(rec.Digest) != string(digest) {
		return idemRecord{}, ErrIdempotencyKeyReused
	}
	return rec, nil
}

func (s *Service) loadIdem(ctx context.Context, key string) (idemRecord, bool, error) {
	e, err := s.stores.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return idemRecord{}, false, nil
	}
	if err != nil {
		return idemRecord{}, false, fmt.Errorf("signals: load idempotency record: %w", err)
	}
	var rec idemRecord
	if err := schema.UnmarshalMsgpack(e.Value(), &rec); err != nil {
		return idemRecord{}, false, fmt.Errorf("signals: decode idempotency record: %w", err)
	}
	return rec, true, nil
}

// orderState is what an ordering record in fabric-stores holds: the keys
// it applied lately with their answers, and for the client-wide and
// lockout records the state that decides whether a report is a change.
type orderState struct {
	Recent []recent `msgpack:"recent,omitempty"`
	// Streams are the client's open streams and their states; Connection
	// is the state computed over them, the one the client holds (EVENT-027).
	Streams    map[string]schema.ConnectionState `msgpack:"streams,omitempty"`
	Connection schema.ConnectionState            `msgpack:"connection,omitempty"`
	Lockout    schema.LockoutChange              `msgpack:"lockout,omitempty"`
	// Messages, in a group's record, are the client's local changes of
	// the group's messages, which the read API lays over their records.
	Messages clientstore.LocalMessages `msgpack:"messages,omitempty"`
	// Upload and Downloading, in an attachment key's record, are its
	// upload status and whether a download of it runs.
	Upload      string `msgpack:"upload,omitempty"`
	Downloading bool   `msgpack:"downloading,omitempty"`
}

type recent struct {
	Key        string                 `msgpack:"key"`
	Emitted    int                    `msgpack:"emitted"`
	Connection schema.ConnectionState `msgpack:"connection,omitempty"`
}

// apply stores the signal in its ordering record and emits its events.
func (s *Service) apply(ctx context.Context, client clientstore.Record, keyDigest string, ev schema.ClientEvent) (Answer, bool, error) {
	okey, err := orderKey(client, ev)
	if err != nil {
		return Answer{}, false, err
	}
	var targets []string
	if ev.Kind == schema.KindLockoutChanged {
		if targets, err = clientstore.SharingCredential(ctx, s.clients, client.Tenant, client.CredentialHandle); err != nil {
			return Answer{}, false, err
		}
		if !slices.Contains(targets, client.ClientID) {
			targets = append(targets, client.ClientID)
		}
		slices.Sort(targets)
	}
	facts, err := s.factsOf(ctx, client, ev)
	if err != nil {
		return Answer{}, false, err
	}
	var ans Answer
	var replayed bool
	_, _, err = outbox.Apply(ctx, s.out, okey, func(cur orderState, found bool) (outbox.Change[orderState], error) {
		ans, replayed = Answer{}, false
		if r, ok := cur.replay(keyDigest); ok {
			ans, replayed = r, true
			return outbox.Change[orderState]{State: cur}, nil
		}
		next := cur
		var events []outbox.Event
		id := func(target string) string {
			return outbox.ID(client.Tenant, client.ClientID, "signal", keyDigest, target)
		}
		switch ev.Kind {
		case schema.KindLockoutChanged:
			held := cur.Lockout
			if held == "" {
				held = schema.LockoutLeft
			}
			if held != ev.LockoutChanged.Change {
				next.Lockout = ev.LockoutChanged.Change
				for _, t := range targets { // EVENT-055
					events = append(events, outbox.Event{Tenant: client.Tenant, ClientID: t, ID: id(t), Event: ev})
				}
			}
		case schema.KindMessageStatusChanged, schema.KindMessageDeleted:
			msgs, err := checkMessage(ev, facts, cur.Messages)
			if err != nil {
				return outbox.Change[orderState]{}, err
			}
			next.Messages = msgs
			events = append(events, outbox.Event{Tenant: client.Tenant, ClientID: client.ClientID, ID: id(client.ClientID), Event: ev})
		default:
			emit := true
			if signalKinds[ev.Kind] == routeAttachment {
				var err error
				if emit, err = checkAttachment(ev, &next); err != nil {
					return outbox.Change[orderState]{}, err
				}
			}
			if emit {
				events = append(events, outbox.Event{Tenant: client.Tenant, ClientID: client.ClientID, ID: id(client.ClientID), Event: ev})
			}
		}
		ans = Answer{Emitted: len(events)}
		next.remember(keyDigest, ans)
		return outbox.Change[orderState]{State: next, Store: true, Events: events}, nil
	})
	return ans, replayed, err
}

// orderKey is the fabric-stores key that orders a signal: per group, per
// attachment key, per client, or per credential handle. Free-text ids are
// hashed so any value makes a valid key.
func orderKey(client clientstore.Record, ev schema.ClientEvent) (string, error) {
	var (
		k   string
		err error
	)
	switch signalKinds[ev.Kind] {
	case routeGroup:
		g, _ := ev.GroupID()
		k, err = clientstore.GroupSignalsKey(client.Tenant, client.ClientID, g)
	case routeAttachment:
		k, err = subject.Key(client.Tenant, client.ClientID, "signals", "attachment", digestHex(attachmentKey(ev)))
	case routeLockout:
		k, err = subject.Key(client.Tenant, "lockout", digestHex(client.CredentialHandle))
	default:
		k, err = subject.Key(client.Tenant, client.ClientID, "signals", "client")
	}
	if err != nil {
		return "", fmt.Errorf("signals: order key: %w", err)
	}
	return k, nil
}

// attachmentKey is the attachment_key of an attachment.* event.
func attachmentKey(ev schema.ClientEvent) string {
	for _, r := range []*schema.AttachmentRef{ev.AttachmentUploadStarted, ev.AttachmentUploadCompleted,
		ev.AttachmentDownloadStarted, ev.AttachmentDownloadCompleted, ev.AttachmentDeleted} {
		if r != nil {
			return r.AttachmentKey
		}
	}
	for _, f := range []*schema.AttachmentFailed{ev.AttachmentUploadFailed, ev.AttachmentDownloadFailed} {
		if f != nil {
			return f.AttachmentKey
		}
	}
	return ""
}

func digestHex(s string) string {
	d := sha256.Sum256([]byte(s))
	return hex.EncodeToString(d[:])
}

// emitError maps an outbox failure to an answer.
func emitError(err error) error {
	switch {
	case errors.Is(err, outbox.ErrEmit):
		return clientstore.ErrEmitPending.With("the signal is stored; its event is not emitted yet, retry with the same %s", IdempotencyHeader)
	case errors.Is(err, outbox.ErrContention):
		return clientstore.ErrContention.With("the ordering record changed under every attempt, retry")
	}
	return err
}
