package bus

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// GroupRecord is the value of a group's fabric-groups entry
// (<tenant>.<group>), written by converge: its active hosted members and,
// for a DM, its conversation key. Ingest routes a group's input while it
// names a member; fanout and the outbox take the conversation key from it
// (EVENT-020). CheckpointSeq orders writes: a record is replaced only by one
// of a newer checkpoint.
type GroupRecord struct {
	Members           []string `msgpack:"members"`
	DMConversationKey []byte   `msgpack:"dm_conversation_key,omitempty"`
	CheckpointSeq     uint64   `msgpack:"checkpoint_seq"`
}

// RecordConversationKey returns the stitched-DM conversation key a
// fabric-groups record holds, nil for a group that is no DM's. Other
// members of the record are ignored.
func RecordConversationKey(record []byte) ([]byte, error) {
	var rec GroupRecord
	if err := schema.UnmarshalMsgpack(record, &rec); err != nil {
		return nil, fmt.Errorf("bus: decode group record: %w", err)
	}
	if len(rec.DMConversationKey) == 0 {
		return nil, nil
	}
	if len(rec.DMConversationKey) > MaxConversationKeyLen {
		return nil, errors.New("bus: group record: conversation key too long")
	}
	return rec.DMConversationKey, nil
}

// ConversationKeyOf reads the conversation key of group from its record in
// groups (the fabric-groups bucket), so an event that names the group and is
// not made by converge carries the Fabric-Conversation-Key header as
// converge's events do (EVENT-020). nil when the group has no record or is
// no DM's.
func ConversationKeyOf(ctx context.Context, groups jetstream.KeyValue, tenant string, group []byte) ([]byte, error) {
	key, err := subject.GroupKey(tenant, hex.EncodeToString(group))
	if err != nil {
		return nil, invalidEvent("event", err)
	}
	e, err := groups.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bus: read group record: %w", err)
	}
	return RecordConversationKey(e.Value())
}

// WithConversationKey sets ev.ConversationKey from groups when ev names a
// group (see ConversationKeyOf).
func WithConversationKey(ctx context.Context, groups jetstream.KeyValue, ev Event) (Event, error) {
	if ev.Event == nil {
		return ev, nil // Publish refuses it
	}
	g, ok := ev.Event.GroupID()
	if !ok || len(ev.ConversationKey) > 0 {
		return ev, nil
	}
	k, err := ConversationKeyOf(ctx, groups, ev.Tenant, g)
	if err != nil {
		return ev, err
	}
	ev.ConversationKey = k
	return ev, nil
}
