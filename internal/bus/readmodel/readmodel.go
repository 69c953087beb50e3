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
	"encoding/hex"
	"strconv"

	"github.com/fabric-mls/fabric/internal/bus/subject"
)

// Tokens after fabric.ck.<tenant>.<group> (or .<tenant>) of each record.
// None is a lowercase hex string, so none collides with a group id.
const (
	messageToken      = "r"
	conversationToken = "c"
	membersToken      = "mb"
	pointerToken      = "id"
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
// of a group: fabric.ck.<tenant>.<group>.c.<client>.
func ConversationSubject(tenant, groupHex, clientHex string) (string, error) {
	ck, err := subject.Checkpoint(tenant, groupHex)
	if err != nil {
		return "", err
	}
	if err := subject.ValidClient(clientHex); err != nil {
		return "", err
	}
	return ck + "." + conversationToken + "." + clientHex, nil
}

// ConversationFilter matches every conversation record of one client.
func ConversationFilter(tenant, clientHex string) (string, error) {
	if err := subject.ValidTenant(tenant); err != nil {
		return "", err
	}
	if err := subject.ValidClient(clientHex); err != nil {
		return "", err
	}
	return "fabric.ck." + tenant + ".*." + conversationToken + "." + clientHex, nil
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
