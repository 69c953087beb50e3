package convergence

import (
	"cmp"
	"slices"

	"github.com/fabric-mls/fabric/internal/apppayload"
)

// canonicalOrder orders the deliveries of one pass as the changes were
// made, from nothing but their MLS facts and payloads (EVENT-012): by
// epoch, then by sender leaf and the sender's ratchet generation, and a
// message after every message of the set it references (a reply after its
// parent, a reaction after its target, a deletion after the message it
// deletes), so the deletion of a message settled in the same pass finds it
// (PROC-037). Message ids and arrival order never enter: the same pass
// delivers in the same order however its input arrived.
func canonicalOrder(ds []Delivery) {
	if len(ds) < 2 {
		return
	}
	slices.SortFunc(ds, func(a, b Delivery) int {
		return cmp.Or(cmp.Compare(a.Epoch, b.Epoch), cmp.Compare(a.Sender.Leaf, b.Sender.Leaf), cmp.Compare(a.Generation, b.Generation))
	})
	at := make(map[ID]int, len(ds))
	for i, d := range ds {
		at[d.ID] = i
	}
	refs := make([][]int, len(ds))
	for i, d := range ds {
		p, err := apppayload.Decode(d.Payload)
		if err != nil {
			continue
		}
		for _, target := range references(p) {
			if j, ok := at[ID(target)]; ok && j != i {
				refs[i] = append(refs[i], j)
			}
		}
	}
	// Depth first from each message in key order: its referenced messages
	// first. A cycle (only forged payloads make one) is cut where it closes.
	const (
		unseen = iota
		visiting
		placed
	)
	mark := make([]int, len(ds))
	out := make([]Delivery, 0, len(ds))
	var place func(int)
	place = func(i int) {
		if mark[i] != unseen {
			return
		}
		mark[i] = visiting
		for _, j := range refs[i] {
			place(j)
		}
		mark[i] = placed
		out = append(out, ds[i])
	}
	for i := range ds {
		place(i)
	}
	copy(ds, out)
}

// references are the message ids a payload depends on: the message it
// replies or reacts to, and the message it deletes.
func references(p apppayload.Payload) [][]byte {
	var out [][]byte
	if id, _, ok := p.References(); ok && len(id) == len(ID{}) {
		out = append(out, id)
	}
	if id, ok := p.DeletionTarget(); ok && len(id) == len(ID{}) {
		out = append(out, id)
	}
	return out
}

// Step is one change of a Result in the order it was made: an applied
// commit or a delivery, exactly one set.
type Step struct {
	Commit   *AppliedCommit
	Delivery *Delivery
}

// Steps interleaves Applied and Delivered in the order the changes were
// made (EVENT-012): a message of epoch e was sent before the commit that
// left epoch e, so each delivery comes before every applied commit whose
// source epoch is at or after its epoch.
func (r Result) Steps() []Step {
	out := make([]Step, 0, len(r.Applied)+len(r.Delivered))
	next := 0
	for i := range r.Delivered {
		d := &r.Delivered[i]
		for ; next < len(r.Applied) && r.Applied[next].SourceEpoch < d.Epoch; next++ {
			out = append(out, Step{Commit: &r.Applied[next]})
		}
		out = append(out, Step{Delivery: d})
	}
	for ; next < len(r.Applied); next++ {
		out = append(out, Step{Commit: &r.Applied[next]})
	}
	return out
}
