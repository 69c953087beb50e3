package clientstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/engine"
)

// DefaultKeyPackagePool is how many unconsumed KeyPackages a hosted client
// holds again after a join consumed one: as many as a registration hands
// out by default.
const DefaultKeyPackagePool = DefaultKeyPackages

// ConsumeKeyPackage retires a KeyPackage a stored join used (Marmot
// joining.md steps 11–12): its private keys leave the client's sealed
// installation, by compare-and-set on the record, and its index entry
// goes, so the same KeyPackage neither opens nor routes another Welcome.
// In the same record change the pool refills itself (issue 19): when the
// client holds fewer than pool KeyPackages, fresh ones are made, indexed
// and kept, and GET …/key-packages lists them. It is idempotent: a
// KeyPackage already gone, or a client removed, is done, and makes none.
// Converge calls it after the join's batch is stored, and again on a retry
// of that transaction.
func ConsumeKeyPackage(ctx context.Context, kv jetstream.KeyValue, vault *engine.Vault, tenant, clientID string, ref []byte, pool int) error {
	key, err := recordKey(tenant, clientID)
	if err != nil {
		return fmt.Errorf("clientstore: consume key package: %w", err)
	}
	for attempt := 1; ; attempt++ {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			break
		}
		if err != nil {
			return fmt.Errorf("clientstore: consume key package: %w", err)
		}
		rec, err := DecodeRecord(e.Value())
		if err != nil {
			return err
		}
		inst, err := vault.Open(rec.Installation)
		if err != nil {
			return fmt.Errorf("clientstore: open installation: %w", err)
		}
		if !inst.RemoveKeyPackage(ref) {
			break
		}
		if n := pool - len(inst.KeyPackageRefs()); n > 0 {
			fresh, err := inst.NewKeyPackages(n)
			if err != nil {
				return fmt.Errorf("clientstore: refill key packages: %w", err)
			}
			// Indexed before the record holds them, as FreshKeyPackages
			// does: an entry whose record change is lost routes a
			// Welcome to a client that refuses it (wrong_recipient).
			if err := indexKeyPackages(ctx, kv, tenant, clientID, fresh); err != nil {
				return err
			}
		}
		if rec.Installation, err = vault.Seal(inst); err != nil {
			return fmt.Errorf("clientstore: seal installation: %w", err)
		}
		b, err := msgpack.Marshal(rec)
		if err != nil {
			return fmt.Errorf("clientstore: encode record: %w", err)
		}
		_, err = kv.Update(ctx, key, b, e.Revision())
		if err == nil {
			break
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) || attempt == maxRecordAttempts {
			return fmt.Errorf("clientstore: consume key package: %w", err)
		}
	}
	idx, err := keyPackageKey(tenant, hex.EncodeToString(ref))
	if err != nil {
		return fmt.Errorf("clientstore: consume key package: %w", err)
	}
	if err := kv.Delete(ctx, idx); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("clientstore: unindex key package: %w", err)
	}
	return nil
}
