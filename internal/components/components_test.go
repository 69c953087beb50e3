package components

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"

	mls "github.com/thomas-vilte/mls-go"
	"github.com/thomas-vilte/mls-go/ciphersuite"
	"github.com/thomas-vilte/mls-go/group"
)

func acct(b byte) AccountID {
	var a AccountID
	a[0], a[31] = b, b
	return a
}

func fullSet() Set {
	floor := "1.2.0"
	dm := NewDM(acct(9), acct(3))
	return Set{
		Profile:       &ProfileState{Name: "team", Description: "the team"},
		Avatar:        &AvatarState{URL: "https://example.org/a.png", Dim: []byte("512x512")},
		Retention:     &RetentionState{DisappearingSecs: 86400},
		Admins:        []AccountID{acct(2), acct(1)},
		SuperAdmins:   []AccountID{acct(1)},
		Permissions:   PermissionPolicy{ActionAddMember: PolicyAllow, ActionUpdatePermissions: PolicySuperAdmin},
		ProtocolFloor: &floor,
		Conversation:  &dm,
		Other:         map[ID][]byte{0x0042: {1, 2, 3}, 0xC001: {}},
	}
}

func TestRoundTrip(t *testing.T) {
	b, err := Encode(fullSet())
	if err != nil {
		t.Fatal(err)
	}
	s, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, b2) {
		t.Fatalf("re-encoding differs:\n%x\n%x", b, b2)
	}
	if s.Profile.Name != "team" || s.Retention.DisappearingSecs != 86400 || *s.ProtocolFloor != "1.2.0" {
		t.Fatalf("decoded %+v", s)
	}
	if s.Admins[0] != acct(1) || s.Admins[1] != acct(2) {
		t.Fatalf("admins not sorted: %x", s.Admins)
	}
	peer, ok := s.Conversation.PeerOf(acct(9))
	if !ok || peer != acct(3) {
		t.Fatalf("PeerOf = %x %v", peer, ok)
	}
	if !bytes.Equal(s.Other[0x0042], []byte{1, 2, 3}) || s.Other[0xC001] == nil {
		t.Fatalf("unknown components not preserved: %v", s.Other)
	}
	if len(Diff(fullSet(), s)) != 0 {
		t.Fatalf("Diff of equal sets = %v", Diff(fullSet(), s))
	}
}

// The documented byte layout, pinned.
func TestEncodeLayout(t *testing.T) {
	r := RetentionState{DisappearingSecs: 1}
	b, err := Encode(Set{Retention: &r, Other: map[ID][]byte{0x0001: {0xAA}}})
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{
		15,         // entries<V>
		0x00, 0x01, // component_id 0x0001
		1, 0xAA, // data<V>
		0x80, 0x05, // component_id 0x8005
		8, 0, 0, 0, 0, 0, 0, 0, 1, // uint64 disappearing_message_secs
	}
	if !bytes.Equal(b, want) {
		t.Fatalf("got %x want %x", b, want)
	}
	empty, _ := Encode(Set{})
	if !bytes.Equal(empty, []byte{0}) {
		t.Fatalf("empty set = %x", empty)
	}
}

func TestDecodeRejects(t *testing.T) {
	cases := map[string][]byte{
		"empty input":          {},
		"trailing":             {0, 0},
		"truncated id":         {1, 0x80},
		"descending ids":       {6, 0x80, 0x05, 0, 0x80, 0x01, 0},
		"duplicate ids":        {6, 0x00, 0x05, 0, 0x00, 0x05, 0},
		"non-minimal varint":   {0x40, 0x00},
		"0b11 prefix":          {0xC0, 0, 0, 0, 0, 0, 0, 0},
		"length beyond":        {5, 0x00},
		"retention short":      {4, 0x80, 0x05, 1, 0},
		"empty admin list":     {4, 0x80, 0x03, 1, 0},
		"admin list ragged":    {5, 0x80, 0x03, 2, 1, 7},
		"conversation unknown": {4, 0xFA, 0x04, 1, 7},
		"policy bad action":    {6, 0xFA, 0x02, 3, 2, 9, 0},
		"profile not utf8":     {7, 0x80, 0x01, 4, 2, 0xff, 0xfe, 0},
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := Decode(in); !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode(%x) err = %v, want ErrMalformed", in, err)
			}
		})
	}
}

