package readmodel

import (
	"context"
	"encoding/hex"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// LoadConversation reads one client's conversation record of a group from
// the stream leader; nil when the client never held the group.
func LoadConversation(ctx context.Context, js jetstream.JetStream, tenant, groupHex, clientHex string) (*Conversation, error) {
	subj, err := ConversationSubject(tenant, groupHex, clientHex)
	if err != nil {
		return nil, err
	}
	st, err := Last(ctx, js, subj)
	if err != nil || st.Seq == 0 || len(st.Data) == 0 {
		return nil, err
	}
	var rec Conversation
	if err := schema.UnmarshalMsgpack(st.Data, &rec); err != nil {
		return nil, fmt.Errorf("readmodel: decode conversation: %w", err)
	}
	return &rec, nil
}

// HeldMessage reads the record of message id as the client holds it,
// with the client's conversation record of its group, from the stream
// leader. Both are nil when the client does not hold the message: none was
// delivered under that id, the client never held its group, or it was
// delivered before the client joined or after it left.
func HeldMessage(ctx context.Context, js jetstream.JetStream, tenant, clientHex string, id []byte) (*Message, *Conversation, error) {
	ps, err := PointerSubject(tenant, id)
	if err != nil {
		return nil, nil, err
	}
	st, err := Last(ctx, js, ps)
	if err != nil || st.Seq == 0 || len(st.Data) == 0 {
		return nil, nil, err
	}
	var ptr Pointer
	if err := schema.UnmarshalMsgpack(st.Data, &ptr); err != nil {
		return nil, nil, fmt.Errorf("readmodel: decode pointer: %w", err)
	}
	g := hex.EncodeToString(ptr.GroupID)
	conv, err := LoadConversation(ctx, js, tenant, g, clientHex)
	if err != nil || conv == nil {
		return nil, nil, err
	}
	ms, err := MessageSubject(tenant, g, ptr.N)
	if err != nil {
		return nil, nil, err
	}
	if st, err = Last(ctx, js, ms); err != nil || st.Seq == 0 || len(st.Data) == 0 {
		return nil, nil, err
	}
	var rec Message
	if err := schema.UnmarshalMsgpack(st.Data, &rec); err != nil {
		return nil, nil, fmt.Errorf("readmodel: decode message: %w", err)
	}
	if !conv.Holds(&rec) || (conv.FirstN != 0 && rec.N < conv.FirstN) {
		return nil, nil, nil
	}
	return &rec, conv, nil
}
