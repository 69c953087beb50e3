package readmodel

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrSealed is the error of content that does not open: sealed under
// another tenant key (the tenant's key was dropped) or altered.
var ErrSealed = errors.New("readmodel: content does not open")

// ErrNoTenantKey is returned when a tenant has no content key.
var ErrNoTenantKey = errors.New("readmodel: tenant has no content key")

// Deriver derives a key from the master key (engine.Vault.Derive).
type Deriver interface {
	Derive(label string, info []byte, n int) ([]byte, error)
}

const (
	// keyLabel is the HKDF label of tenant content keys.
	keyLabel = "fabric/read-content/v1"
	// KeySuffix is the fabric-clients key of a tenant's content key
	// salt: <tenant>.content-key. Deleting it drops the tenant's key: its
	// stored content no longer opens.
	KeySuffix  = "content-key"
	sealedV1   = 1
	saltLength = 32
)

// Sealer seals and opens one tenant's message content.
type Sealer struct {
	aead   cipher.AEAD
	tenant string
}

// NewSealer derives the tenant's content key from the master key and the
// tenant's salt: HKDF-SHA256 of the master key, info = label, tenant and
// salt.
func NewSealer(d Deriver, tenant string, salt []byte) (*Sealer, error) {
	info := append([]byte(tenant+"\x00"), salt...)
	key, err := d.Derive(keyLabel, info, 32)
	if err != nil {
		return nil, fmt.Errorf("readmodel: derive tenant key: %w", err)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("readmodel: tenant key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("readmodel: tenant key: %w", err)
	}
	return &Sealer{aead: aead, tenant: tenant}, nil
}

func (s *Sealer) ad(groupID []byte, n uint64) []byte {
	ad := append([]byte(keyLabel+"\x00"+s.tenant+"\x00"), groupID...)
	return binary.BigEndian.AppendUint64(ad, n)
}

// Seal seals the content of message n of a group: bound to the tenant,
// the group and n, so it opens nowhere else.
func (s *Sealer) Seal(groupID []byte, n uint64, content []byte) ([]byte, error) {
	out := make([]byte, 1+s.aead.NonceSize(), 1+s.aead.NonceSize()+len(content)+s.aead.Overhead())
	out[0] = sealedV1
	if _, err := rand.Read(out[1:]); err != nil {
		return nil, fmt.Errorf("readmodel: seal nonce: %w", err)
	}
	return s.aead.Seal(out, out[1:], content, s.ad(groupID, n)), nil
}

// Open opens what Seal sealed.
func (s *Sealer) Open(groupID []byte, n uint64, sealed []byte) ([]byte, error) {
	ns := s.aead.NonceSize()
	if len(sealed) < 1+ns+s.aead.Overhead() || sealed[0] != sealedV1 {
		return nil, ErrSealed
	}
	pt, err := s.aead.Open(nil, sealed[1:1+ns], sealed[1+ns:], s.ad(groupID, n))
	if err != nil {
		return nil, ErrSealed
	}
	return pt, nil
}

// TenantSalt reads a tenant's content key salt from fabric-clients; with
// create, a tenant without one gets a fresh one (the first writer wins).
// Without create, a tenant without one is ErrNoTenantKey.
func TenantSalt(ctx context.Context, kv jetstream.KeyValue, tenant string, create bool) ([]byte, error) {
	key := tenant + "." + KeySuffix
	e, err := kv.Get(ctx, key)
	if err == nil && len(e.Value()) == saltLength {
		return e.Value(), nil
	}
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("readmodel: read tenant key: %w", err)
	}
	if !create {
		return nil, ErrNoTenantKey
	}
	salt := make([]byte, saltLength)
	if _, err := rand.Read(salt); err != nil {
		return nil, err
	}
	if _, err := kv.Create(ctx, key, salt); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return TenantSalt(ctx, kv, tenant, false)
		}
		return nil, fmt.Errorf("readmodel: create tenant key: %w", err)
	}
	return salt, nil
}
