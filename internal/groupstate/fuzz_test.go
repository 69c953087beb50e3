package groupstate

import (
	"testing"
)

// FuzzRestore feeds UnmarshalSnapshot and Restore arbitrary bytes, seeded
// with a real group's snapshot: a damaged blob is ErrBadSnapshot or a
// restore error, never a panic (a stored blob is read on every cold
// activation).
func FuzzRestore(f *testing.F) {
	w := newWorld(f, 3, Config{}, false)
	f.Add(blobOf(f, w.g))
	f.Add([]byte(`{"v":1,"carrier":"a","members":[{"id":"a","keys":{}}]}`))
	f.Add([]byte(`{"v":1,"carrier":"a","members":[{"id":"a"}],"pending":[{"committer":"a","id":"AA=="}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := UnmarshalSnapshot(b)
		if err != nil {
			return
		}
		g, err := Restore(s, Config{})
		if err == nil && g == nil {
			t.Fatal("Restore returned neither a group nor an error")
		}
	})
}
