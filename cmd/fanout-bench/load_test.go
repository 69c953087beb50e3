package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/pkg/wire"
)

// TestLoadSubscriberReadsFramesAsDecoded protects the load figures: the
// subscribers' light reading of event frames counts what wire.Decode would,
// events with their publish stamp and lagged apart, in both encodings.
func TestLoadSubscriberReadsFramesAsDecoded(t *testing.T) {
	for _, enc := range []wire.Encoding{wire.Msgpack, wire.JSON} {
		t.Run(enc.Subprotocol(), func(t *testing.T) {
			f := &fabricSystem{json: enc == wire.JSON}
			st := &subscriber{subscribed: make(chan struct{}), m: &meter{}}
			st.m.sampling.Store(true)
			f.frame(st, wire.Append(enc, nil, &wire.Frame{Op: wire.OpSubscribed, ID: 1, Sub: 7, Seq: 3}))
			if st.sub != 7 {
				t.Fatalf("subscribed frame read as sub %d, want 7", st.sub)
			}
			stamp := time.Now().Add(-time.Second).UnixNano()
			id := fmt.Sprintf("%016x%048x", stamp, 1)
			ev := wire.Append(enc, nil, &wire.Frame{Op: wire.OpEvent, Sub: 7, Seq: 300, EventID: id,
				Event: wire.AppendLagged(enc, nil, 1)})
			lagged := wire.Append(enc, nil, &wire.Frame{Op: wire.OpEvent, Sub: 7, Seq: 301, AtMost: true,
				Event: wire.AppendLagged(enc, nil, 5)})
			f.frame(st, ev)
			f.frame(st, lagged)
			if got := st.m.delivered.Load(); got != 1 {
				t.Errorf("delivered %d, want 1", got)
			}
			if got := st.m.lagged.Load(); got != 1 {
				t.Errorf("lagged %d, want 1", got)
			}
			if len(st.m.lat) != 1 || st.m.lat[0] < time.Second || st.m.lat[0] > time.Minute {
				t.Errorf("latency samples %v, want one of about a second", st.m.lat)
			}
		})
	}
}
