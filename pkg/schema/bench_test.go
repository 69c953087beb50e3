package schema

import "testing"

func benchEncode(b *testing.B, name string, f Format) {
	ev := sample(b, name)
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = appendIn(f, buf[:0], ev); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}

func benchDecode(b *testing.B, name string, f Format) {
	data, err := f.Marshal(sample(b, name))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		var ev ClientEvent
		if err := unmarshalIn(f, data, &ev); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeMsgpackMessageReceived(b *testing.B) { benchEncode(b, "message.received", Msgpack) }
func BenchmarkDecodeMsgpackMessageReceived(b *testing.B) { benchDecode(b, "message.received", Msgpack) }
func BenchmarkEncodeJSONMessageReceived(b *testing.B)    { benchEncode(b, "message.received", JSON) }
func BenchmarkDecodeJSONMessageReceived(b *testing.B)    { benchDecode(b, "message.received", JSON) }
func BenchmarkEncodeMsgpackLagged(b *testing.B)          { benchEncode(b, "lagged", Msgpack) }
func BenchmarkDecodeMsgpackLagged(b *testing.B)          { benchDecode(b, "lagged", Msgpack) }
func BenchmarkEncodeJSONLagged(b *testing.B)             { benchEncode(b, "lagged", JSON) }
func BenchmarkDecodeJSONLagged(b *testing.B)             { benchDecode(b, "lagged", JSON) }

// BenchmarkMarshalMsgpackMessageReceived is the allocating form, as the
// msgpack library calls it for an embedded event.
func BenchmarkMarshalMsgpackMessageReceived(b *testing.B) {
	ev := sample(b, "message.received")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ev.MarshalMsgpack(); err != nil {
			b.Fatal(err)
		}
	}
}

// appendIn calls the concrete method, as the gateway does, so the benchmark
// does not measure boxing into Marshaler.
func appendIn(f Format, dst []byte, ev ClientEvent) ([]byte, error) {
	if f == JSON {
		return ev.AppendJSON(dst)
	}
	return ev.AppendMsgpack(dst)
}

func unmarshalIn(f Format, data []byte, ev *ClientEvent) error {
	if f == JSON {
		return ev.UnmarshalJSON(data)
	}
	return ev.UnmarshalMsgpack(data)
}
