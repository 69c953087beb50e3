package clientstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/clientstore/outbox"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Bounds of an HMAC root key and of the keys a client keeps.
const (
	minHMACKey = 16
	maxHMACKey = 256
	// keptHMACKeys is how many root keys a client keeps, newest last; older
	// keys only decode notifications of the past.
	keptHMACKeys = 8
)

// hmacSealPrefix separates a sealed HMAC root key from the group state the
// vault's state label is for, so one never opens as the other.
const hmacSealPrefix = "fabric/hmac-root-key/v1\x00"

// clientState is the client-wide record in fabric-stores,
// <tenant>.<client>.client: registration and HMAC state.
type clientState struct {
	// Epoch is the HMAC epoch the client was registered in, or the greatest
	// epoch an epoch-increase event was emitted for (EVENT-026).
	Epoch int64 `msgpack:"epoch"`
	// HMACKeys are the stored root keys, newest last.
	HMACKeys []hmacKey `msgpack:"hmac_keys,omitempty"`
	// HMACStored counts the root keys ever stored; it makes each store's
	// event id.
	HMACStored uint64 `msgpack:"hmac_stored"`
}

type hmacKey struct {
	// Digest is SHA-256 of the key, to recognize a key stored again.
	Digest   []byte    `msgpack:"digest"`
	Sealed   []byte    `msgpack:"sealed"`
	StoredAt time.Time `msgpack:"stored_at"`
}

func clientStateKey(tenant, clientID string) (string, error) {
	k, err := subject.Key(tenant, clientID, "client")
	if err != nil {
		return "", fmt.Errorf("clientstore: client state key: %w", err)
	}
	return k, nil
}

// HMACKeyRequest is the body of PUT …/clients/{client_id}/hmac-keys: a new
// HMAC root key (SYNC-015, SYNC-022).
type HMACKeyRequest struct {
	RootKey schema.Bytes `json:"root_key" msgpack:"root_key"`
}

// HMACKeyAnswer says whether the key was new, and so whether
// hmac_keys.updated was emitted.
type HMACKeyAnswer struct {
	Stored bool `json:"stored" msgpack:"stored"`
}

func (s *Store) putHMACKey(r *http.Request, c call) (int, any, error) {
	var req HMACKeyRequest
	if err := httpapi.Decode(r, maxBody, &req); err != nil {
		return 0, nil, err
	}
	if n := len(req.RootKey); n < minHMACKey || n > maxHMACKey {
		return 0, nil, refusal.BadRequest("root_key: want %d to %d bytes", minHMACKey, maxHMACKey)
	}
	stored, err := s.StoreHMACKey(r.Context(), c.tenant, c.client.ClientID, req.RootKey)
	if err != nil {
		return 0, nil, emitError(err)
	}
	return http.StatusOK, HMACKeyAnswer{Stored: stored}, nil
}

// StoreHMACKey stores a new HMAC root key for a client, sealed, and emits
// hmac_keys.updated. A key the client already holds is not new: nothing
// changes and nothing is emitted.
func (s *Store) StoreHMACKey(ctx context.Context, tenant, clientID string, rootKey []byte) (stored bool, err error) {
	key, err := clientStateKey(tenant, clientID)
	if err != nil {
		return false, err
	}
	digest := sha256.Sum256(rootKey)
	sealed, err := s.vault.SealState(append([]byte(hmacSealPrefix), rootKey...))
	if err != nil {
		return false, fmt.Errorf("clientstore: seal hmac key: %w", err)
	}
	now := s.clock.Now().UTC()
	_, events, err := outbox.Apply(ctx, s.out, key, func(cur clientState, found bool) (outbox.Change[clientState], error) {
		if !found {
			return outbox.Change[clientState]{}, ErrNotFound
		}
		for _, k := range cur.HMACKeys {
			if bytes.Equal(k.Digest, digest[:]) {
				return outbox.Change[clientState]{State: cur}, nil
			}
		}
		next := cur
		next.HMACKeys = append(append([]hmacKey(nil), cur.HMACKeys...), hmacKey{Digest: digest[:], Sealed: sealed, StoredAt: now})
		if len(next.HMACKeys) > keptHMACKeys {
			next.HMACKeys = next.HMACKeys[len(next.HMACKeys)-keptHMACKeys:]
		}
		next.HMACStored++
		ev := hmacEvent(tenant, clientID, eventID(tenant, clientID, "hmac-key", strconv.FormatUint(next.HMACStored, 10)))
		return outbox.Change[clientState]{State: next, Store: true, Events: []outbox.Event{ev}}, nil
	})
	return len(events) > 0, err
}

