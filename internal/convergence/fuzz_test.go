package convergence

import (
	"errors"
	"testing"

	"github.com/fabric-mls/fabric/internal/engine"
)

// FuzzUnmarshal: persisted bytes from storage never panic the decoder; they
// restore or fail with ErrCorrupt, and what restores marshals again.
func FuzzUnmarshal(f *testing.F) {
	w, x, y := crashWorld(f)
	g := w.fresh()
	admit(f, g, t0, x...)
	settle(f, g)
	admit(f, g, t0.Add(10e9), y...)
	known := map[string][]byte{}
	for _, seed := range []*Group{w.fresh(), g} {
		b, err := seed.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		for _, n := range seed.nodes {
			if n.state != nil {
				s := must[[]byte](f)(n.state.Snapshot())
				known[string(s)] = s
			}
		}
	}
	// Intact snapshots restore through the engine; any other is storage
	// loss. (Damaged snapshots are the engine's to fuzz.)
	restore := func(b []byte) (*engine.State, error) {
		if _, ok := known[string(b)]; !ok {
			return nil, errors.New("lost")
		}
		return engine.Restore(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := unmarshal(V1, b, restore)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error without ErrCorrupt: %v", err)
			}
			return
		}
		if _, err := g.Marshal(); err != nil {
			t.Fatalf("restored group does not marshal: %v", err)
		}
	})
}

// FuzzAdmit: hostile MLS bytes of any class never panic admission; they are
// rejected, deferred or stale, and never accepted without a pass.
func FuzzAdmit(f *testing.F) {
	w, x, y := crashWorld(f)
	for _, m := range append(x, y...) {
		f.Add(uint8(0), m.MLS)
	}
	f.Add(uint8(1), []byte{0, 1, 0, 1})
	f.Add(uint8(2), []byte{})
	base := w.fresh()
	snapshot, err := base.Marshal()
	if err != nil {
		f.Fatal(err)
	}
	classes := []Input{{Class: "commit"}, {Class: "proposal"}, {Class: "application"}}
	f.Fuzz(func(t *testing.T, class uint8, data []byte) {
		g, err := Unmarshal(V1, snapshot)
		if err != nil {
			t.Fatal(err)
		}
		in := classes[int(class)%len(classes)]
		in.Data = data
		in.ID = idFor(data)
		r, err := g.Admit(in, t0)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Applied) != 0 {
			t.Fatal("admission applied a commit without a pass")
		}
	})
}
