package schema

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

const mrJSON = `"message_received":{"group_id":"6a01","message_id":"abab","sender_inbox_id":"x"}`

func wantDecodeErr(t *testing.T, err error, sentinel error, member string) {
	t.Helper()
	var de *DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("err = %v, want a *DecodeError (%v at %q)", err, sentinel, member)
	}
	if !errors.Is(err, sentinel) || de.Member != member {
		t.Fatalf("err = %v (member %q), want %v at %q", err, de.Member, sentinel, member)
	}
}

func TestDecodeEventJSONStrict(t *testing.T) {
	cases := []struct {
		name, in string
		sentinel error // nil: a *ValidationError
		member   string
	}{
		{"unknown kind", `{"kind":"message.sent",` + mrJSON + `}`, ErrUnknownKind, "kind"},
		{"unknown top member", `{"kind":"lagged","lagged":{"discarded":1},"extra":1}`, ErrUnknownMember, ""},
		{"unknown payload member", `{"kind":"lagged","lagged":{"discarded":1,"x":2}}`, ErrUnknownMember, "lagged"},
		{"unknown nested member", `{"kind":"message.received","message_received":{"group_id":"6a01","message_id":"abab","sender_inbox_id":"x","content_type":{"authority_id":"a","type_id":"t","version_major":1,"version_minor":0}}}`, ErrUnknownMember, "message_received.content_type"},
		{"member case differs", `{"Kind":"lagged","lagged":{"discarded":1}}`, ErrUnknownMember, ""},
		{"duplicate kind", `{"kind":"lagged","kind":"lagged","lagged":{"discarded":1}}`, ErrDuplicateMember, "kind"},
		{"duplicate nested", `{"kind":"lagged","lagged":{"discarded":1,"discarded":2}}`, ErrDuplicateMember, "lagged.discarded"},
		{"missing kind", `{"lagged":{"discarded":1}}`, ErrMissingMember, "kind"},
		{"missing required", `{"kind":"lagged","lagged":{}}`, ErrMissingMember, "lagged.discarded"},
		{"missing required sequence", `{"kind":"conversation.membership_changed","membership_changed":{"group_id":"01","added_inbox_ids":["a"]}}`, ErrMissingMember, "membership_changed.removed_inbox_ids"},
		{"null optional", `{"kind":"conversation.joined","conversation_joined":{"group_id":"01","conversation_type":"dm","origin":"created","adder_inbox_id":null}}`, ErrMalformed, "conversation_joined.adder_inbox_id"},
		{"null payload", `{"kind":"lagged","lagged":null}`, ErrMalformed, "lagged"},
		{"uppercase hex", `{"kind":"conversation.fork_detected","conversation_fork_detected":{"group_id":"6A01"}}`, ErrMalformed, "conversation_fork_detected.group_id"},
		{"odd hex", `{"kind":"conversation.fork_detected","conversation_fork_detected":{"group_id":"6a0"}}`, ErrMalformed, "conversation_fork_detected.group_id"},
		{"string for integer", `{"kind":"lagged","lagged":{"discarded":"1"}}`, ErrMalformed, "lagged.discarded"},
		{"float", `{"kind":"lagged","lagged":{"discarded":1.0}}`, ErrMalformed, "lagged.discarded"},
		{"exponent", `{"kind":"lagged","lagged":{"discarded":1e3}}`, ErrMalformed, "lagged.discarded"},
		{"negative", `{"kind":"lagged","lagged":{"discarded":-1}}`, ErrMalformed, "lagged.discarded"},
		{"overflow", `{"kind":"lagged","lagged":{"discarded":18446744073709551616}}`, ErrMalformed, "lagged.discarded"},
		{"leading zero", `{"kind":"lagged","lagged":{"discarded":01}}`, ErrMalformed, "lagged.discarded"},
		{"version_major over 32 bits", `{"kind":"message.received","message_received":{"group_id":"6a01","message_id":"abab","sender_inbox_id":"x","content_type":{"authority_id":"a","type_id":"t","version_major":4294967296}}}`, ErrMalformed, "message_received.content_type.version_major"},
		{"bool as string", `{"kind":"archive.restored","archive_restored":{"complete":"true"}}`, ErrMalformed, "archive_restored.complete"},
		{"number as string", `{"kind":"handle.changed","handle_changed":{"inbox_id":1,"handle":"h"}}`, ErrMalformed, "handle_changed.inbox_id"},
		{"array of non-strings", `{"kind":"conversation.membership_changed","membership_changed":{"group_id":"01","added_inbox_ids":[1],"removed_inbox_ids":[]}}`, ErrMalformed, "membership_changed.added_inbox_ids"},
		{"trailing data", `{"kind":"lagged","lagged":{"discarded":1}} {}`, ErrMalformed, ""},
		{"trailing comma", `{"kind":"lagged","lagged":{"discarded":1},}`, ErrMalformed, ""},
		{"missing comma", `{"kind":"lagged" "lagged":{"discarded":1}}`, ErrMalformed, ""},
		{"truncated", `{"kind":"lagged","lagged":{"discarded":1}`, ErrMalformed, ""},
		{"empty", ``, ErrMalformed, ""},
		{"not an object", `[]`, ErrMalformed, ""},
		{"control character", "{\"kind\":\"lagged\",\"lagged\":{\"discarded\":1},\"\x01\":1}", ErrMalformed, ""},
		{"bad escape", `{"kind":"handle.changed","handle_changed":{"inbox_id":"\q","handle":"h"}}`, ErrMalformed, "handle_changed.inbox_id"},
		{"zero discarded", `{"kind":"lagged","lagged":{"discarded":0}}`, nil, "lagged.discarded"},
		{"member of another kind", `{"kind":"hmac_keys.updated","lagged":{"discarded":1}}`, nil, "lagged"},
		{"no payload", `{"kind":"hmac_keys.updated"}`, nil, "hmac_keys_updated"},
		{"two payloads", `{"kind":"hmac_keys.updated","hmac_keys_updated":{},"lagged":{"discarded":1}}`, nil, "hmac_keys_updated"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := sample(t, "lagged")
			e := before
			err := e.UnmarshalJSON([]byte(c.in))
			if c.sentinel == nil {
				wantInvalid(t, err, c.member)
			} else {
				wantDecodeErr(t, err, c.sentinel, c.member)
			}
			if !reflect.DeepEqual(e, before) {
				t.Error("a failed decode changed the event")
			}
		})
	}
}

