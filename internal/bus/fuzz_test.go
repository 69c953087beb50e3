package bus

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// FuzzDecode: Decode never panics, and whatever it accepts is consistent:
// the stored subject names the decoded client, the id is well formed and
// the sequence chain points backwards.
func FuzzDecode(f *testing.F) {
	valid := liveMsg(f, event(1, received(1)), 7, 3)
	withFacts := event(2, received(2))
	withFacts.ConversationKey = []byte{1, 2, 3}
	withFacts.ReferencesOwn = true
	facts := liveMsg(f, withFacts, 9, 0)
	for _, m := range []*nats.Msg{valid, facts} {
		f.Add(m.Subject, m.Header.Get(jetstream.SubjectHeader), m.Header.Get(jetstream.SequenceHeader),
			m.Header.Get(HeaderLastSequence), m.Header.Get(jetstream.TimeStampHeaer), m.Header.Get(jetstream.MsgIDHeader),
			m.Header.Get(HeaderConversationKey), m.Header.Get(HeaderReferencesOwn), m.Data)
	}
	f.Add("_INBOX.x", "fabric.ev.acme.c0ffee01", "7", "", "2023-11-14T22:13:20Z", valid.Header.Get(jetstream.MsgIDHeader), "", "", valid.Data)
	f.Add("fabric.live.acme.c0ffee01", "fabric.ev.other.c0ffee01", "7", "3", "x", "", "ZZ", "2", []byte{0x80})
	f.Add("fabric.live.acme.c0ffee01", "fabric.ev.acme.c0ffee01", "3", "7", "", "", "", "", []byte{})
	f.Fuzz(func(t *testing.T, subj, stored, seq, last, ts, id, ckey, own string, body []byte) {
		if subj == "" {
			subj = "_INBOX.fuzz"
		}
		m := nats.NewMsg(subj)
		m.Data = body
		set := func(k, v string) {
			if v != "" {
				m.Header.Set(k, v)
			}
		}
		set(jetstream.SubjectHeader, stored)
		set(jetstream.SequenceHeader, seq)
		set(HeaderLastSequence, last)
		set(jetstream.TimeStampHeaer, ts)
		set(jetstream.MsgIDHeader, id)
		set(HeaderConversationKey, ckey)
		set(HeaderReferencesOwn, own)
		d, err := Decode(m)
		if err != nil {
			var ie *InvalidEventError
			if !errors.As(err, &ie) {
				t.Fatalf("error %v is not *InvalidEventError", err)
			}
			return
		}
		if d.Sequence == 0 || d.LastSequence >= d.Sequence {
			t.Fatalf("accepted sequence %d last %d", d.Sequence, d.LastSequence)
		}
		if err := validID(d.ID); err != nil {
			t.Fatalf("accepted id: %v", err)
		}
		if err := d.Event.Validate(); err != nil {
			t.Fatalf("accepted invalid event: %v", err)
		}
		if stored != "fabric.ev."+d.Tenant+"."+d.ClientID {
			t.Fatalf("decoded client does not match the stored subject")
		}
	})
}

// FuzzConversationKeyHeader: the conversation key header decodes exactly
// when it is lowercase hex of at most MaxConversationKeyLen bytes, to the
// bytes it spells (EVENT-020). Seeds: testdata/fuzz/FuzzConversationKeyHeader.
func FuzzConversationKeyHeader(f *testing.F) {
	f.Fuzz(func(t *testing.T, v string) {
		want, err := hex.DecodeString(v)
		wantOK := err == nil && hex.EncodeToString(want) == v && len(want) <= MaxConversationKeyLen
		got, ok := conversationKey(v)
		if ok != wantOK || ok && !bytes.Equal(got, want) {
			t.Fatalf("conversationKey(%q) = %x, %v; want %x, %v", v, got, ok, want, wantOK)
		}
	})
}

// FuzzTimeStamp: Nats-Time-Stamp is read as time.Parse with RFC 3339 reads
// it: the same strings accepted, the same times. Seeds:
// testdata/fuzz/FuzzTimeStamp.
func FuzzTimeStamp(f *testing.F) {
	f.Fuzz(func(t *testing.T, v string) {
		want, werr := time.Parse(time.RFC3339Nano, v)
		got, err := timeStamp(v)
		if (err == nil) != (werr == nil) || !got.Equal(want) || got.String() != want.String() {
			t.Fatalf("timeStamp(%q) = %v, %v; want %v, %v", v, got, err, want, werr)
		}
		if fast, ok := utcTimeStamp(v); ok && fast != want {
			t.Fatalf("utcTimeStamp(%q) = %#v, time.Parse gives %#v", v, fast, want)
		}
	})
}

// FuzzRecordConversationKey: a fabric-groups record of any bytes gives a
// key of at most MaxConversationKeyLen bytes or an error, never a panic.
// Seeds: testdata/fuzz/FuzzRecordConversationKey.
func FuzzRecordConversationKey(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := RecordConversationKey(b)
		if err == nil && len(k) > MaxConversationKeyLen {
			t.Fatalf("accepted a key of %d bytes", len(k))
		}
	})
}

// FuzzDecodeGroupKeys checks the fabric-group-keys value decoder never
// panics and returns only whole keys.
func FuzzDecodeGroupKeys(f *testing.F) {
	k, _ := EncodeGroupKeys(make([][32]byte, 2))
	f.Add(k)
	f.Add([]byte{0x91, 0xc4, 0x01, 0x00})
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, err := DecodeGroupKeys(b)
		if err == nil && len(keys) > maxGroupKeys {
			t.Fatalf("%d keys", len(keys))
		}
	})
}
