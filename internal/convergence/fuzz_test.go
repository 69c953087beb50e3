package convergence

import (
	"errors"
	"testing"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// FuzzUnmarshal: persisted bytes from storage never panic the decoder; they
// restore or fail with ErrCorrupt, and what restores marshals again. Damaged
// retained snapshots reach engine.Restore, which bounds them before mls-go
// (FuzzRestore there fuzzes them alone).
func FuzzUnmarshal(f *testing.F) {
	w, x, y := crashWorld(f)
	g := w.fresh()
	admit(f, g, t0, x...)
	settle(f, g)
	admit(f, g, t0.Add(10e9), y...)
	// Settled inputs in chunks: app messages delivered at the anchor and a
	// rejected input.
	settled := w.fresh()
	sender := clone(f, w.alice)
	admit(f, settled, t0, text(f, sender, "one"), text(f, sender, "two"))
	if _, err := settled.Admit(Input{ID: idFor([]byte{1}), Class: schema.ClassApplication, Data: []byte{1}}, t0); err != nil {
		f.Fatal(err)
	}
	for _, seed := range []*Group{w.fresh(), g, settled} {
		b, err := seed.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x80})
	head, _, err := settled.MarshalSplit()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := Unmarshal(V1, b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error without ErrCorrupt: %v", err)
			}
		} else if _, err := g.Marshal(); err != nil {
			t.Fatalf("restored group does not marshal: %v", err)
		}
		// The same bytes as a split head, and as its one chunk.
		for _, in := range [][2][]byte{{b, nil}, {head, b}} {
			var chunks [][]byte
			if in[1] != nil {
				chunks = [][]byte{in[1]}
			}
			if _, err := UnmarshalSplit(V1, in[0], chunks); err != nil && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("split: error without ErrCorrupt: %v", err)
			}
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
