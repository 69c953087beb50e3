package filter

import (
	"encoding/hex"
	"errors"
	"testing"

	"github.com/fabric-mls/fabric/pkg/schema"
)

type dmMap map[string][]byte

func (m dmMap) DMKeys(g []byte) ([]byte, bool) { k, ok := m[string(g)]; return k, ok }

var (
	groupA  = schema.Bytes{0xaa, 0x01}
	groupB  = schema.Bytes{0xbb, 0x02} // another group of A's stitched DM
	groupC  = schema.Bytes{0xcc, 0x03}
	dmKey   = []byte{0xde, 0xad, 0xbe, 0xef}
	text    = schema.ContentTypeID{AuthorityID: "xmtp.org", TypeID: "text", VersionMajor: 1}
	reply   = schema.ContentTypeID{AuthorityID: "xmtp.org", TypeID: "reply", VersionMajor: 1}
	text2   = schema.ContentTypeID{AuthorityID: "xmtp.org", TypeID: "text", VersionMajor: 2}
	resolve = dmMap{string(groupA): dmKey, string(groupB): dmKey}
)

func received(g schema.Bytes, ct *schema.ContentTypeID) *schema.ClientEvent {
	return &schema.ClientEvent{Kind: schema.KindMessageReceived, MessageReceived: &schema.MessageReceived{
		GroupID: g, MessageID: schema.Bytes{1}, ContentType: ct, SenderInboxID: "inbox"}}
}

func mustCompile(t testing.TB, f schema.EventFilter) *Filter {
	t.Helper()
	c, err := Compile(f, resolve)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return c
}

func TestKinds_EVENT020(t *testing.T) {
	ev := received(groupA, &text)
	d := Describe(ev, nil, false)
	if mustCompile(t, schema.EventFilter{Kinds: []schema.EventKind{}}).Match(&d) {
		t.Fatal("empty kinds selected an event")
	}
	// No kinds selects every kind (issue 28), the extension kinds too.
	for _, k := range schema.AllKinds() {
		e := Event{kindBit: kindBit(k)}
		if !mustCompile(t, schema.EventFilter{}).Match(&e) {
			t.Fatalf("a filter without kinds did not select %s", k)
		}
	}
	if !mustCompile(t, schema.EventFilter{Kinds: []schema.EventKind{schema.KindMessageReceived}}).Match(&d) {
		t.Fatal("named kind not selected")
	}
	if mustCompile(t, schema.EventFilter{Kinds: []schema.EventKind{schema.KindConsentChanged}}).Match(&d) {
		t.Fatal("unnamed kind selected")
	}
}

func TestLaggedAlwaysSelected_EVENT022(t *testing.T) {
	ev := &schema.ClientEvent{Kind: schema.KindLagged, Lagged: &schema.Lagged{Discarded: 3}}
	d := Describe(ev, nil, false)
	for _, f := range []schema.EventFilter{
		{Kinds: []schema.EventKind{}},
		{Kinds: []schema.EventKind{schema.KindMessageReceived}, GroupIDs: []schema.Bytes{}, ReferencesOwnMessages: true},
	} {
		if !mustCompile(t, f).Match(&d) {
			t.Fatalf("lagged not selected by %+v", f)
		}
	}
}

