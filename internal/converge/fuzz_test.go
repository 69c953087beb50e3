package converge

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzDecodeCheckpoint: any bytes decode to a checkpoint or an error, never
// a panic, and a decoded checkpoint encodes again.
func FuzzDecodeCheckpoint(f *testing.F) {
	b, _ := encodeCheckpoint(checkpoint{InputSeq: 7, Txn: "in:7", State: "t.g.s.n", Members: map[string]string{"c": "t.g.m.c.n"},
		Outcomes: []outcomeNote{{MessageID: make([]byte, 32), Class: "commit", Status: "queued", Disposition: "accepted"}}})
	f.Add(b)
	f.Add([]byte{0x80})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := decodeCheckpoint(data)
		if err != nil {
			return
		}
		if _, err := encodeCheckpoint(c); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzDecodeGroupState: any bytes decode to a group state or an error; a
// decoded state encodes, clones and answers its queries.
func FuzzDecodeGroupState(f *testing.F) {
	g := newGroupState("t", []byte{1})
	g.Members["c"] = &hostedMember{ClientID: "c", InboxID: "i", Installation: []byte{2}}
	g.queue(60).Head = 5
	g.Keys = []epochKey{{Epoch: 1, Key: make([]byte, 61)}}
	b, _ := g.encode()
	f.Add(b)
	f.Add([]byte{0x81, 0xa1, 'v', 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := decodeGroupState(data)
		if err != nil {
			return
		}
		if _, err := g.clone(); err != nil {
			t.Fatal(err)
		}
		g.active()
		g.nextExpiry()
	})
}

// FuzzDecodeIndex: stored index entries and expiry pages decode or fail,
// never panic; a page decoded is sorted by expiry.
func FuzzDecodeIndex(f *testing.F) {
	e, _ := msgpack.Marshal(storedMessage{ID: make([]byte, 32), SenderInboxID: "i", SenderInstallation: []byte{2}, Seq: 9, ExpiresAt: 5})
	p, _ := msgpack.Marshal([]expiryEntry{{ID: make([]byte, 32), ExpiresAt: 5}, {ID: []byte{1}, ExpiresAt: 7}})
	f.Add(e)
	f.Add(p)
	f.Add([]byte{0x92, 0x80, 0x80})
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = decodeEntry(data)
		page, err := decodePage(data)
		for i := 1; err == nil && i < len(page); i++ {
			if page[i].ExpiresAt < page[i-1].ExpiresAt {
				t.Fatal("unsorted page decoded")
			}
		}
	})
}

// FuzzDecodeLease: lease records from KV never panic the decoder.
func FuzzDecodeLease(f *testing.F) {
	b, _ := msgpack.Marshal(leaseRecord{Worker: "w", Expires: 1})
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = decodeLease(data)
	})
}
