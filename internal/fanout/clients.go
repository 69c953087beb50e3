package fanout

import (
	"context"
	"fmt"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
)

// clientExists reports whether tenant has a hosted client with this id: a
// subscription for any other client would wait for events that can never
// come, so it is refused with unknown_client. The record is read by a
// direct get and not decoded (its private parts are sealed); a deleted
// record is no client. A direct get may be answered by a replica behind
// the write that registered the client just before, so no record there is
// asked again of the bucket's leader before the refusal.
func (g *Gateway) clientExists(ctx context.Context, tenant, client string) (bool, error) {
	key, err := subject.ClientKey(tenant, client)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.RequestTimeout)
	defer cancel()
	if _, ok, err := bus.KVGet(ctx, g.cfg.JetStream, streams.BucketClients, key); ok || err != nil {
		return ok, err
	}
	_, _, ok, err := bus.KVGetLeader(ctx, g.cfg.JetStream, streams.BucketClients, key)
	if err != nil {
		return false, fmt.Errorf("fanout: read client record from the leader: %w", err)
	}
	return ok, nil
}