func TestGroupIDs_EVENT020(t *testing.T) {
	kinds := []schema.EventKind{schema.KindMessageReceived, schema.KindHmacKeysUpdated, schema.KindConsentChanged}
	inA := Describe(received(groupA, nil), nil, false)
	inC := Describe(received(groupC, nil), nil, false)
	noGroup := Describe(&schema.ClientEvent{Kind: schema.KindHmacKeysUpdated, HmacKeysUpdated: &schema.HmacKeysUpdated{}}, nil, false)
	consentC := Describe(&schema.ClientEvent{Kind: schema.KindConsentChanged, ConsentChanged: &schema.ConsentChanged{
		EntityKind: schema.ConsentEntityConversation, Entity: hex.EncodeToString(groupC), State: schema.ConsentAllowed}}, nil, false)

	absent := mustCompile(t, schema.EventFilter{Kinds: kinds})
	for _, d := range []Event{inA, inC, noGroup, consentC} {
		if !absent.Match(&d) {
			t.Fatal("absent group_ids narrowed an event")
		}
	}
	onlyA := mustCompile(t, schema.EventFilter{Kinds: kinds, GroupIDs: []schema.Bytes{groupA}})
	if !onlyA.Match(&inA) || onlyA.Match(&inC) {
		t.Fatal("group_ids [A] did not select exactly group A")
	}
	if onlyA.Match(&consentC) {
		t.Fatal("a conversation consent event names its group and must be narrowed")
	}
	if !onlyA.Match(&noGroup) {
		t.Fatal("an event naming no group was narrowed")
	}
	none := mustCompile(t, schema.EventFilter{Kinds: kinds, GroupIDs: []schema.Bytes{}})
	if none.Match(&inA) || !none.Match(&noGroup) {
		t.Fatal("present empty group_ids: selects no group, narrows no group-less event")
	}
}

func TestStitchedDM_EVENT020(t *testing.T) {
	kinds := []schema.EventKind{schema.KindMessageReceived}
	key := dmKey
	inB := Describe(received(groupB, nil), key, false)
	inC := Describe(received(groupC, nil), nil, false)
	otherDM := Describe(received(groupC, nil), []byte{0x00, 0x11}, false)

	byA := mustCompile(t, schema.EventFilter{Kinds: kinds, GroupIDs: []schema.Bytes{groupA}})
	if !byA.Match(&inB) {
		t.Fatal("a filter naming one group of the DM did not select the DM's other group")
	}
	if byA.Match(&inC) || byA.Match(&otherDM) {
		t.Fatal("a group outside the DM was selected")
	}
	// A filter naming a group with no DM key does not pick up DM events.
	byC := mustCompile(t, schema.EventFilter{Kinds: kinds, GroupIDs: []schema.Bytes{groupC}})
	if byC.Match(&inB) {
		t.Fatal("DM event selected by a non-DM group")
	}
}

func TestContentTypes_EVENT020(t *testing.T) {
	f := mustCompile(t, schema.EventFilter{
		Kinds:        []schema.EventKind{schema.KindMessageReceived, schema.KindMessageDeleted},
		ContentTypes: []schema.ContentTypeID{text},
	})
	cases := []struct {
		name string
		ev   *schema.ClientEvent
		want bool
	}{
		{"matching", received(groupA, &text), true},
		{"other type", received(groupA, &reply), false},
		{"other major version", received(groupA, &text2), false},
		{"no content type", received(groupA, nil), false},
		{"other kind not narrowed", &schema.ClientEvent{Kind: schema.KindMessageDeleted, MessageDeleted: &schema.MessageDeleted{
			GroupID: groupA, MessageID: schema.Bytes{1}, Cause: schema.DeletionDeleted}}, true},
	}
	for _, c := range cases {
		d := Describe(c.ev, nil, false)
		if got := f.Match(&d); got != c.want {
			t.Errorf("%s: match = %v, want %v", c.name, got, c.want)
		}
	}
	absent := mustCompile(t, schema.EventFilter{Kinds: []schema.EventKind{schema.KindMessageReceived}})
	d := Describe(received(groupA, nil), nil, false)
	if !absent.Match(&d) {
		t.Fatal("absent content_types narrowed a message without a content type")
	}
}

