package ingest

import (
	"context"
	"hash/maphash"
	"sync"
)

// backfillStripes is how many locks serialize backfills: one group's
// backfills never run at once; two groups share a lock only by their
// hash.
const backfillStripes = 64

// backfillLocks serialize the backfills of a group on this worker.
type backfillLocks struct {
	seed  maphash.Seed
	locks [backfillStripes]sync.Mutex
}

func newBackfillLocks() *backfillLocks { return &backfillLocks{seed: maphash.MakeSeed()} }

func (b *backfillLocks) of(key string) *sync.Mutex {
	return &b.locks[maphash.String(b.seed, key)%backfillStripes]
}

// retryKey offers a group's retained objects of one reason again; the
// unknown-group ones as a backfill, so input of the group that arrives
// meanwhile waits for them.
func (s *Service) retryKey(ctx context.Context, k retryKey) error {
	if k.reason != reasonUnknown {
		return s.retryRetained(ctx, k)
	}
	return s.backfill(ctx, k.tenant, k.group, true)
}

// backfill offers a known group's unknown-group objects to convergence,
// oldest first, before later input of the group enters (issue 26: a hello
// retained while its Welcome was processed went in after the reply that
// arrived once the group was known). A group that became known is marked
// (directory.backfillDue) until a backfill ran to the end of its retained
// objects; input of a marked group runs the backfill first, one at a time
// per group, and enters after it. force runs it even when the group is not
// marked: the watch asked for it, or a retain found the group known.
func (s *Service) backfill(ctx context.Context, tenant, groupHex string, force bool) error {
	key := tenant + "." + groupHex
	if _, due := s.dir.backfillDue(key); !due && !force {
		return nil
	}
	mu := s.backfillLocks.of(key)
	mu.Lock()
	defer mu.Unlock()
	gen, due := s.dir.backfillDue(key)
	if !due && !force {
		return nil // another request ran it while this one waited
	}
	if err := s.retryRetained(ctx, retryKey{tenant: tenant, group: groupHex, reason: reasonUnknown}); err != nil {
		return err
	}
	if due {
		s.dir.backfilled(key, gen)
	}
	return nil
}

// backfillBefore runs the backfill of every marked group that inputs about
// to enter belong to. Re-offered input is the backfill's own and does not
// wait for it.
func (s *Service) backfillBefore(ctx context.Context, tenant string, ins []*input) error {
	last := ""
	for _, in := range ins {
		if in.retained || in.groupKey == last {
			continue
		}
		last = in.groupKey
		if err := s.backfill(ctx, tenant, in.groupHex, false); err != nil {
			return err
		}
	}
	return nil
}
