package clientstore

import (
	"bytes"
	"net/http/httptest"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/httpapi"
)

// FuzzDecodeRecord: a fabric-clients value that does not decode is an
// error, never a panic; one that does re-encodes to the same record.
func FuzzDecodeRecord(f *testing.F) {
	good, _ := msgpack.Marshal(Record{Tenant: "acme", ClientID: "ab", InboxID: inboxOf(1), InstallationKey: []byte{1, 2}, Installation: []byte{3}})
	f.Add(good)
	f.Add([]byte{0x80})
	f.Add([]byte{0xc1, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := DecodeRecord(b)
		if err != nil {
			return
		}
		again, err := msgpack.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		rec2, err := DecodeRecord(again)
		if err != nil || rec2.ClientID != rec.ClientID || !bytes.Equal(rec2.Installation, rec.Installation) {
			t.Fatal("record does not round-trip")
		}
	})
}

// FuzzRequestBodies runs the consent and association request decoders and
// checks on arbitrary bodies, JSON and msgpack: refusals, never panics.
func FuzzRequestBodies(f *testing.F) {
	f.Add([]byte(`{"entity_kind":"conversation","entity":"ab","state":"allowed"}`), false)
	f.Add([]byte(`{"sequence_id":3,"installation_keys":["`+inboxOf(1)+`"],"display_handle":"h"}`), false)
	f.Add([]byte{0x83, 0xab}, true)
	f.Fuzz(func(t *testing.T, body []byte, mp bool) {
		r := httptest.NewRequest("PUT", "/", bytes.NewReader(body))
		if mp {
			r.Header.Set("Content-Type", httpapi.ContentTypeMsgpack)
		}
		var c ConsentRecord
		if httpapi.Decode(r, maxBody, &c) == nil {
			_ = checkEntity(c.EntityKind, c.Entity)
		}
		r = httptest.NewRequest("PUT", "/", bytes.NewReader(body))
		if mp {
			r.Header.Set("Content-Type", httpapi.ContentTypeMsgpack)
		}
		var a AssociationState
		if httpapi.Decode(r, maxBody, &a) == nil {
			if a.check() == nil && a.DisplayHandle != nil && *a.DisplayHandle == "" {
				t.Fatal("empty display handle accepted")
			}
		}
	})
}
