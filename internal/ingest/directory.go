package ingest

import (
	"errors"
	"fmt"

	"sync"

	"github.com/fabric-mls/fabric/internal/binding"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/vmihailenco/msgpack/v5"
)

// directory is what the watches of fabric-group-keys and fabric-groups have
// told this worker: the candidate group event keys of each group, and which
// groups some hosted client of the tenant holds. Keys are "<tenant>.<group>".
type directory struct {
	mu     sync.RWMutex
	keys   map[string]keySet
	groups map[string]groupState
}

// groupState is whether a group is hosted, as of the fabric-groups revision
// (stream sequence) that said so. The watch and the direct reads of a
// directory miss both write it; the newer revision wins, so a read that
// raced a later delete cannot bring the group back.
type groupState struct {
	known bool
	rev   uint64
}

// keySet is a group's candidate keys with a generation that grows on every
// change, so a peel can tell whether the set moved while it ran.
type keySet struct {
	keys [][binding.KeySize]byte
	gen  uint64
}

func newDirectory() *directory {
	return &directory{keys: map[string]keySet{}, groups: map[string]groupState{}}
}

// candidateKeys returns the group's keys and their generation.
func (d *directory) candidateKeys(key string) ([][binding.KeySize]byte, uint64) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	ks := d.keys[key]
	return ks.keys, ks.gen
}

// keyGen returns the generation of the group's key set.
func (d *directory) keyGen(key string) uint64 {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.keys[key].gen
}

func (d *directory) setKeys(key string, keys [][binding.KeySize]byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	gen := d.keys[key].gen + 1
	if keys == nil {
		// Keep the generation, so a later set is still seen as a change.
		d.keys[key] = keySet{gen: gen}
		return
	}
	d.keys[key] = keySet{keys: keys, gen: gen}
}

// known reports whether a hosted client of the tenant holds the group.
func (d *directory) known(key string) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.groups[key].known
}

// setKnown records whether a group is hosted as of fabric-groups revision
// rev, unless the directory already holds a newer revision.
func (d *directory) setKnown(key string, known bool, rev uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if cur, ok := d.groups[key]; ok && cur.rev > rev {
		return
	}
	d.groups[key] = groupState{known: known, rev: rev}
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
func SealGroupKeys(v *engine.Vault, keys [][binding.KeySize]byte) ([]byte, error) {
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
func OpenGroupKeys(v *engine.Vault, sealed []byte) ([][binding.KeySize]byte, error) {
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
