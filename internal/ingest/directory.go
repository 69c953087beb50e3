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
//
// backfill is set when the group became known while input retained as
// unknown_group may wait for it: later input of the group enters only
// after that input (Service.backfill), so the group's input keeps its
// arrival order (issue 26). gen counts the times it was set, so a backfill
// clears only the flag it ran for.
type groupState struct {
	known    bool
	backfill bool
	rev      uint64
	gen      uint64
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
// rev, unless the directory already holds a newer revision. With backfill,
// a group that becomes known is marked for a backfill in the same step, so
// no input of the group sees it known before it is marked.
func (d *directory) setKnown(key string, known bool, rev uint64, backfill bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	cur, ok := d.groups[key]
	if ok && cur.rev > rev {
		return
	}
	next := groupState{known: known, rev: rev, gen: cur.gen}
	if known {
		next.backfill = cur.backfill
		if backfill && !cur.known {
			next.backfill = true
			next.gen++
		}
	}
	d.groups[key] = next
}

// markBackfill marks a known group for a backfill: input of it may be
// retained as unknown_group (found at start).
func (d *directory) markBackfill(key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if g, ok := d.groups[key]; ok && g.known {
		g.backfill = true
		g.gen++
		d.groups[key] = g
	}
}

// backfillDue reports whether the group is known and marked for a
// backfill, and the mark's generation.
func (d *directory) backfillDue(key string) (uint64, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	g := d.groups[key]
	return g.gen, g.known && g.backfill
}

// backfilled clears the group's mark if it is still the one of generation
// gen: a mark set while the backfill ran asks for another.
func (d *directory) backfilled(key string, gen uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if g, ok := d.groups[key]; ok && g.gen == gen {
		g.backfill = false
		d.groups[key] = g
	}
}
