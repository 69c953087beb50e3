package quota

import "sync"

// InFlight bounds what each key (a tenant) holds at once: connections,
// or bytes being read and answered. A nil *InFlight is no bound.
type InFlight struct {
	bound int64

	mu   sync.Mutex
	held map[string]int64
}

// NewInFlight returns a bound of bound per key; nil, no bound, when bound
// is not positive.
func NewInFlight(bound int64) *InFlight {
	if bound <= 0 {
		return nil
	}
	return &InFlight{bound: bound, held: map[string]int64{}}
}

// Max is the bound per key; 0 for none.
func (f *InFlight) Max() int64 {
	if f == nil {
		return 0
	}
	return f.bound
}

// Acquire counts n more for key when it stays within the bound, or when
// key holds nothing (one item larger than the bound is not refused
// forever); the caller Releases what it acquired.
func (f *InFlight) Acquire(key string, n int64) bool {
	if f == nil || n <= 0 {
		return true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.held[key]
	if h > 0 && h+n > f.bound {
		return false
	}
	f.held[key] = h + n
	return true
}

// Release uncounts n of key.
func (f *InFlight) Release(key string, n int64) {
	if f == nil || n <= 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held[key] -= n; f.held[key] <= 0 {
		delete(f.held, key)
	}
}