func TestEncodeRejectsInvalidSet(t *testing.T) {
	long := string(make([]byte, MaxNameLen+1))
	bad := []Set{
		{Profile: &ProfileState{Name: long}},
		{Admins: []AccountID{}},
		{Admins: []AccountID{acct(1), acct(1)}},
		{Other: map[ID][]byte{Profile: {0}}},
		{Conversation: &ConversationState{Kind: KindDM}},
	}
	for i, s := range bad {
		if _, err := Encode(s); err == nil {
			t.Errorf("set %d encoded", i)
		}
	}
}

// EVENT-019: one entry per changed item, META-040 field name, else component
// name, else component:xxxx.
func TestDiffNames_EVENT019(t *testing.T) {
	old := fullSet()
	next := old.Clone()
	next.Profile.Name = "renamed"
	next.Retention.DisappearingSecs = 0
	next.Admins = append(next.Admins, acct(5))
	next.Other[0x0042] = []byte{9}
	delete(next.Other, 0xC001)
	next.Other[0xBEEF] = nil
	got := Diff(old, next)
	want := []string{"component:0042", FieldGroupName, NameAdminList, FieldDisappearInNS, "component:beef", "component:c001"}
	if !slices.Equal(got, want) {
		t.Fatalf("Diff = %q, want %q", got, want)
	}
	if old.Profile.Name != "team" {
		t.Fatal("Clone shares the profile")
	}

	both := old.Clone()
	both.Profile = &ProfileState{Name: "x", Description: "y"}
	floor := "2.0.0"
	both.ProtocolFloor = &floor
	both.Avatar = nil
	both.Permissions = nil
	both.SuperAdmins = nil
	both.Conversation = &ConversationState{Kind: KindGroup}
	got = Diff(old, both)
	want = []string{FieldGroupName, FieldDescription, FieldGroupImageURL, NameSuperAdminList, NamePermissionPolicy, FieldMinProtocol, NameConversationType}
	if !slices.Equal(got, want) {
		t.Fatalf("Diff = %q, want %q", got, want)
	}
	if d := Diff(Set{}, Set{Profile: &ProfileState{}}); !slices.Equal(d, []string{FieldGroupName}) {
		t.Fatalf("adding an empty profile: %q", d)
	}
}

func TestAuthorize(t *testing.T) {
	admin, super, member := acct(2), acct(1), acct(7)
	parent := fullSet()
	parent.Permissions = nil
	withName := parent.Clone()
	withName.Profile.Name = "new"
	withAdmin := parent.Clone()
	withAdmin.Admins = append(withAdmin.Admins, member)
	withPolicy := parent.Clone()
	withPolicy.Permissions = PermissionPolicy{ActionAddMember: PolicyAllow}
	floor := "9.0.0"
	withFloor := parent.Clone()
	withFloor.ProtocolFloor = &floor
	group := parent.Clone()
	group.Conversation = &ConversationState{Kind: KindGroup}

	comp := []Op{{Type: OpComponents, Proposer: member}}
	tests := []struct {
		name       string
		next       Set
		committer  AccountID
		ops        []Op
		ok         bool
		privileged bool
	}{
		{"self update by member", parent, member, []Op{{Type: OpUpdate, Proposer: member}}, true, false},
		{"leave request committed by member", parent, member, []Op{{Type: OpRemove, Proposer: admin, Target: admin, SelfTarget: true}}, true, false},
		{"member removes other", parent, member, []Op{{Type: OpRemove, Proposer: member, Target: admin}}, false, true},
		{"admin removes other", parent, admin, []Op{{Type: OpRemove, Proposer: admin, Target: member}}, true, true},
		{"member adds", parent, member, []Op{{Type: OpAdd, Proposer: member}}, false, true},
		{"admin adds", parent, admin, []Op{{Type: OpAdd, Proposer: admin}}, true, true},
		{"member renames", withName, member, comp, false, true},
		{"admin commits member's rename proposal", withName, admin, comp, true, true},
		{"admin adds admin", withAdmin, admin, comp, true, true},
		{"admin changes policy", withPolicy, admin, comp, false, true},
		{"super admin changes policy", withPolicy, super, comp, true, true},
		{"admin raises floor", withFloor, admin, comp, false, true},
		{"super admin changes conversation type", group, super, comp, false, true},
		{"psk by member", parent, member, []Op{{Type: OpPSK, Proposer: member}}, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Authorize(parent, tc.next, tc.committer, tc.ops)
			if (err == nil) != tc.ok {
				t.Fatalf("Authorize = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrUnauthorized) {
				t.Fatalf("error %v is not ErrUnauthorized", err)
			}
			if p := Privileged(parent, tc.next, tc.ops); p != tc.privileged {
				t.Fatalf("Privileged = %v, want %v", p, tc.privileged)
			}
		})
	}

	open := Set{}
	if Authorize(open, open, member, []Op{{Type: OpAdd, Proposer: member}}) != nil {
		t.Fatal("a group without admin components refused an add")
	}
	allow := parent.Clone()
	allow.Permissions = PermissionPolicy{ActionAddMember: PolicyAllow}
	if Authorize(allow, allow, member, []Op{{Type: OpAdd, Proposer: member}}) != nil {
		t.Fatal("policy allow refused a member's add")
	}
	if !IsAdmin(parent, admin.InboxID()) || !IsAdmin(parent, super.InboxID()) || IsAdmin(parent, member.InboxID()) || IsAdmin(parent, "zz") {
		t.Fatal("IsAdmin wrong")
	}
	if !IsSuperAdmin(parent, super.InboxID()) || IsSuperAdmin(parent, admin.InboxID()) {
		t.Fatal("IsSuperAdmin wrong")
	}
}

