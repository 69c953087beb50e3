package ingest

import (
	"sync"

	"github.com/fabric-mls/fabric/internal/binding"
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
