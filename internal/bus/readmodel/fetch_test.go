package readmodel

import "testing"

// TestBehindNeedsTheLeadersLastAtTheEnd: an answer that reaches the end of
// its filter without the leader's newest record came from a copy behind
// (EVENT-010); one that ends before the end, or holds it, did not.
func TestBehindNeedsTheLeadersLastAtTheEnd(t *testing.T) {
	for _, c := range []struct {
		name       string
		got        []Stored
		from, last uint64
		want       bool
	}{
		{"nothing stored on the leader", nil, 1, 0, false},
		{"the leader's last below the scan", nil, 10, 9, false},
		{"empty answer, the leader holds one", nil, 1, 5, true},
		{"the end, without it", []Stored{{Seq: 3}, {Seq: 4}}, 1, 5, true},
		{"the end, with it", []Stored{{Seq: 3}, {Seq: 5}}, 1, 5, false},
		{"past it", []Stored{{Seq: 7}}, 1, 5, false},
		{"ends before the end", []Stored{{Seq: 3, Pending: 2}}, 1, 5, false},
	} {
		if got := behind(c.got, c.from, c.last); got != c.want {
			t.Errorf("%s: behind %v, want %v", c.name, got, c.want)
		}
	}
}
