package outbox

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/eventbus"
)

// EventBus returns a PublishFunc that publishes with eventbus.Publish: to
// the client's subject on FABRIC_EVENTS, the event id as Nats-Msg-Id.
func EventBus(js jetstream.JetStream) PublishFunc {
	return func(ctx context.Context, ev Event) error {
		_, err := eventbus.Publish(ctx, js, eventbus.Event{
			Tenant:   ev.Tenant,
			ClientID: ev.ClientID,
			ID:       ev.ID,
			Event:    ev.Event,
		})
		return err
	}
}
