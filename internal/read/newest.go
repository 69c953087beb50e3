package read

import (
	"context"
	"slices"

	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/streams"
)

// newest reads up to n records matching filter stored below sequence upTo
// (0: the whole stream), newest first, and whether older ones remain. JetStream reads forward only: the
// records below upTo are counted (a batched direct get reports how many
// match from a sequence on), the sequence where the n newest begin is
// found by galloping down then bisecting on those counts, and the n are
// read forward from there. The cost is a logarithm of the distance in
// the stream plus n, whatever the number of records.
func (a *API) newest(ctx context.Context, filter string, upTo uint64, n int) ([]readmodel.Stored, bool, error) {
	js := a.cfg.JS
	count := func(from uint64) (uint64, error) {
		return readmodel.Count(ctx, js, streams.StreamEvents, filter, from)
	}
	hi := upTo
	if hi == 0 {
		last, err := readmodel.Last(ctx, a.cfg.JS, filter)
		if err != nil || last.Seq == 0 {
			return nil, false, err
		}
		hi = last.Seq + 1
	}
	above, err := count(hi)
	if err != nil {
		return nil, false, err
	}
	// below(l) is how many records are stored in [l, hi).
	below := func(l uint64) (uint64, error) {
		c, err := count(l)
		return c - min(c, above), err
	}
	total, err := below(1)
	if err != nil || total == 0 {
		return nil, false, err
	}
	need := min(uint64(n), total)
	// Gallop down from hi until [l, hi) holds need records or l is 1.
	w, top := uint64(64), hi
	l := uint64(1)
	for {
		cand := uint64(1)
		if hi > w {
			cand = hi - w
		}
		c, err := below(cand)
		if err != nil {
			return nil, false, err
		}
		if c >= need || cand == 1 {
			l = cand
			break
		}
		top = cand
		w *= 4
	}
	// Bisect (l, top) for the greatest start that still holds need.
	for lo, up := l, top; up-lo > 1; {
		mid := lo + (up-lo)/2
		c, err := below(mid)
		if err != nil {
			return nil, false, err
		}
		if c >= need {
			lo, l = mid, mid
		} else {
			up = mid
		}
	}
	got, err := readmodel.Scan(ctx, js, streams.StreamEvents, filter, l, int(need))
	if err != nil {
		return nil, false, err
	}
	got = slices.DeleteFunc(got, func(s readmodel.Stored) bool { return s.Seq >= hi })
	slices.Reverse(got)
	return got, total > need, nil
}
