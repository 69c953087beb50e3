package schema

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// addGoldens seeds f with every golden file whose name has prefix and ext.
func addGoldens(f *testing.F, prefix, ext string) {
	paths, err := filepath.Glob(filepath.Join(goldenDir, prefix+"*"+ext))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no golden seeds %s*%s: %v", prefix, ext, err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// eventGoldens seeds f with the event goldens (every kind).
func eventGoldens(f *testing.F, ext string) {
	paths, _ := filepath.Glob(filepath.Join(goldenDir, "*"+ext))
	for _, p := range paths {
		base := filepath.Base(p)
		if strings.HasPrefix(base, "filter-") || strings.HasPrefix(base, "outcome-") || strings.HasPrefix(base, "transport-") {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// fuzzValue checks the decoder contract: no panic; what decodes is valid,
// re-encodes, and decodes again to the same value; the canonical encoding
// is a fixed point.
func fuzzValue[T any, P interface {
	*T
	Unmarshaler
}](t *testing.T, format Format, data []byte) {
	var v T
	if err := format.Unmarshal(data, P(&v)); err != nil {
		return
	}
	m := any(v).(Marshaler)
	if err := any(v).(interface{ Validate() error }).Validate(); err != nil {
		t.Fatalf("decoded value is invalid: %v", err)
	}
	enc, err := format.Marshal(m)
	if err != nil {
		t.Fatalf("re-encode: %v", err)
	}
	var again T
	if err := format.Unmarshal(enc, P(&again)); err != nil {
		t.Fatalf("decode of re-encoding: %v", err)
	}
	if !reflect.DeepEqual(v, again) {
		t.Fatalf("round trip changed the value:\n%+v\n%+v", v, again)
	}
	enc2, _ := format.Marshal(any(again).(Marshaler))
	if !bytes.Equal(enc, enc2) {
		t.Fatalf("encoding is not canonical:\n%q\n%q", enc, enc2)
	}
	// The other format carries the same value.
	other := JSON
	if format == JSON {
		other = Msgpack
	}
	oenc, err := other.Marshal(m)
	if err != nil {
		t.Fatalf("encode %s: %v", other, err)
	}
	var cross T
	if err := other.Unmarshal(oenc, P(&cross)); err != nil || !reflect.DeepEqual(v, cross) {
		t.Fatalf("%s round trip: %v", other, err)
	}
}

func FuzzEventMsgpack(f *testing.F) {
	eventGoldens(f, ".msgpack")
	f.Fuzz(func(t *testing.T, data []byte) { fuzzValue[ClientEvent](t, Msgpack, data) })
}

func FuzzEventJSON(f *testing.F) {
	eventGoldens(f, ".json")
	f.Fuzz(func(t *testing.T, data []byte) { fuzzValue[ClientEvent](t, JSON, data) })
}

func FuzzFilter(f *testing.F) {
	addGoldens(f, "filter-", ".json")
	addGoldens(f, "filter-", ".msgpack")
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzValue[EventFilter](t, JSON, data)
		fuzzValue[EventFilter](t, Msgpack, data)
	})
}

func FuzzOutcome(f *testing.F) {
	addGoldens(f, "outcome-", ".json")
	addGoldens(f, "outcome-", ".msgpack")
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzValue[Outcome](t, JSON, data)
		fuzzValue[Outcome](t, Msgpack, data)
	})
}

func FuzzTransportMessage(f *testing.F) {
	addGoldens(f, "transport-", ".json")
	addGoldens(f, "transport-", ".msgpack")
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzValue[TransportMessage](t, JSON, data)
		fuzzValue[TransportMessage](t, Msgpack, data)
	})
}

// FuzzUnmarshalMsgpackView: the view decodes what UnmarshalMsgpack decodes,
// to an equal event, refuses what it refuses with the same error, and
// encodes to the same JSON and msgpack bytes. Seeds: the event goldens and
// testdata/fuzz/FuzzUnmarshalMsgpackView.
func FuzzUnmarshalMsgpackView(f *testing.F) {
	eventGoldens(f, ".msgpack")
	f.Fuzz(func(t *testing.T, data []byte) {
		var want, got ClientEvent
		werr := want.UnmarshalMsgpack(data)
		gerr := got.UnmarshalMsgpackView(data)
		if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() {
			t.Fatalf("view error %v, UnmarshalMsgpack error %v", gerr, werr)
		}
		if werr != nil {
			return
		}
		if !reflect.DeepEqual(want, got) {
			t.Fatalf("view %+v, UnmarshalMsgpack %+v", got, want)
		}
		for _, format := range []Format{JSON, Msgpack} {
			w, werr := format.Append(nil, want)
			g, gerr := format.Append(nil, got)
			if werr != nil || gerr != nil || !bytes.Equal(w, g) {
				t.Fatalf("%s: view encodes to %q (%v), UnmarshalMsgpack's event to %q (%v)", format, g, gerr, w, werr)
			}
		}
	})
}
