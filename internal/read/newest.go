package read

import (
	"context"
	"slices"

	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/streams"
)

// newest reads up to n records matching filter stored below sequence upTo
// (0: the whole stream), newest first, and whether older ones remain.
// JetStream reads forward only: the records are read forward from a
// sequence a window below upTo, the window growing fourfold until it holds
// n records or reaches the oldest record, each step reading only the part
// of the window the step before did not. What a page reads is what its
// window holds, about the page when the client's records are evenly
// spread, whatever the number of records.
func (a *API) newest(ctx context.Context, filter string, upTo uint64, n int) ([]readmodel.Stored, bool, error) {
	js := a.cfg.JS
	// The leader's newest record: every scan below is answered by a copy
	// that holds it (readmodel.ScanCurrent), so no page misses a change an
	// event already reported (EVENT-010).
	last, err := readmodel.LastSeq(ctx, js, streams.StreamEvents, filter)
	if err != nil || last == 0 {
		return nil, false, err
	}
	hi := upTo
	if hi == 0 {
		hi = last + 1
	}
	oldest, err := readmodel.ScanCurrent(ctx, js, streams.StreamEvents, filter, 1, 1, last)
	if err != nil || len(oldest) == 0 || oldest[0].Seq >= hi {
		return nil, false, err
	}
	first := oldest[0].Seq
	chunk := 4 * n
	var got []readmodel.Stored // newest first
	top := hi
	for w := uint64(2 * n); ; w *= 4 {
		l := first
		if hi > first+w {
			l = hi - w
		}
		// Read [l, top) forward, keeping the newest.
		var part []readmodel.Stored
		for from := l; from < top; {
			recs, err := readmodel.ScanCurrent(ctx, js, streams.StreamEvents, filter, from, chunk, last)
			if err != nil {
				return nil, false, err
			}
			for _, r := range recs {
				if r.Seq < top {
					part = append(part, r)
				}
			}
			if len(recs) < chunk || recs[len(recs)-1].Seq >= top {
				break
			}
			from = recs[len(recs)-1].Seq + 1
		}
		slices.Reverse(part)
		got = append(got, part...)
		top = l
		if len(got) >= n || l == first {
			more := len(got) > n || l > first
			return got[:min(n, len(got))], more, nil
		}
	}
}