// A group whose GroupContext carries the components extension can be joined
// with mls-go (register.go), and the joiner reads the components back.
func TestJoinGroupWithComponents(t *testing.T) {
	ctx := context.Background()
	cs := ciphersuite.MLS128DHKEMX25519
	alice, bob := acct(1), acct(2)
	a, err := mls.NewClient(alice[:], cs)
	if err != nil {
		t.Fatal(err)
	}
	b, err := mls.NewClient(bob[:], cs)
	if err != nil {
		t.Fatal(err)
	}
	kpA, err := a.FreshKeyPackageBytes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ext, err := ToExtension(Set{Admins: []AccountID{alice}, Profile: &ProfileState{Name: "g"}})
	if err != nil {
		t.Fatal(err)
	}
	gid, err := a.CreateGroupWithExtensions(ctx, []byte("components-test!"), kpA, []group.Extension{ext})
	if err != nil {
		t.Fatal(err)
	}
	kpB, err := b.FreshKeyPackageBytes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, welcome, err := a.InviteMember(ctx, gid, kpB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.JoinGroup(ctx, welcome); err != nil {
		t.Fatalf("join a group with the components extension: %v", err)
	}
	info, err := b.GroupInfo(ctx, gid)
	if err != nil {
		t.Fatal(err)
	}
	if len(info) == 0 {
		t.Fatal("no group info")
	}
}

func TestFromExtensions(t *testing.T) {
	ext, _ := ToExtension(Set{Profile: &ProfileState{Name: "n"}})
	s, found, err := FromExtensions([]group.Extension{{Type: 3, Data: []byte{0}}, ext})
	if err != nil || !found || s.Profile.Name != "n" {
		t.Fatalf("FromExtensions = %+v %v %v", s, found, err)
	}
	if _, _, err := FromExtensions([]group.Extension{ext, ext}); !errors.Is(err, ErrDuplicateExtension) {
		t.Fatalf("duplicate: %v", err)
	}
	if _, found, err := FromExtensions(nil); found || err != nil {
		t.Fatal("absent extension")
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte{0})
	f.Add(MustEncode(fullSet()))
	f.Add(MustEncode(Set{Conversation: &ConversationState{Kind: KindGroup}}))
	f.Add([]byte{4, 0x80, 0x05, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not ErrMalformed: %v", err)
			}
			return
		}
		// What decodes re-encodes to the same bytes: the encoding is canonical.
		out, err := Encode(s)
		if err != nil {
			t.Fatalf("decoded set does not encode: %v", err)
		}
		if !bytes.Equal(out, b) {
			t.Fatalf("not canonical:\n in %x\nout %x", b, out)
		}
		_ = Diff(s, Set{})
	})
}
