package schema

import (
	"bytes"
	"errors"
	"runtime"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// hostileRootKey is the body of issue 17 item 1: a map whose root_key bin
// declares 4,294,967,280 bytes and holds 26.
var hostileRootKey = append([]byte("\x81\xa8root_key\xc6\xff\xff\xff\xf0"), bytes.Repeat([]byte{'A'}, 26)...)

type rootKeyBody struct {
	RootKey Bytes `msgpack:"root_key"`
}

// allocated returns the bytes fn allocates on the heap.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Each declared length that exceeds the input is refused by the check,
// before the library could allocate it.
func TestCheckMsgpackRefusesLengthsBeyondTheInput(t *testing.T) {
	for name, b := range map[string][]byte{
		"bin32":        hostileRootKey,
		"bin8":         {0xc4, 0x05, 1, 2},
		"str32":        {0xdb, 0xff, 0xff, 0xff, 0xff, 'a'},
		"fixstr":       {0xa5, 'a'},
		"ext32":        {0xc9, 0x7f, 0xff, 0xff, 0xff, 0x01},
		"array32":      {0xdd, 0xff, 0xff, 0xff, 0xff, 0x01},
		"map32":        {0xdf, 0x7f, 0xff, 0xff, 0xff, 0x01, 0x01},
		"map16 half":   {0xde, 0x00, 0x02, 0x01, 0x01, 0x01},
		"truncated":    {0xcd, 0x01},
		"unused code":  {0xc1},
		"trailing":     {0x01, 0x02},
		"empty":        {},
		"nested 33":    append(bytes.Repeat([]byte{0x91}, MaxMsgpackDepth+1), 0x01),
		"nested array": {0x92, 0xc6, 0x00, 0x00, 0x10, 0x00, 0x01},
	} {
		if err := CheckMsgpack(b); !errors.Is(err, ErrMsgpackShape) {
			t.Errorf("%s: %v, want ErrMsgpackShape", name, err)
		}
	}
	for name, b := range map[string][]byte{
		"nested 32": append(bytes.Repeat([]byte{0x91}, MaxMsgpackDepth), 0x01),
		"map":       {0x81, 0xa1, 'k', 0xc4, 0x01, 0x07},
		"fixext":    {0xd6, 0xff, 1, 2, 3, 4},
		"nil":       {0xc0},
	} {
		if err := CheckMsgpack(b); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// UnmarshalMsgpack refuses the 41-byte body without allocating what it
// declares.
func TestUnmarshalMsgpackHostileBinAllocatesLittle(t *testing.T) {
	var v rootKeyBody
	var err error
	n := allocated(func() { err = UnmarshalMsgpack(hostileRootKey, &v) })
	if !errors.Is(err, ErrMsgpackShape) {
		t.Fatalf("err %v, want ErrMsgpackShape", err)
	}
	if n > 1<<20 {
		t.Fatalf("allocated %d bytes for a 41-byte body", n)
	}
}

// Bytes decoded by the msgpack library directly (a caller that skips the
// check) still allocates about what the input holds, not what it claims.
func TestBytesDecodeMsgpackDoesNotTrustTheDeclaredLength(t *testing.T) {
	var v rootKeyBody
	var err error
	n := allocated(func() { err = msgpack.Unmarshal(hostileRootKey, &v) })
	if err == nil {
		t.Fatal("a bin longer than the input decoded")
	}
	if n > 1<<20 {
		t.Fatalf("allocated %d bytes for a 41-byte body", n)
	}
	good, err := msgpack.Marshal(rootKeyBody{RootKey: bytes.Repeat([]byte{7}, 3*binChunk+5)})
	if err != nil {
		t.Fatal(err)
	}
	if err := UnmarshalMsgpack(good, &v); err != nil || len(v.RootKey) != 3*binChunk+5 || v.RootKey[3*binChunk] != 7 {
		t.Fatalf("large bin: %v, %d bytes", err, len(v.RootKey))
	}
	if err := UnmarshalMsgpack([]byte{0x81, 0xa8, 'r', 'o', 'o', 't', '_', 'k', 'e', 'y', 0xc0}, &v); err != nil || v.RootKey != nil {
		t.Fatalf("nil bin: %v %v", err, v.RootKey)
	}
}

// FuzzCheckMsgpack: whatever the check passes, the library decodes
// without allocating more than a small multiple of the input; the check
// never panics.
func FuzzCheckMsgpack(f *testing.F) {
	f.Add(hostileRootKey)
	f.Add([]byte{0x92, 0xc4, 0x01, 0x07, 0x80})
	f.Add([]byte{0xdf, 0x00, 0x00, 0x00, 0x01, 0xa1, 'k', 0x91, 0xc0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var v any
		var w rootKeyBody
		n := allocated(func() {
			if CheckMsgpack(b) == nil {
				_ = UnmarshalMsgpack(b, &v)
				_ = UnmarshalMsgpack(b, &w)
			}
		})
		if limit := uint64(64<<10 + 512*len(b)); n > limit {
			t.Fatalf("%d bytes of input allocated %d", len(b), n)
		}
	})
}