func TestDecodeErrorNamesTheUnknown(t *testing.T) {
	var e ClientEvent
	err := e.UnmarshalJSON([]byte(`{"kind":"message.sent"}`))
	if err == nil || !strings.Contains(err.Error(), `"message.sent"`) {
		t.Errorf("err = %v, want it to name the kind", err)
	}
	err = e.UnmarshalJSON([]byte(`{"kind":"lagged","lagged":{"discarded":1,"extra_member":1}}`))
	if err == nil || !strings.Contains(err.Error(), `"extra_member"`) || !strings.Contains(err.Error(), "lagged") {
		t.Errorf("err = %v, want it to name the member and where", err)
	}
	long := strings.Repeat("k", 500)
	err = e.UnmarshalJSON([]byte(`{"kind":"` + long + `"}`))
	if err == nil || len(err.Error()) > 200 {
		t.Errorf("err = %v: an unknown name is cut short", err)
	}
}

// TestDecodeJSONAcceptsEquivalentForms: member order, whitespace and string
// escapes do not change the value.
func TestDecodeJSONAcceptsEquivalentForms(t *testing.T) {
	in := " {\n \"message_received\" : {\"sender_inbox_id\":\"\\u0078\\n\\ud83d\\ude00\", \"message_id\":\"abab\",\"group_id\":\"6a01\"},\t\"kind\":\"message.received\" } "
	var e ClientEvent
	if err := e.UnmarshalJSON([]byte(in)); err != nil {
		t.Fatal(err)
	}
	want := ClientEvent{Kind: KindMessageReceived, MessageReceived: &MessageReceived{
		GroupID: Bytes{0x6a, 0x01}, MessageID: Bytes{0xab, 0xab}, SenderInboxID: "x\n😀"}}
	if !reflect.DeepEqual(e, want) {
		t.Errorf("got %+v", e.MessageReceived)
	}
}

