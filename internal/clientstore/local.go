package clientstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/clientstore/outbox"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// LocalMessage is what a client's runtime changed of one message the
// client holds, with the signals package's message signals (issue 26):
// the status of a message this installation sent, when a
// message.status_changed made it other than published, and a deletion at
// an app's request (message.deleted, cause deleted_locally). The read API
// lays it over the group's record of the message.
type LocalMessage struct {
	Status         schema.MessageStatus `msgpack:"s,omitempty"`
	DeletedLocally bool                 `msgpack:"d,omitempty"`
}

// LocalMessages are a client's local changes of one group's messages,
// by message id (its raw bytes as a string).
type LocalMessages map[string]LocalMessage

// GroupSignalsKey is the fabric-stores key that orders a client's signals
// of one group and holds its LocalMessages:
// <tenant>.<client>.signals.group.<sha256(group id)>.
func GroupSignalsKey(tenant, clientID string, groupID []byte) (string, error) {
	d := sha256.Sum256(groupID)
	k, err := subject.Key(tenant, clientID, "signals", "group", hex.EncodeToString(d[:]))
	if err != nil {
		return "", fmt.Errorf("clientstore: group signals key: %w", err)
	}
	return k, nil
}

// localState is the part of a group's signals record the read API reads.
type localState struct {
	Messages LocalMessages `msgpack:"messages,omitempty"`
}

// LocalMessages reads a client's local changes of a group's messages from
// the bucket's leader, so a read after the signal's event sees them
// (EVENT-010: the signal's state and event are one compare-and-set).
func (s *Store) LocalMessages(ctx context.Context, tenant, clientID string, groupID []byte) (LocalMessages, error) {
	key, err := GroupSignalsKey(tenant, clientID, groupID)
	if err != nil {
		return nil, err
	}
	st, _, err := outbox.Get[localState](ctx, s.out, key)
	if err != nil {
		return nil, fmt.Errorf("clientstore: local messages: %w", err)
	}
	return st.Messages, nil
}