// HMACRootKeys returns a client's stored HMAC root keys, newest last.
func (s *Store) HMACRootKeys(ctx context.Context, tenant, clientID string) ([][]byte, error) {
	key, err := clientStateKey(tenant, clientID)
	if err != nil {
		return nil, err
	}
	st, found, err := outbox.Get[clientState](ctx, s.out, key)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, ErrNotFound
	}
	out := make([][]byte, 0, len(st.HMACKeys))
	for _, k := range st.HMACKeys {
		pt, err := s.vault.OpenState(k.Sealed)
		if err != nil {
			return nil, fmt.Errorf("clientstore: open hmac key: %w", err)
		}
		rk, ok := bytes.CutPrefix(pt, []byte(hmacSealPrefix))
		if !ok {
			return nil, errors.New("clientstore: open hmac key: not an hmac key")
		}
		out = append(out, rk)
	}
	return out, nil
}

func hmacEvent(tenant, clientID, id string) outbox.Event {
	return outbox.Event{
		Tenant:   tenant,
		ClientID: clientID,
		ID:       id,
		Event:    schema.ClientEvent{Kind: schema.KindHmacKeysUpdated, HmacKeysUpdated: &schema.HmacKeysUpdated{}},
	}
}

// runEpochTimer waits for each HMAC epoch boundary after the store opened
// and reports the increase for every registered client (EVENT-026). It
// sleeps until the next boundary, so it wakes once per epoch.
func (s *Store) runEpochTimer(ctx context.Context) {
	last := s.startEpoch
	secs := int64(s.period / time.Second)
	for {
		boundary := time.Unix((last+1)*secs, 0)
		t := s.clock.NewTimer(boundary.Sub(s.clock.Now()))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		e := s.epoch(s.clock.Now())
		if e <= last {
			continue // woke before the boundary: wait again
		}
		s.metrics.epochs.Inc()
		s.epochIncreased(ctx, e)
		last = e
	}
}

// epochRetries bounds the attempts for a client whose epoch event could not
// be stored or emitted.
const epochRetries = 5

// epochIncreased emits one hmac_keys.updated for epoch to every registered
// client whose record has not seen it. The record's compare-and-set makes
// it one event per client even when several processes host the store.
func (s *Store) epochIncreased(ctx context.Context, epoch int64) {
	l, err := s.clients.ListKeysFiltered(ctx, "*.*")
	if err != nil {
		s.log.Error("hmac epoch: list clients", "err", err)
		return
	}
	var keys []string
	for k := range l.Keys() {
		keys = append(keys, k)
	}
	failed := 0
	for _, k := range keys {
		tenant, parts, err := subject.ParseKey(k)
		if err != nil || len(parts) != 1 {
			continue
		}
		var lastErr error
		for attempt := range epochRetries {
			if lastErr = s.observeEpoch(ctx, tenant, parts[0], epoch); lastErr == nil || ctx.Err() != nil {
				break
			}
			sleep(ctx, time.Duration(attempt+1)*100*time.Millisecond)
		}
		if lastErr != nil {
			failed++
		}
	}
	if failed > 0 {
		s.log.Error("hmac epoch: clients not notified", "count", failed)
	}
}

// observeEpoch reports an epoch increase to one client, unless its record
// already holds that epoch or a later one (EVENT-026: exactly one event per
// increase; none for the epoch it was registered in).
func (s *Store) observeEpoch(ctx context.Context, tenant, clientID string, epoch int64) error {
	key, err := clientStateKey(tenant, clientID)
	if err != nil {
		return err
	}
	_, _, err = outbox.Apply(ctx, s.out, key, func(cur clientState, found bool) (outbox.Change[clientState], error) {
		if !found || cur.Epoch >= epoch {
			return outbox.Change[clientState]{State: cur}, nil
		}
		next := cur
		next.Epoch = epoch
		ev := hmacEvent(tenant, clientID, eventID(tenant, clientID, "hmac-epoch", strconv.FormatInt(epoch, 10)))
		return outbox.Change[clientState]{State: next, Store: true, Events: []outbox.Event{ev}}, nil
	})
	return err
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
