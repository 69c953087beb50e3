package quota

import (
	"sync"
	"time"
)

// tallySlots is how many slots a Tally's window is counted in. Bytes
// added count until their slot is a whole window old, so for up to one
// slot (a tallySlots-th of the window) longer than the store keeps them,
// never shorter: a ring holds ringSlots.
const (
	tallySlots = 64
	ringSlots  = tallySlots + 1
)

// Tally bounds the bytes each key (a tenant) adds to a store that keeps
// what it is given for a window (FABRIC_IN keeps input for its MaxAge):
// what a key added within the window counts against its bound, and frees
// as it ages out. It counts what this process added; it starts empty. A
// nil *Tally is no bound.
type Tally struct {
	bound  int64
	window time.Duration // 0: nothing ages out
	slot   time.Duration

	mu   sync.Mutex
	keys map[string]*ring
}

// ring is one key's bytes per slot, slots[i] for slot number first+i.
type ring struct {
	first int64
	slots [ringSlots]int64
	total int64
}

// NewTally returns a tally of at most bound bytes per key over window (0:
// what is added never ages out); nil, no bound, when bound is not
// positive.
func NewTally(bound int64, window time.Duration) *Tally {
	if bound <= 0 {
		return nil
	}
	t := &Tally{bound: bound, window: window, keys: map[string]*ring{}}
	if window > 0 {
		t.slot = max((window+tallySlots-1)/tallySlots, time.Millisecond)
	}
	return t
}

// Max is the bound per key; 0 for none.
func (t *Tally) Max() int64 {
	if t == nil {
		return 0
	}
	return t.bound
}

// Take counts n bytes for key at now when they fit its bound, or when key
// has nothing counted (a single addition larger than the bound is not
// refused forever). When they do not fit it counts nothing and says how
// long until enough has aged out.
func (t *Tally) Take(key string, n int64, now time.Time) (ok bool, retryAfter time.Duration) {
	if t == nil || n <= 0 {
		return true, 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.slotOf(now)
	r := t.keys[key]
	if r == nil {
		if len(t.keys) >= maxTracked {
			t.sweep(s)
		}
		r = &ring{first: s}
		t.keys[key] = r
	}
	t.advance(r, s)
	if r.total > 0 && r.total+n > t.bound {
		return false, t.wait(r, r.total+n-t.bound, now)
	}
	r.slots[s-r.first] += n
	r.total += n
	return true, 0
}

// Return uncounts n bytes Take counted for key at takenAt, when they were
// not stored after all.
func (t *Tally) Return(key string, n int64, takenAt time.Time) {
	if t == nil || n <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.keys[key]
	if r == nil {
		return
	}
	i := t.slotOf(takenAt) - r.first
	if i < 0 || i >= ringSlots {
		return // aged out already
	}
	n = min(n, r.slots[i])
	r.slots[i] -= n
	if r.total -= n; r.total == 0 {
		delete(t.keys, key)
	}
}

// Counted is what key has counted at now.
func (t *Tally) Counted(key string, now time.Time) int64 {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.keys[key]
	if r == nil {
		return 0
	}
	t.advance(r, t.slotOf(now))
	if r.total == 0 {
		delete(t.keys, key)
	}
	return r.total
}

func (t *Tally) slotOf(now time.Time) int64 {
	if t.window == 0 {
		return 0
	}
	return now.UnixNano() / int64(t.slot)
}

// advance ages out the slots before s's window, so that s is r's last.
func (t *Tally) advance(r *ring, s int64) {
	shift := s - (r.first + ringSlots - 1)
	if shift <= 0 {
		return
	}
	if shift >= ringSlots {
		r.slots, r.total = [ringSlots]int64{}, 0
	} else {
		for _, v := range r.slots[:shift] {
			r.total -= v
		}
		copy(r.slots[:], r.slots[shift:])
		clear(r.slots[ringSlots-shift:])
	}
	r.first += shift
}

// sweep drops the keys whose bytes have all aged out by slot s.
func (t *Tally) sweep(s int64) {
	for k, r := range t.keys {
		if t.advance(r, s); r.total == 0 {
			delete(t.keys, k)
		}
	}
}

// wait is how long until need bytes of r have aged out; 0 when nothing
// ages out.
func (t *Tally) wait(r *ring, need int64, now time.Time) time.Duration {
	if t.window == 0 {
		return 0
	}
	var freed int64
	for i, v := range r.slots {
		if freed += v; freed >= need {
			// Slot first+i leaves when slot first+i+ringSlots begins.
			end := time.Unix(0, (r.first+int64(i)+ringSlots)*int64(t.slot))
			return max(end.Sub(now), time.Second)
		}
	}
	return t.window
}
