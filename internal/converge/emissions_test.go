package converge

import "testing"

// TestEmissionsKeepOrder adds emissions across several blocks and reads
// them back in order.
func TestEmissionsKeepOrder(t *testing.T) {
	t.Parallel()
	var e emissions
	const n = 3*maxEmissionBlock + 5
	for i := range n {
		e.add(emission{Index: i})
	}
	if e.len() != n {
		t.Fatalf("len %d, want %d", e.len(), n)
	}
	i := 0
	for x := range e.all() {
		if x.Index != i {
			t.Fatalf("emission %d read as %d", i, x.Index)
		}
		i++
		if i == n-1 {
			break
		}
	}
	if i != n-1 {
		t.Fatalf("read %d before the break, want %d", i, n-1)
	}
	for _, b := range e.blocks {
		if cap(b) > maxEmissionBlock {
			t.Fatalf("a block of %d", cap(b))
		}
	}
}
