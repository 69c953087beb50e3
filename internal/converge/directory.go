package converge

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/clientstore"
)

// kvDirectory finds hosted clients in fabric-clients.
type kvDirectory struct {
	kv jetstream.KeyValue
}

func (d kvDirectory) ByKeyPackage(ctx context.Context, tenant, refHex string) (string, bool, error) {
	id, err := clientstore.LookupKeyPackage(ctx, d.kv, tenant, refHex)
	if errors.Is(err, clientstore.ErrNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return id, true, nil
}

func (d kvDirectory) Client(ctx context.Context, tenant, clientID string) (Client, error) {
	rec, err := clientstore.Lookup(ctx, d.kv, tenant, clientID)
	if err != nil {
		return Client{}, err
	}
	return Client{Tenant: tenant, ClientID: rec.ClientID, InboxID: rec.InboxID, InstallationKey: rec.InstallationKey, Sealed: rec.Installation}, nil
}
