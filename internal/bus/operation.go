package bus

// Operations: what a hosted client is asked to send (issue 19). The API
// stores the request on the group's input subject, so that one group's
// operations are serialized with its input and converge executes each once,
// in its fenced transaction; operation records on fabric.op.<tenant>.<id>
// say how it went; what it sends is stored on fabric.out.<tenant>.<group>
// (docs/outbound.md).

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// ClassOperation is the input class of an operation on
// fabric.in.<tenant>.<group>.<operation_id> (header Fabric-Class): not an
// MLS input.
const ClassOperation schema.InputClass = "operation"

// operationVersion is the request format's version.
const operationVersion = 1

// OperationRequest is one operation as stored on the group's input subject (msgpack,
// docs/outbound.md).
type OperationRequest struct {
	V        int                  `msgpack:"v"`
	ID       []byte               `msgpack:"id"`
	Kind     schema.OperationKind `msgpack:"kind"`
	ClientID string               `msgpack:"client_id"`
	GroupID  []byte               `msgpack:"group_id"`
	// Components is the components extension body (internal/components)
	// a create sets.
	Components []byte `msgpack:"components,omitempty"`
	// Patch is what an update changes in the group's components, applied
	// to the components the member holds when the operation runs.
	Patch *ComponentsPatch `msgpack:"patch,omitempty"`
	// Payload is the app payload a send encrypts (internal/apppayload).
	Payload []byte `msgpack:"payload,omitempty"`
	// KeyPackages are the members an add (or a create) adds.
	KeyPackages [][]byte `msgpack:"key_packages,omitempty"`
	// InboxID is the inbox a remove removes.
	InboxID string `msgpack:"inbox_id,omitempty"`
	// Time is when the request was accepted (unix ms).
	Time int64 `msgpack:"time"`
}

// ComponentsPatch changes some components of a group; a nil field is kept.
type ComponentsPatch struct {
	Name             *string `msgpack:"name,omitempty"`
	Description      *string `msgpack:"description,omitempty"`
	ImageURL         *string `msgpack:"image_url,omitempty"`
	DisappearingSecs *uint64 `msgpack:"disappearing_secs,omitempty"`
	// Admins replaces the admin list (inbox ids) when not nil.
	Admins []string `msgpack:"admins,omitempty"`
}

// ErrMalformedOperation is the error of a request that does not decode.
var ErrMalformedOperation = errors.New("bus: malformed operation request")

// idLabel separates operation ids from every other hash the fabric takes.
const idLabel = "fabric/operation/v1"

// OperationID is the operation id of an idempotency key: SHA-256 of a
// label, the tenant, the client, the key and the scope, each followed by a
// NUL, so the same key from the same client in the same scope is the same
// operation (and the same input subject: stored once). The API scopes a
// key by the operation's kind and the route's group id, lowercase hex
// (empty for a create): the same key on another route or group is another
// operation (issue 26).
func OperationID(tenant, clientID, idempotencyKey string, scope ...string) []byte {
	h := sha256.New()
	for _, s := range append([]string{idLabel, tenant, clientID, idempotencyKey}, scope...) {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return h.Sum(nil)
}

// SendOverhead bounds what the fabric adds to a send's app payload on the
// largest message it stores for it: the outbound message (MLS framing, the
// signature and AEAD tag of the private message, sealing under the group
// event key, the transport envelope and its headers), which ingest must
// take back as a transport payload with its own headroom of 1 KiB and a
// group id, and the events and records of the group's other hosted
// members. docs/outbound.md has the measured sizes.
const SendOverhead = 4096

// MaxSendPayload is the largest app payload a send may carry on a server
// whose max_payload is maxPayload (nats.Conn.MaxPayload).
func MaxSendPayload(maxPayload int64) int {
	return max(int(maxPayload)-SendOverhead, 0)
}

// OperationGroupID is the group id a create operation makes: derived from the
// operation id, so a retried create names the same group.
func OperationGroupID(opID []byte) []byte {
	h := sha256.Sum256(append([]byte("fabric/operation/group/v1\x00"), opID...))
	return h[:]
}

// EncodeOperation returns the request's msgpack; it sets the version.
func EncodeOperation(r OperationRequest) ([]byte, error) {
	r.V = operationVersion
	b, err := msgpack.Marshal(&r)
	if err != nil {
		return nil, fmt.Errorf("bus: encode operation: %w", err)
	}
	return b, nil
}

// DecodeOperation reads a request, strictly: unknown fields, another
// version, an unknown kind, or ids of the wrong form are
// ErrMalformedOperation.
func DecodeOperation(b []byte) (OperationRequest, error) {
	var r OperationRequest
	dec, err := schema.NewMsgpackDecoder(b)
	if err != nil {
		return OperationRequest{}, fmt.Errorf("%w: %v", ErrMalformedOperation, err)
	}
	dec.DisallowUnknownFields(true)
	if err := dec.Decode(&r); err != nil {
		return OperationRequest{}, fmt.Errorf("%w: %v", ErrMalformedOperation, err)
	}
	switch {
	case r.V != operationVersion:
		return OperationRequest{}, fmt.Errorf("%w: version %d", ErrMalformedOperation, r.V)
	case len(r.ID) != sha256.Size:
		return OperationRequest{}, fmt.Errorf("%w: operation id", ErrMalformedOperation)
	case !r.Kind.Valid():
		return OperationRequest{}, fmt.Errorf("%w: kind", ErrMalformedOperation)
	case subject.ValidClient(r.ClientID) != nil:
		return OperationRequest{}, fmt.Errorf("%w: client id", ErrMalformedOperation)
	case len(r.GroupID) == 0 || subject.ValidGroup(hex.EncodeToString(r.GroupID)) != nil:
		return OperationRequest{}, fmt.Errorf("%w: group id", ErrMalformedOperation)
	}
	return r, nil
}

// HeaderOperationID is set on a message of fabric.out.<tenant>.<group>
// beside HeaderMessageID and HeaderClass: the operation that produced it,
// lowercase hex.
const HeaderOperationID = "Fabric-Operation-Id"

// OperationRecordMsg is the message that stores an operation record on
// fabric.op.<tenant>.<operation_id>.
func OperationRecordMsg(tenant string, rec schema.Operation) (*nats.Msg, error) {
	subj, err := subject.Operation(tenant, hex.EncodeToString(rec.ID))
	if err != nil {
		return nil, err
	}
	b, err := msgpack.Marshal(&rec)
	if err != nil {
		return nil, fmt.Errorf("bus: encode operation record: %w", err)
	}
	m := nats.NewMsg(subj)
	m.Data = b
	return m, nil
}

// DecodeOperationRecord reads a stored operation record.
func DecodeOperationRecord(b []byte) (schema.Operation, error) {
	var rec schema.Operation
	if err := schema.UnmarshalMsgpack(b, &rec); err != nil {
		return schema.Operation{}, fmt.Errorf("bus: decode operation record: %w", err)
	}
	return rec, nil
}

// Record returns the record of r at a status.
func (r OperationRequest) Record(status schema.OperationStatus, at time.Time) schema.Operation {
	return schema.Operation{ID: r.ID, Kind: r.Kind, ClientID: r.ClientID, GroupID: r.GroupID, Status: status, Time: at.UTC()}
}
