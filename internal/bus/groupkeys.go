package bus

import (
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/binding"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// GroupKeySealer seals the fabric-group-keys value under the master key, as
// every private key at rest (engine.Vault).
type GroupKeySealer interface {
	SealGroupEventKeys(plain []byte) ([]byte, error)
	OpenGroupEventKeys(sealed []byte) ([]byte, error)
}

// EncodeGroupKeys encodes a group's candidate group event keys as the value
// of its fabric-group-keys entry: a msgpack array of 32-byte bin values, the
// keys of every retained candidate state of the group (DESIGN §3).
func EncodeGroupKeys(keys [][binding.KeySize]byte) ([]byte, error) {
	raw := make([][]byte, len(keys))
	for i := range keys {
		raw[i] = keys[i][:]
	}
	b, err := msgpack.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("encode group keys: %w", err)
	}
	return b, nil
}

// ErrGroupKeysNotSealed reports a fabric-group-keys value that does not open
// under the master key: written under another key, or unsealed by a fabric
// from before group event keys were sealed, which is not read
// (docs/converge.md).
var ErrGroupKeysNotSealed = errors.New("group key set is not sealed under this master key")

// SealGroupKeys is the fabric-group-keys value of a group's candidate keys:
// EncodeGroupKeys sealed under the master key, as every private key at rest.
func SealGroupKeys(v GroupKeySealer, keys [][binding.KeySize]byte) ([]byte, error) {
	b, err := EncodeGroupKeys(keys)
	if err != nil {
		return nil, err
	}
	defer clear(b)
	sealed, err := v.SealGroupEventKeys(b)
	if err != nil {
		return nil, fmt.Errorf("seal group keys: %w", err)
	}
	return sealed, nil
}

// OpenGroupKeys opens and decodes a value SealGroupKeys wrote.
func OpenGroupKeys(v GroupKeySealer, sealed []byte) ([][binding.KeySize]byte, error) {
	b, err := v.OpenGroupEventKeys(sealed)
	if err != nil {
		return nil, ErrGroupKeysNotSealed
	}
	defer clear(b)
	return DecodeGroupKeys(b)
}

// maxGroupKeys bounds the candidate keys of one group a worker accepts.
const maxGroupKeys = 1024

// DecodeGroupKeys decodes a fabric-group-keys value written by
// EncodeGroupKeys. It reads the array length before allocating, so a
// corrupt value cannot make it allocate more than maxGroupKeys keys.
func DecodeGroupKeys(b []byte) ([][binding.KeySize]byte, error) {
	dec, err := schema.NewMsgpackDecoder(b)
	if err != nil {
		return nil, fmt.Errorf("decode group keys: %w", err)
	}
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, fmt.Errorf("decode group keys: %w", err)
	}
	if n < 0 || n > maxGroupKeys {
		return nil, fmt.Errorf("decode group keys: %d keys, want 0 to %d", n, maxGroupKeys)
	}
	keys := make([][binding.KeySize]byte, n)
	for i := range keys {
		k, err := dec.DecodeBytes()
		if err != nil {
			return nil, fmt.Errorf("decode group keys: %w", err)
		}
		if len(k) != binding.KeySize {
			return nil, errors.New("decode group keys: a key is not 32 bytes")
		}
		copy(keys[i][:], k)
	}
	return keys, nil
}
