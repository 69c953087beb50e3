package converge

import (
	"slices"

	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// An own commit that was accepted is not settled yet: inside the rollback
// horizon a deeper or better branch from its parent epoch can still win
// and supersede it (fabric.commit_superseded), and then the group no longer
// holds what its operation asked, though the operation's record said done
// (issue 26 item 5). So an accepted own commit is watched while it can be
// superseded, and a superseded one is retried like a commit that lost
// before it was accepted (ownCommitOutcomes): its intent made again on the
// winning branch, its record pending again naming the new commit, failed
// with stale_epoch once its attempts are spent.

// watchAccepted keeps an accepted own commit while a winning branch may
// supersede it.
func (g *groupState) watchAccepted(oc ownCommit) {
	g.AcceptedCommits = append(g.AcceptedCommits, oc)
	if n := len(g.AcceptedCommits); n > maxOwnCommits {
		g.AcceptedCommits = slices.Delete(g.AcceptedCommits, 0, n-maxOwnCommits)
	}
}

// supersededOwnCommits returns the watched own commits that are no longer
// accepted in their committer's view (a pass applied a branch without
// them), and stops watching those that no branch can supersede any more:
// their parent epoch is below the view's anchor (tip − max_rewind_commits),
// so a fork from it is stale.
func (p marmot) supersededOwnCommits(t *txn) ([]ownCommit, error) {
	if len(t.g.AcceptedCommits) == 0 {
		return nil, nil
	}
	var keep, superseded []ownCommit
	for _, oc := range t.g.AcceptedCommits {
		m := t.g.Members[oc.ClientID]
		if m == nil || (m.Removed && !m.Retained) {
			continue // no view of the committer is kept to supersede it
		}
		cg, err := p.view(t)
		if err != nil {
			return nil, err
		}
		var id engine.MessageID
		copy(id[:], oc.CommitID)
		o, ok := cg.Outcome(id)
		switch {
		case !ok:
			// Forgotten: settled far behind the anchor.
		case o.Disposition != schema.DispositionAccepted:
			superseded = append(superseded, oc)
		case cg.AnchorEpoch() > oc.Epoch:
			// Settled: no branch from its parent epoch is eligible.
		default:
			keep = append(keep, oc)
		}
	}
	t.g.AcceptedCommits = keep
	return superseded, nil
}