func mp(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeEventMsgpackStrict(t *testing.T) {
	type m = map[string]any
	lagged := func(p any) m { return m{"kind": "lagged", "lagged": p} }
	cases := []struct {
		name     string
		in       []byte
		sentinel error
		member   string
	}{
		{"unknown kind", mp(t, m{"kind": "lagged2"}), ErrUnknownKind, "kind"},
		{"kind as bin", mp(t, m{"kind": []byte("lagged")}), ErrMalformed, "kind"},
		{"unknown member", mp(t, m{"kind": "lagged", "lagged": m{"discarded": 1}, "x": 1}), ErrUnknownMember, ""},
		{"unknown nested", mp(t, lagged(m{"discarded": 1, "y": true})), ErrUnknownMember, "lagged"},
		{"missing", mp(t, lagged(m{})), ErrMissingMember, "lagged.discarded"},
		{"nil payload", mp(t, lagged(nil)), ErrMalformed, "lagged"},
		{"negative", mp(t, lagged(m{"discarded": -5})), ErrMalformed, "lagged.discarded"},
		{"float", mp(t, lagged(m{"discarded": 1.5})), ErrMalformed, "lagged.discarded"},
		{"string for bin", mp(t, m{"kind": "conversation.fork_detected", "conversation_fork_detected": m{"group_id": "6a01"}}), ErrMalformed, "conversation_fork_detected.group_id"},
		{"bin for string", mp(t, m{"kind": "handle.changed", "handle_changed": m{"inbox_id": []byte("a"), "handle": "h"}}), ErrMalformed, "handle_changed.inbox_id"},
		{"non-string key", []byte{0x81, 0x01, 0x02}, ErrMalformed, ""},
		{"not a map", []byte{0x90}, ErrMalformed, ""},
		{"empty", nil, ErrMalformed, ""},
		{"trailing byte", append(mp(t, lagged(m{"discarded": 1})), 0xc0), ErrMalformed, ""},
		{"huge map length", []byte{0xdf, 0xff, 0xff, 0xff, 0xff, 0xa4, 'k', 'i', 'n', 'd'}, ErrMalformed, ""},
		{"huge string length", []byte{0x81, 0xdb, 0xff, 0xff, 0xff, 0xff}, ErrMalformed, ""},
		{"huge array length", mp(t, m{"kind": "conversation.metadata_changed", "metadata_changed": m{"changed": msgpack.RawMessage{0xdd, 0xff, 0xff, 0xff, 0xff}}}), ErrMalformed, "metadata_changed.changed"},
		{"truncated", laggedMsgpack(t)[:10], ErrMalformed, "kind"},
		{"truncated payload", laggedMsgpack(t)[:20], ErrMalformed, "lagged"},
		{"duplicate", []byte{0x82, 0xa4, 'k', 'i', 'n', 'd', 0xa6, 'l', 'a', 'g', 'g', 'e', 'd', 0xa4, 'k', 'i', 'n', 'd'}, ErrDuplicateMember, "kind"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var e ClientEvent
			wantDecodeErr(t, e.UnmarshalMsgpack(c.in), c.sentinel, c.member)
		})
	}
}

