package clientstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// ErrNotFound: no hosted client, or no KeyPackage index entry, has that id
// in that tenant.
var ErrNotFound = errors.New("clientstore: not found")

// Record is a hosted client as fabric-clients stores it under
// <tenant>.<client_id>. The private parts are sealed by the engine's vault;
// everything else is public.
type Record struct {
	Tenant   string `msgpack:"tenant"`
	ClientID string `msgpack:"client_id"` // lowercase hex of InstallationKey
	// InboxID is the lowercase hex of the 32-byte account id.
	InboxID string `msgpack:"inbox_id"`
	// InstallationKey is the leaf's 32-byte signature public key.
	InstallationKey []byte `msgpack:"installation_key"`
	// CredentialHandle names the credential the client authenticates to its
	// backend with; clients that share it share its lockout (EVENT-055).
	CredentialHandle string `msgpack:"credential_handle"`
	// Installation is the installation's private material (signature key,
	// KeyPackage private keys) sealed by the vault.
	Installation []byte    `msgpack:"installation"`
	CreatedAt    time.Time `msgpack:"created_at"`
}

// recordKey is the fabric-clients key of a client.
func recordKey(tenant, clientID string) (string, error) {
	return subject.ClientKey(tenant, clientID)
}

// keyPackageKey is the fabric-clients index key of a KeyPackage ref.
func keyPackageKey(tenant, refHex string) (string, error) {
	return subject.Key(tenant, "kp", refHex)
}

// credentialKey is the fabric-clients index entry saying clientID uses the
// credential handle. The handle is hashed: it is free text.
func credentialKey(tenant, handle, clientID string) (string, error) {
	return subject.Key(tenant, "cred", handleDigest(handle), clientID)
}

func handleDigest(handle string) string {
	d := sha256.Sum256([]byte(handle))
	return hex.EncodeToString(d[:])
}

// Lookup loads the hosted client clientID of tenant from the fabric-clients
// bucket kv. It returns ErrNotFound for a client the tenant does not have.
func Lookup(ctx context.Context, kv jetstream.KeyValue, tenant, clientID string) (Record, error) {
	key, err := recordKey(tenant, clientID)
	if err != nil {
		return Record{}, fmt.Errorf("clientstore: lookup: %w", err)
	}
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Record{}, ErrNotFound
	}
	if err != nil {
		return Record{}, fmt.Errorf("clientstore: lookup: %w", err)
	}
	return DecodeRecord(e.Value())
}

// DecodeRecord decodes a fabric-clients record.
func DecodeRecord(b []byte) (Record, error) {
	var rec Record
	if err := schema.UnmarshalMsgpack(b, &rec); err != nil {
		return Record{}, fmt.Errorf("clientstore: decode record: %w", err)
	}
	return rec, nil
}

// LookupKeyPackage returns the client a KeyPackage was handed out for, by
// the KeyPackageRef in lowercase hex; converge routes a Welcome with it.
func LookupKeyPackage(ctx context.Context, kv jetstream.KeyValue, tenant, refHex string) (clientID string, err error) {
	key, err := keyPackageKey(tenant, refHex)
	if err != nil {
		return "", fmt.Errorf("clientstore: lookup key package: %w", err)
	}
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("clientstore: lookup key package: %w", err)
	}
	return string(e.Value()), nil
}

// SharingCredential lists the clients of tenant registered with the given
// credential handle (EVENT-055), in no particular order.
func SharingCredential(ctx context.Context, kv jetstream.KeyValue, tenant, handle string) ([]string, error) {
	prefix, err := subject.Key(tenant, "cred", handleDigest(handle))
	if err != nil {
		return nil, fmt.Errorf("clientstore: credential: %w", err)
	}
	return listLastToken(ctx, kv, prefix+".*")
}

// listLastToken lists the keys matching filter and returns each one's last
// token.
func listLastToken(ctx context.Context, kv jetstream.KeyValue, filter string) ([]string, error) {
	l, err := kv.ListKeysFiltered(ctx, filter)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("clientstore: list keys: %w", err)
	}
	defer func() { _ = l.Stop() }()
	var out []string
	for k := range l.Keys() {
		i := len(k) - 1
		for i >= 0 && k[i] != '.' {
			i--
		}
		out = append(out, k[i+1:])
	}
	return out, nil
}
