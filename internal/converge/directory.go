package converge

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/engine"
)

// kvDirectory finds hosted clients in fabric-clients, and retires the
// KeyPackages their joins used.
type kvDirectory struct {
	kv    jetstream.KeyValue
	vault *engine.Vault // nil without EngineMLS: nothing to retire
	pool  int           // Config.KeyPackagePool
}

func (d kvDirectory) consumeKeyPackage(ctx context.Context, tenant, clientID string, ref []byte) error {
	if d.vault == nil {
		return nil
	}
	if err := clientstore.ConsumeKeyPackage(ctx, d.kv, d.vault, tenant, clientID, ref, d.pool); err != nil {
		return fmt.Errorf("retire key package: %w", err)
	}
	return nil
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