// TestDecodeMsgpackFromGenericEncoder: a map written by a generic msgpack
// library, with other integer widths and key order, decodes.
func TestDecodeMsgpackFromGenericEncoder(t *testing.T) {
	in := mp(t, map[string]any{"kind": "lagged", "lagged": map[string]any{"discarded": int64(300)}})
	var e ClientEvent
	if err := e.UnmarshalMsgpack(in); err != nil {
		t.Fatal(err)
	}
	if e.Lagged == nil || e.Lagged.Discarded != 300 {
		t.Errorf("got %+v", e)
	}
}

func TestDecodeFilterStrict(t *testing.T) {
	cases := []struct {
		name, in string
		sentinel error
		member   string
	}{
		{"unknown kind", `{"kinds":["message.received","message.sent"]}`, ErrUnknownKind, "kinds"},
		{"unknown member", `{"kinds":[],"consent":true}`, ErrUnknownMember, ""},
		{"bad group id", `{"kinds":[],"group_ids":["zz"]}`, ErrMalformed, "group_ids"},
		{"unknown content type member", `{"kinds":[],"content_types":[{"authority_id":"a","type_id":"t","version_major":1,"x":1}]}`, ErrUnknownMember, "content_types[0]"},
		{"null kinds", `{"kinds":null}`, ErrMalformed, "kinds"},
		{"references not bool", `{"kinds":[],"references_own_messages":1}`, ErrMalformed, "references_own_messages"},
		{"empty group id", `{"kinds":[],"group_ids":[""]}`, nil, "group_ids"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var f EventFilter
			err := f.UnmarshalJSON([]byte(c.in))
			if c.sentinel == nil {
				wantInvalid(t, err, c.member)
				return
			}
			wantDecodeErr(t, err, c.sentinel, c.member)
		})
	}
	// Absent kinds (every kind) and empty kinds (none) differ (issue 28,
	// EVENT-020) and survive decoding.
	var noKinds, emptyKinds EventFilter
	if err := noKinds.UnmarshalJSON([]byte(`{"group_ids":[]}`)); err != nil || noKinds.Kinds != nil {
		t.Errorf("absent kinds: %+v %v", noKinds, err)
	}
	if err := emptyKinds.UnmarshalJSON([]byte(`{"kinds":[]}`)); err != nil || emptyKinds.Kinds == nil {
		t.Errorf("present empty kinds: %+v %v", emptyKinds, err)
	}
	// Absent and empty group_ids differ (EVENT-020) and survive decoding.
	var absent, empty EventFilter
	if err := absent.UnmarshalJSON([]byte(`{"kinds":[]}`)); err != nil || absent.GroupIDs != nil || absent.Kinds == nil {
		t.Errorf("absent: %+v %v", absent, err)
	}
	if err := empty.UnmarshalJSON([]byte(`{"kinds":[],"group_ids":[]}`)); err != nil || empty.GroupIDs == nil {
		t.Errorf("present empty: %+v %v", empty, err)
	}
}

func TestDecodeOutcomeStrict(t *testing.T) {
	base := `"message_id":"abab","class":"commit","status":"queued","revision":1`
	cases := []struct {
		name, in string
		sentinel error
		member   string
	}{
		{"time with offset", `{` + base + `,"time":"2026-12-02T15:30:05+01:00"}`, ErrMalformed, "time"},
		{"time not a time", `{` + base + `,"time":"yesterday"}`, ErrMalformed, "time"},
		{"time trailing zeros", `{` + base + `,"time":"2026-12-02T14:30:05.100Z"}`, ErrMalformed, "time"},
		{"empty category", `{` + base + `,"category":"","time":"2026-12-02T14:30:05Z"}`, ErrMalformed, "category"},
		{"empty reason", `{` + base + `,"category":"duplicate","reason":"","time":"2026-12-02T14:30:05Z"}`, ErrMalformed, "reason"},
		{"missing time", `{` + base + `}`, ErrMissingMember, "time"},
		{"unknown member", `{` + base + `,"time":"2026-12-02T14:30:05Z","tenant":"t"}`, ErrUnknownMember, ""},
		{"inconsistent", `{` + base + `,"disposition":"stale","named_outcome":"MissingRetainedAnchor","category":"missing_history","time":"2026-12-02T14:30:05Z"}`, nil, "disposition"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var o Outcome
			err := o.UnmarshalJSON([]byte(c.in))
			if c.sentinel == nil {
				wantInvalid(t, err, c.member)
				return
			}
			wantDecodeErr(t, err, c.sentinel, c.member)
		})
	}
}

