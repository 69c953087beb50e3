package outbox

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/subject"
)

// EventBus returns a PublishFunc that publishes to the client's event
// subject on FABRIC_EVENTS with the event id as Nats-Msg-Id.
func EventBus(js jetstream.JetStream) PublishFunc {
	return func(ctx context.Context, ev Event) error {
		subj, err := subject.Events(ev.Tenant, ev.ClientID)
		if err != nil {
			return fmt.Errorf("outbox: publish: %w", err)
		}
		body, err := ev.Event.MarshalMsgpack()
		if err != nil {
			return fmt.Errorf("outbox: encode event: %w", err)
		}
		m := &nats.Msg{Subject: subj, Header: nats.Header{}, Data: body}
		m.Header.Set(jetstream.MsgIDHeader, ev.ID)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			return fmt.Errorf("outbox: publish: %w", err)
		}
		return nil
	}
}
