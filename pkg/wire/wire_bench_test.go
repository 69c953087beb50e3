package wire

import "testing"

// BenchmarkAppendEventFrame measures building one event frame around an
// already encoded event, as the gateway's writer does per handoff.
func BenchmarkAppendEventFrame(b *testing.B) {
	for _, enc := range []Encoding{Msgpack, JSON} {
		b.Run(enc.Subprotocol(), func(b *testing.B) {
			ev := AppendLagged(enc, nil, 1) // any encoded event
			buf := make([]byte, 0, 256)
			b.ReportAllocs()
			for b.Loop() {
				f := Frame{Op: OpEvent, Sub: 12345, Seq: 987654321, Event: ev}
				buf = Append(enc, buf[:0], &f)
			}
		})
	}
}
