package outbox

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
)

// EventBus returns a PublishFunc that publishes with bus.Publish: to
// the client's subject on FABRIC_EVENTS, the event id as Nats-Msg-Id. An
// event that names a group of a stitched DM carries the DM's conversation
// key, read from groups (the fabric-groups bucket) when it is published, so
// a filter naming another group of the DM selects it (EVENT-020).
func EventBus(js jetstream.JetStream, groups jetstream.KeyValue) PublishFunc {
	return func(ctx context.Context, ev Event) error {
		bev, err := bus.WithConversationKey(ctx, groups, bus.Event{
			Tenant:   ev.Tenant,
			ClientID: ev.ClientID,
			ID:       ev.ID,
			Event:    &ev.Event,
		})
		if err != nil {
			return err
		}
		_, err = bus.Publish(ctx, js, bev)
		return err
	}
}
