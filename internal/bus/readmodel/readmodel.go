// Package readmodel is the readable state of hosted clients (EVENT-010,
// docs/read-api.md): the records converge writes in the atomic batch of
// each group's events, and the read API serves. It names their subjects,
// defines their stored form, and seals message content at rest under a
// per-tenant key.
//
// Every record lives in FABRIC_EVENTS beside the group's checkpoint, on
// fabric.ck.>, because an atomic batch is per stream: a record is stored
// in the same committed batch as the events that report its change, so a
// read issued once an event arrived sees that change. Records carry
// Nats-TTL: never (MaxAge does not remove them) and are replaced by a
// rollup of their subject.
package readmodel

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
)

// Tokens after fabric.ck.<tenant>.<group> (or .<tenant>) of each record.
// None is a lowercase hex string, so none collides with a group id.
const (
	messageToken      = "r"
	conversationToken = "cv"
	membersToken      = "mb"
	pointerToken      = "id"
	siblingToken      = "dm"
)

// MessageSubject is the subject of a group's message record of delivery
// number n: fabric.ck.<tenant>.<group>.r.<n>.
func MessageSubject(tenant, groupHex string, n uint64) (string, error) {
	ck, err := subject.Checkpoint(tenant, groupHex)
	if err != nil {
		return "", err
	}
	return ck + "." + messageToken + "." + strconv.FormatUint(n, 10), nil
}

// ConversationSubject is the subject of one client's conversation record
// of a group: fabric.ck.<tenant>.cv.<client>.<group>, the client first, so
// a client's records share a literal prefix.
func ConversationSubject(tenant, groupHex, clientHex string) (string, error) {
	f, err := ConversationFilter(tenant, clientHex)
	if err != nil {
		return "", err
	}
	if err := subject.ValidGroup(groupHex); err != nil {
		return "", err
	}
	return strings.TrimSuffix(f, "*") + groupHex, nil
}

// ConversationFilter matches every conversation record of one client.
func ConversationFilter(tenant, clientHex string) (string, error) {
	if err := subject.ValidTenant(tenant); err != nil {
		return "", err
	}
	if err := subject.ValidClient(clientHex); err != nil {
		return "", err
	}
	return "fabric.ck." + tenant + "." + conversationToken + "." + clientHex + ".*", nil
}

// MembersSubject is the subject of a group's members record:
// fabric.ck.<tenant>.<group>.mb.
func MembersSubject(tenant, groupHex string) (string, error) {
	ck, err := subject.Checkpoint(tenant, groupHex)
	if err != nil {
		return "", err
	}
	return ck + "." + membersToken, nil
}

// PointerSubject is where a message id points at its group and delivery
// number: fabric.ck.<tenant>.id.<message id>.
func PointerSubject(tenant string, msgID []byte) (string, error) {
	h := hex.EncodeToString(msgID)
	if err := subject.ValidTenant(tenant); err != nil {
		return "", err
	}
	if err := subject.ValidMessageID(h); err != nil {
		return "", err
	}
	return "fabric.ck." + tenant + "." + pointerToken + "." + h, nil
}

// SiblingSubject is where a client's group of a DM is listed under the
// DM's conversation key, so the other groups of a stitched DM are found
// (EVENT-020): fabric.ck.<tenant>.dm.<key>.<client>.<group>.
func SiblingSubject(tenant string, dmKey []byte, clientHex, groupHex string) (string, error) {
	f, err := SiblingFilter(tenant, dmKey, clientHex)
	if err != nil {
		return "", err
	}
	if err := subject.ValidGroup(groupHex); err != nil {
		return "", err
	}
	return strings.TrimSuffix(f, "*") + groupHex, nil
}

// SiblingFilter matches every group of a DM a client holds.
func SiblingFilter(tenant string, dmKey []byte, clientHex string) (string, error) {
	k := hex.EncodeToString(dmKey)
	if err := subject.ValidTenant(tenant); err != nil {
		return "", err
	}
	if err := subject.ValidGroup(k); err != nil {
		return "", err
	}
	if err := subject.ValidClient(clientHex); err != nil {
		return "", err
	}
	return "fabric.ck." + tenant + "." + siblingToken + "." + k + "." + clientHex + ".*", nil
}

// RecordMsg is the message that stores record v on subj: msgpack, a
// rollup of the subject (it replaces the record before it) that never
// expires with the stream's MaxAge.
func RecordMsg(subj string, v any) (*nats.Msg, error) { return RecordMsgTTL(subj, v, 0, true) }

// RecordMsgTTL is RecordMsg for a record the stream removes ttl after it
// is stored (whole seconds; 0 never), a rollup of its subject only when
// replaces: a record on a new subject has nothing to replace, and the
// stream does less to store it.
func RecordMsgTTL(subj string, v any, ttl time.Duration, replaces bool) (*nats.Msg, error) {
	b, err := encode(v)
	if err != nil {
		return nil, fmt.Errorf("readmodel: encode record: %w", err)
	}
	never := neverTTL
	if s := int64(ttl / time.Second); s > 0 {
		never = []string{strconv.FormatInt(s, 10) + "s"}
	}
	h := nats.Header{jetstream.MsgTTLHeader: never}
	if replaces {
		h[jetstream.MsgRollup] = rollupSubject
	}
	return &nats.Msg{Subject: subj, Header: h, Data: b}, nil
}

// The header values of every record, shared, not made per record: a
// value is only read (an added value is appended to a copy: capacity 1).
var (
	neverTTL      = []string{streams.CheckpointTTL}
	rollupSubject = []string{jetstream.MsgRollupSubject}
)

// recordSize is room for one record's encoding: a message's record with
// its content is a few hundred bytes.
const recordSize = 512

// encode is msgpack.Marshal into a buffer sized for a record, so the
// encoding does not grow it several times.
func encode(v any) ([]byte, error) {
	buf := bytes.NewBuffer(make([]byte, 0, recordSize))
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	enc.Reset(buf)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
