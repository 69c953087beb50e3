package schema

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

const goldenDir = "testdata/golden"

// checkGolden compares got with the golden file name, or rewrites it under
// -update.
func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	file := filepath.Join(goldenDir, name)
	if *update {
		if err := os.MkdirAll(goldenDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run go test -run Golden -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file:\n got %q\nwant %q", name, got, want)
	}
}

// roundTrip encodes v in both formats, compares with the goldens, and
// decodes each golden back into a value equal to v.
func roundTrip[T any, P interface {
	*T
	Unmarshaler
}](t *testing.T, name string, v T) {
	t.Helper()
	m := any(v).(Marshaler)
	for _, f := range []Format{Msgpack, JSON} {
		enc, err := f.Marshal(m)
		if err != nil {
			t.Fatalf("%s %s: encode: %v", name, f, err)
		}
		ext := ".msgpack"
		if f == JSON {
			ext = ".json"
		}
		checkGolden(t, name+ext, enc)
		var got T
		if err := f.Unmarshal(enc, P(&got)); err != nil {
			t.Fatalf("%s %s: decode: %v", name, f, err)
		}
		if !reflect.DeepEqual(got, v) {
			t.Errorf("%s %s: decode(encode(x)) != x\n got %+v\nwant %+v", name, f, got, v)
		}
	}
}

func TestGoldenEventsEveryKind(t *testing.T) {
	seen := map[EventKind]bool{}
	for _, s := range sampleEvents() {
		t.Run(s.name, func(t *testing.T) {
			roundTrip(t, s.name, s.ev)
		})
		seen[s.ev.Kind] = true
	}
	for _, k := range AllKinds() {
		if !seen[k] {
			t.Errorf("no golden event of kind %s", k)
		}
	}
}

func TestGoldenFiltersOutcomesTransports(t *testing.T) {
	for name, f := range sampleFilters() {
		t.Run(name, func(t *testing.T) { roundTrip(t, name, f) })
	}
	for name, o := range sampleOutcomes() {
		t.Run(name, func(t *testing.T) { roundTrip(t, name, o) })
	}
	for name, m := range sampleTransports() {
		t.Run(name, func(t *testing.T) { roundTrip(t, name, m) })
	}
}

// TestEncodingsReadableByGenericDecoders checks the goldens with decoders
// that know nothing of this package: msgpack maps keyed by the IDL names
// with octets as bin, JSON objects with octets as lowercase hex.
func TestEncodingsReadableByGenericDecoders(t *testing.T) {
	ev := sampleEvents()[6].ev // message.received
	mp, err := ev.MarshalMsgpack()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := msgpack.Unmarshal(mp, &m); err != nil {
		t.Fatal(err)
	}
	mr, ok := m["message_received"].(map[string]any)
	if m["kind"] != "message.received" || !ok {
		t.Fatalf("msgpack map = %#v", m)
	}
	if gid, ok := mr["group_id"].([]byte); !ok || !bytes.Equal(gid, sampleGroup) {
		t.Errorf("group_id = %#v, want bin %x", mr["group_id"], sampleGroup)
	}
	ct := mr["content_type"].(map[string]any)
	if ct["authority_id"] != "xmtp.org" || ct["type_id"] != "text" {
		t.Errorf("content_type = %#v", ct)
	}

	js, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	var j map[string]any
	if err := json.Unmarshal(js, &j); err != nil {
		t.Fatal(err)
	}
	jr := j["message_received"].(map[string]any)
	if jr["group_id"] != sampleGroup.String() || jr["message_id"] != sampleMessage.String() {
		t.Errorf("JSON ids = %v, %v", jr["group_id"], jr["message_id"])
	}
	if jr["content_type"].(map[string]any)["version_major"] != 1.0 {
		t.Errorf("version_major = %v", jr["content_type"])
	}
}

// frame is a gateway frame that embeds an event, as DESIGN section 10's
// {op:"event", sub, event}.
type frame struct {
	Op    string      `msgpack:"op" json:"op"`
	Sub   string      `msgpack:"sub" json:"sub"`
	Event ClientEvent `msgpack:"event" json:"event"`
	Group Bytes       `msgpack:"group" json:"group"`
}

// TestEmbeddedInFrames checks that the msgpack and JSON libraries use this
// package's codecs for an embedded event and for Bytes.
func TestEmbeddedInFrames(t *testing.T) {
	in := frame{Op: "event", Sub: "s1", Event: sampleEvents()[6].ev, Group: sampleGroup}

	mp, err := msgpack.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var outM frame
	if err := msgpack.Unmarshal(mp, &outM); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(outM, in) {
		t.Errorf("msgpack frame round trip: got %+v", outM)
	}
	evBytes, _ := in.Event.MarshalMsgpack()
	if !bytes.Contains(mp, evBytes) {
		t.Error("msgpack frame does not embed the event's own encoding")
	}

	js, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var outJ frame
	if err := json.Unmarshal(js, &outJ); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(outJ, in) {
		t.Errorf("JSON frame round trip: got %+v", outJ)
	}
	if !bytes.Contains(js, []byte(`"group":"`+sampleGroup.String()+`"`)) {
		t.Errorf("Bytes in a frame is not lowercase hex: %s", js)
	}

	// An invalid embedded event fails the whole frame.
	bad := in
	bad.Event.Kind = KindLagged
	if _, err := msgpack.Marshal(bad); err == nil {
		t.Error("msgpack.Marshal of a frame with an invalid event succeeded")
	}
}

// TestJSONStringsInteroperate: strings with quotes, controls, non-ASCII and
// line separators survive encoding/json.
func TestJSONStringsInteroperate(t *testing.T) {
	for _, s := range []string{"plain", "quote\" back\\slash", "ctl\x00\x01\x1f\t\r\n", "zoë 😀", "ls\u2028ps\u2029", "<&>"} {
		ev := ClientEvent{Kind: KindHandleChanged, HandleChanged: &HandleChanged{InboxID: "i", Handle: s}}
		js, err := ev.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		var generic struct {
			HandleChanged struct{ Handle string } `json:"handle_changed"`
		}
		if err := json.Unmarshal(js, &generic); err != nil || generic.HandleChanged.Handle != s {
			t.Errorf("%q: encoding/json reads %q (%v) from %s", s, generic.HandleChanged.Handle, err, js)
		}
		var back ClientEvent
		if err := back.UnmarshalJSON(js); err != nil || back.HandleChanged.Handle != s {
			t.Errorf("%q: round trip: %v", s, err)
		}
	}
}
