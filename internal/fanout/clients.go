package fanout

import (
	"context"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
)

// clientExists reports whether tenant has a hosted client with this id: a
// subscription for any other client would wait for events that can never
// come, so it is refused with unknown_client. The record is read by a
// direct get and not decoded (its private parts are sealed); a deleted
// record is no client.
func (g *Gateway) clientExists(ctx context.Context, tenant, client string) (bool, error) {
	key, err := subject.ClientKey(tenant, client)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.RequestTimeout)
	defer cancel()
	_, ok, err := bus.KVGet(ctx, g.cfg.JetStream, streams.BucketClients, key)
	return ok, err
}
