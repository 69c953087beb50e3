package fanout

import (
	"context"
	"errors"

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
	m, err := g.direct(ctx, "$JS.API.DIRECT.GET.KV_"+streams.BucketClients+".$KV."+streams.BucketClients+"."+key, nil)
	if errors.Is(err, errNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	op := m.Header.Get("KV-Operation")
	return op != "DEL" && op != "PURGE", nil
}