func TestReferencesOwnMessages_EVENT021(t *testing.T) {
	kinds := []schema.EventKind{schema.KindMessageReceived, schema.KindMessageDeleted}
	on := mustCompile(t, schema.EventFilter{Kinds: kinds, ReferencesOwnMessages: true})
	off := mustCompile(t, schema.EventFilter{Kinds: kinds})
	own := Describe(received(groupA, &reply), nil, true)
	notOwn := Describe(received(groupA, &reply), nil, false)
	deleted := Describe(&schema.ClientEvent{Kind: schema.KindMessageDeleted, MessageDeleted: &schema.MessageDeleted{
		GroupID: groupA, MessageID: schema.Bytes{1}, Cause: schema.DeletionDeleted}}, nil, false)
	if !on.Match(&own) || on.Match(&notOwn) {
		t.Fatal("references_own_messages did not follow Fabric-References-Own")
	}
	if !on.Match(&deleted) {
		t.Fatal("references_own_messages narrowed a kind other than message.received")
	}
	if !off.Match(&notOwn) {
		t.Fatal("absent references_own_messages narrowed")
	}
}

func TestCompileRefusesMalformed(t *testing.T) {
	many := make([]schema.Bytes, MaxGroupIDs+1)
	for i := range many {
		many[i] = schema.Bytes{byte(i), byte(i >> 8)}
	}
	for name, f := range map[string]schema.EventFilter{
		"unknown kind":   {Kinds: []schema.EventKind{"no.such"}},
		"empty group id": {Kinds: []schema.EventKind{}, GroupIDs: []schema.Bytes{{}}},
		"too many":       {Kinds: []schema.EventKind{}, GroupIDs: many},
	} {
		if _, err := Compile(f, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	f := mustCompile(t, schema.EventFilter{
		Kinds:        []schema.EventKind{schema.KindMessageReceived},
		GroupIDs:     []schema.Bytes{groupA, groupC},
		ContentTypes: []schema.ContentTypeID{reply, text},
	})
	d := Describe(received(groupB, &text), dmKey, false)
	if n := testing.AllocsPerRun(100, func() { f.Match(&d) }); n != 0 {
		t.Fatalf("Match allocates %v times", n)
	}
}

func BenchmarkMatch(b *testing.B) {
	f := mustCompile(b, schema.EventFilter{
		Kinds:        []schema.EventKind{schema.KindMessageReceived, schema.KindConsentChanged},
		GroupIDs:     []schema.Bytes{groupA, groupC},
		ContentTypes: []schema.ContentTypeID{reply, text},
	})
	d := Describe(received(groupB, &text), dmKey, false)
	b.ReportAllocs()
	for b.Loop() {
		if !f.Match(&d) {
			b.Fatal("no match")
		}
	}
}

func BenchmarkMatchKindsOnly(b *testing.B) {
	f := mustCompile(b, schema.EventFilter{Kinds: []schema.EventKind{schema.KindConsentChanged}})
	d := Describe(received(groupA, &text), nil, false)
	b.ReportAllocs()
	for b.Loop() {
		f.Match(&d)
	}
}

// A group that becomes a stitched DM's after the filter was compiled is
// matched through the DM once the filter knows it (EVENT-020): Stitched adds
// the key only for a group the filter names, and leaves the original as is.
func TestStitchedLater_EVENT020(t *testing.T) {
	f, err := Compile(schema.EventFilter{Kinds: []schema.EventKind{schema.KindMessageReceived}, GroupIDs: []schema.Bytes{groupA}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	inB := Describe(received(groupB, &text), dmKey, false)
	if f.Match(&inB) {
		t.Fatal("matched through a DM the filter does not know")
	}
	if g := f.Stitched(groupC, dmKey); g != f {
		t.Fatal("a group the filter does not name changed it")
	}
	g := f.Stitched(groupA, dmKey)
	if !g.Match(&inB) {
		t.Fatal("another group of the stitched DM not matched")
	}
	if f.Match(&inB) {
		t.Fatal("Stitched changed the original filter")
	}
	if g.Stitched(groupA, dmKey) != g {
		t.Fatal("a known key copied the filter again")
	}
}
