package convergence_test

import (
	"fmt"
	"time"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/convergence"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/testpeer"
)

// A remote member forks the group with two competing commits; the hosted
// member's convergence detects the fork, closes the pass at its deadline
// and applies the branch with the lower commit digest (one committer, both
// ordinary: the last tie-breaker).
func Example() {
	alice, _ := testpeer.New("alice")
	group, _ := alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}})
	hosted, _ := engine.CreateInstallation(make([]byte, engine.AccountIDLen), 0)
	kps, _ := hosted.NewKeyPackages(1)
	_, welcome, _ := group.Invite(kps[0])
	state, _, _ := hosted.Join(welcome.MLS, nil)

	conv, _ := convergence.New(convergence.V1, state)
	fork, _ := group.Fork(2)
	now := time.Unix(0, 0)
	for _, m := range fork {
		r, _ := conv.Admit(convergence.Input{ID: engine.NewMessageID(m.MLS), Class: "commit", Data: m.MLS}, now)
		if r.ForkDetected {
			fmt.Println("fork detected:", conv.Lifecycle())
		}
	}
	deadline, _ := conv.Deadline()
	r, _ := conv.Tick(deadline)
	fmt.Println("applied:", len(r.Applied), "lifecycle:", conv.Lifecycle())
	for _, m := range fork {
		o, _ := conv.Outcome(engine.NewMessageID(m.MLS))
		won := o.ID == r.Applied[0].ID
		fmt.Println("won:", won, "disposition:", o.Disposition)
	}
	// Unordered output:
	// fork detected: recovering
	// applied: 1 lifecycle: stable
	// won: true disposition: accepted
	// won: false disposition: deferred
}
