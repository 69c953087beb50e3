package convergence

import (
	"bytes"
	"cmp"
)

// Score is a candidate branch as branch selection compares it
// (convergence.md, "Candidate branches", "App-payload witnesses").
type Score struct {
	ForkEpoch uint64
	TipEpoch  uint64
	// RawDepth is the number of valid commits from the fork to the tip.
	RawDepth uint64
	// EffectiveDepth is RawDepth plus the bounded witness boost.
	EffectiveDepth uint64
	// Quorum: at least WitnessQuorumEpochs branch epochs had
	// WitnessQuorumSendersPerEpoch distinct senders.
	Quorum bool
	// Witness is the sum over branch epochs of min(senders, quorum senders).
	Witness int
	// Privileged is the tip commit's ordering class (privileged < ordinary).
	Privileged bool
	// Committer is the tip committer's inbox id: lowercase hex of the
	// 32-byte account id, so string order is byte order.
	Committer string
	// Digest is the tip commit's commit_digest.
	Digest ID
}

// Compare orders two branches from the same fork: negative when a wins.
// The order is pinned (convergence.md, "Branch selection"): higher effective
// depth, quorum over none, higher witness score, privileged before
// ordinary, lower committer, lower digest.
func Compare(a, b Score) int {
	if c := cmp.Compare(b.EffectiveDepth, a.EffectiveDepth); c != 0 {
		return c
	}
	if a.Quorum != b.Quorum {
		if a.Quorum {
			return -1
		}
		return 1
	}
	if c := cmp.Compare(b.Witness, a.Witness); c != 0 {
		return c
	}
	if a.Privileged != b.Privileged {
		if a.Privileged {
			return -1
		}
		return 1
	}
	if c := cmp.Compare(a.Committer, b.Committer); c != 0 {
		return c
	}
	return bytes.Compare(a.Digest[:], b.Digest[:])
}

// score computes the branch from fork to leaf, leaf a descendant of fork.
func (g *Group) score(fork, leaf *node) Score {
	s := Score{
		ForkEpoch: fork.epoch, TipEpoch: leaf.epoch, RawDepth: leaf.epoch - fork.epoch,
		Privileged: leaf.privileged, Committer: leaf.committer, Digest: leaf.id,
	}
	quorumEpochs := 0
	for x := leaf; x != nil && x != fork; x = x.parent {
		// Witnesses count inside the window measured from this branch's tip.
		if leaf.epoch-x.epoch > g.policy.AppPayloadPastEpochLimit {
			continue
		}
		n := len(x.witnesses)
		if n >= g.policy.WitnessQuorumSendersPerEpoch {
			quorumEpochs++
			n = g.policy.WitnessQuorumSendersPerEpoch
		}
		s.Witness += n
	}
	s.Quorum = quorumEpochs >= g.policy.WitnessQuorumEpochs
	s.EffectiveDepth = s.RawDepth
	if s.Quorum {
		s.EffectiveDepth += g.policy.MaxWitnessOverrideDepth
	}
	return s
}

// eligible reports whether branches forking at n may be selected in the
// open pass: inside the rollback horizon from pass_base_epoch, and at or
// after the retained anchor (convergence.md, "Eligibility").
func (g *Group) eligible(n *node, base uint64) bool {
	return n.epoch >= g.root.epoch && (base < n.epoch || base-n.epoch <= g.policy.MaxRewindCommits)
}

// best selects the canonical leaf of n's subtree: at every node the child
// branches are compared from that node, their common parent, so the choice
// depends only on the retained tree and its witnesses, never on which
// branch an earlier pass applied or on arrival order.
func (g *Group) best(n *node, base uint64) *node {
	if n.state == nil || !g.eligible(n, base) {
		return n
	}
	var win *node
	var ws Score
	for _, c := range n.children {
		leaf := g.best(c, base)
		s := g.score(n, leaf)
		if win == nil || Compare(s, ws) < 0 {
			win, ws = leaf, s
		}
	}
	if win == nil {
		return n
	}
	return win
}

// Branches returns the score of every candidate branch forking from the
// canonical path, best first at each fork: what the next pass compares.
func (g *Group) Branches() []Score {
	var out []Score
	base := g.tip.epoch
	for x := g.tip; x != nil; x = x.parent {
		for _, c := range x.children {
			out = append(out, g.score(x, g.best(c, base)))
		}
	}
	return out
}