func TestDecodeTransportStrict(t *testing.T) {
	cases := []struct {
		name, in string
		sentinel error
		member   string
	}{
		{"unknown member", `{"v":1,"group":"01","kind":"mls","payload":"00","tenant":"x"}`, ErrUnknownMember, ""},
		{"missing payload", `{"v":1,"group":"01","kind":"mls"}`, ErrMissingMember, "payload"},
		{"version 2", `{"v":2,"group":"01","kind":"mls","payload":"00"}`, nil, "v"},
		{"huge version", `{"v":99999999999,"group":"01","kind":"mls","payload":"00"}`, ErrMalformed, "v"},
		{"unknown kind", `{"v":1,"group":"01","kind":"nostr","payload":"00"}`, nil, "kind"},
		{"payload twice", `{"v":1,"group":"01","kind":"mls","payload":"00","payload":"01"}`, ErrDuplicateMember, "payload"},
		{"v twice", `{"v":1,"v":1,"group":"01","kind":"mls","payload":"00"}`, ErrDuplicateMember, "v"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var m TransportMessage
			err := m.UnmarshalJSON([]byte(c.in))
			if c.sentinel == nil {
				wantInvalid(t, err, c.member)
				return
			}
			wantDecodeErr(t, err, c.sentinel, c.member)
		})
	}
	// msgpack octets are bin: group as a str is refused.
	groupStr := []byte{0x84, 0xa1, 'v', 0x01, 0xa5, 'g', 'r', 'o', 'u', 'p', 0xa1, 0x01, 0xa4, 'k', 'i', 'n', 'd', 0xa3, 'm', 'l', 's',
		0xa7, 'p', 'a', 'y', 'l', 'o', 'a', 'd', 0xc4, 0x01, 0x00}
	var m TransportMessage
	wantDecodeErr(t, m.UnmarshalMsgpack(groupStr), ErrMalformed, "group")
}

func TestBytesText(t *testing.T) {
	var b Bytes
	if err := b.UnmarshalText([]byte("00ff10")); err != nil || !b.Equal(Bytes{0, 0xff, 0x10}) {
		t.Errorf("got %x, %v", b, err)
	}
	if err := b.UnmarshalText([]byte("00FF")); err == nil {
		t.Error("uppercase hex accepted")
	}
	if txt, _ := (Bytes{0xab}).MarshalText(); string(txt) != "ab" {
		t.Errorf("MarshalText = %s", txt)
	}
}

func laggedMsgpack(t *testing.T) []byte {
	b, err := sample(t, "lagged").MarshalMsgpack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCommitSupersededBeforeWithdrawnEventIDs: a fabric.commit_superseded
// payload of a version before withdrawn_event_ids still decodes and
// validates.
func TestCommitSupersededBeforeWithdrawnEventIDs(t *testing.T) {
	var e ClientEvent
	old := `{"kind":"fabric.commit_superseded","commit_superseded":{"group_id":"6a01","commit_digest":"` + strings.Repeat("cd", 32) + `"}}`
	if err := e.UnmarshalJSON([]byte(old)); err != nil {
		t.Fatal(err)
	}
	if err := e.Validate(); err != nil || e.CommitSuperseded.WithdrawnEventIDs != nil {
		t.Fatalf("%+v: %v", e.CommitSuperseded, err)
	}
}
