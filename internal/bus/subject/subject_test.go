package subject

import (
	"errors"
	"strings"
	"testing"
	"unicode"
)

const (
	tenant = "acme_1-x"
	group  = "00ff10ab"
	client = "c0ffee"
	msgID  = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

func TestBuilders(t *testing.T) {
	cases := []struct {
		name string
		got  func() (string, error)
		want string
	}{
		{"Input", func() (string, error) { return Input(tenant, group, msgID) }, "fabric.in.acme_1-x.00ff10ab." + msgID},
		{"InputByID", func() (string, error) { return InputByID(tenant, msgID) }, "fabric.in.*.acme_1-x.*." + msgID},
		{"Events", func() (string, error) { return Events(tenant, client) }, "fabric.ev.acme_1-x.c0ffee"},
		{"Live", func() (string, error) { return Live(tenant, client) }, "fabric.live.acme_1-x.c0ffee"},
		{"LiveTenant", func() (string, error) { return LiveTenant(tenant) }, "fabric.live.acme_1-x.*"},
		{"Checkpoint", func() (string, error) { return Checkpoint(tenant, group) }, "fabric.ck.acme_1-x.00ff10ab"},
		{"Outcome", func() (string, error) { return Outcome(tenant, msgID) }, "fabric.outcome.acme_1-x." + msgID},
		{"Retained", func() (string, error) { return Retained(tenant, group, "unknown_group") }, "fabric.retained.acme_1-x.00ff10ab.unknown_group"},
		{"RetainedGroup", func() (string, error) { return RetainedGroup(tenant, group) }, "fabric.retained.acme_1-x.00ff10ab.*"},
		{"RetainedTenant", func() (string, error) { return RetainedTenant(tenant) }, "fabric.retained.acme_1-x.>"},
		{"RetainedReason", func() (string, error) { return RetainedReason("deferred") }, "fabric.retained.*.*.deferred"},
		{"Intake", func() (string, error) { return Intake(tenant) }, "fabric.intake.acme_1-x"},
		{"OperateRequest", func() (string, error) { return OperateRequest(tenant, client, "send_message") }, "fabric.operate.acme_1-x.c0ffee.send_message"},
		{"BridgeRequest", func() (string, error) { return BridgeRequest(tenant, "bridge-acme_2") }, "fabric.bridge.acme_1-x.bridge-acme_2"},
		{"InputPartition", func() (string, error) { return InputPartition(63) }, "fabric.in.63.>"},
		{"ClientKey", func() (string, error) { return ClientKey(tenant, client) }, "acme_1-x.c0ffee"},
		{"GroupKey", func() (string, error) { return GroupKey(tenant, group) }, "acme_1-x.00ff10ab"},
		{"Key", func() (string, error) { return Key(tenant, "consent", client) }, "acme_1-x.consent.c0ffee"},
	}
	for _, c := range cases {
		got, err := c.got()
		if err != nil || got != c.want {
			t.Errorf("%s = %q, %v; want %q", c.name, got, err, c.want)
		}
	}
}

// TestRejectsBadTokens_EVENT056: nothing that could widen a subscription
// or cross a tenant boundary reaches a subject.
func TestRejectsBadTokens_EVENT056(t *testing.T) {
	badTenants := []string{"", "a.b", "*", ">", "a b", "a\tb", "a\x00", "A", "é", "a\nb", strings.Repeat("a", MaxTenantLen+1), "a/b"}
	for _, bad := range badTenants {
		for name, build := range map[string]func() (string, error){
			"Input":          func() (string, error) { return Input(bad, group, msgID) },
			"InputByID":      func() (string, error) { return InputByID(bad, msgID) },
			"Events":         func() (string, error) { return Events(bad, client) },
			"Live":           func() (string, error) { return Live(bad, client) },
			"LiveTenant":     func() (string, error) { return LiveTenant(bad) },
			"Intake":         func() (string, error) { return Intake(bad) },
			"OperateRequest": func() (string, error) { return OperateRequest(bad, client, "leave") },
			"BridgeRequest":  func() (string, error) { return BridgeRequest(bad, "b") },
			"RetainedTenant": func() (string, error) { return RetainedTenant(bad) },
			"Outcome":        func() (string, error) { return Outcome(bad, msgID) },
			"Key":            func() (string, error) { return Key(bad, "x") },
		} {
			s, err := build()
			checkInvalid(t, name, bad, s, err, RoleTenant)
		}
	}
	badHex := []string{"", "0", "0g", "AB", "a.", "**", "> ", "0\x00", strings.Repeat("ab", MaxGroupHexLen)}
	for _, bad := range badHex {
		s, err := Input(tenant, bad, msgID)
		checkInvalid(t, "Input", bad, s, err, RoleGroup)
		s, err = StoredInput(tenant, bad, msgID)
		checkInvalid(t, "StoredInput", bad, s, err, RoleGroup)
		s, err = Events(tenant, bad)
		checkInvalid(t, "Events", bad, s, err, RoleClient)
		s, err = Outcome(tenant, bad)
		checkInvalid(t, "Outcome", bad, s, err, RoleMessageID)
	}
	s, err := Outcome(tenant, msgID[:62])
	checkInvalid(t, "Outcome", msgID[:62], s, err, RoleMessageID)
	s, err = Retained(tenant, group, "a.b")
	checkInvalid(t, "Retained", "a.b", s, err, RoleReason)
	s, err = Key(tenant)
	checkInvalid(t, "Key", "", s, err, RoleKeyPart)
	for _, bad := range badTenants {
		s, err = BridgeRequest(tenant, bad)
		checkInvalid(t, "BridgeRequest", bad, s, err, RoleConsumer)
	}
	for _, p := range []int{-1, Partitions} {
		s, err = InputPartition(p)
		checkInvalid(t, "InputPartition", "", s, err, RolePartition)
	}
}

func checkInvalid(t *testing.T, name, bad, s string, err error, role string) {
	t.Helper()
	var ite *InvalidTokenError
	if !errors.As(err, &ite) {
		t.Errorf("%s(%q) = %q, %v; want *InvalidTokenError", name, bad, s, err)
		return
	}
	if ite.Role != role {
		t.Errorf("%s(%q): role %q, want %q", name, bad, ite.Role, role)
	}
	if s != "" {
		t.Errorf("%s(%q) returned subject %q with an error", name, bad, s)
	}
	if len(bad) > 1 && strings.Contains(err.Error(), bad) {
		t.Errorf("%s: error %q echoes the token", name, err)
	}
}

func TestParseRoundTrip(t *testing.T) {
	in, _ := Input(tenant, group, msgID)
	if got, err := ParseInput(in); err != nil || got != (InputSubject{Tenant: tenant, GroupHex: group, MessageIDHex: msgID}) {
		t.Errorf("ParseInput = %+v %v", got, err)
	}
	st, _ := StoredInput(tenant, group, msgID)
	p, _ := Partition(tenant, group)
	if got, err := ParseStoredInput(st); err != nil || got != (InputSubject{Partition: p, Tenant: tenant, GroupHex: group, MessageIDHex: msgID}) {
		t.Errorf("ParseStoredInput = %+v %v", got, err)
	}
	ev, _ := Events(tenant, client)
	if tn, c, err := ParseEvents(ev); err != nil || tn != tenant || c != client {
		t.Errorf("ParseEvents = %q %q %v", tn, c, err)
	}
	lv, _ := Live(tenant, client)
	if tn, c, err := ParseLive(lv); err != nil || tn != tenant || c != client {
		t.Errorf("ParseLive = %q %q %v", tn, c, err)
	}
	ck, _ := Checkpoint(tenant, group)
	if tn, g, err := ParseCheckpoint(ck); err != nil || tn != tenant || g != group {
		t.Errorf("ParseCheckpoint = %q %q %v", tn, g, err)
	}
	oc, _ := Outcome(tenant, msgID)
	if tn, m, err := ParseOutcome(oc); err != nil || tn != tenant || m != msgID {
		t.Errorf("ParseOutcome = %q %q %v", tn, m, err)
	}
	br, _ := BridgeRequest(tenant, "b1")
	if tn, c, err := ParseBridgeRequest(br); err != nil || tn != tenant || c != "b1" {
		t.Errorf("ParseBridgeRequest = %q %q %v", tn, c, err)
	}
	if _, _, err := ParseBridgeRequest("fabric.bridge.acme.b1.x"); err == nil {
		t.Error("ParseBridgeRequest read a subject of more tokens")
	}
	rt, _ := Retained(tenant, group, "deferred")
	if tn, g, r, err := ParseRetained(rt); err != nil || tn != tenant || g != group || r != "deferred" {
		t.Errorf("ParseRetained = %q %q %q %v", tn, g, r, err)
	}
	k, _ := Key(tenant, "hmac", client)
	if tn, parts, err := ParseKey(k); err != nil || tn != tenant || strings.Join(parts, "|") != "hmac|"+client {
		t.Errorf("ParseKey = %q %q %v", tn, parts, err)
	}
}

func TestParseRejects(t *testing.T) {
	for _, s := range []string{
		"", "fabric.in", "fabric.in.acme", "fabric.in.acme.00", "fabric.in.acme.00." + msgID + ".extra",
		"fabric.ev.acme.00ff." + msgID, "fabric.in.acme.*." + msgID, "fabric.in.acme.00.>", "fabric.in.Acme.00." + msgID,
		"fabric.in..00." + msgID, "fabric.in.acme.0." + msgID, "fabric.in.acme.00.0123", "other.in.acme.00." + msgID,
	} {
		if _, err := ParseInput(s); err == nil {
			t.Errorf("ParseInput(%q) succeeded", s)
		}
	}
	in, _ := StoredInput(tenant, group, msgID)
	p, _ := Partition(tenant, group)
	wrong := strings.Replace(in, ".in."+itoa(p)+".", ".in."+itoa((p+1)%Partitions)+".", 1)
	tail := "." + tenant + "." + group + "." + msgID
	for _, s := range []string{wrong, "fabric.in.064" + tail, "fabric.in.64" + tail, "fabric.in.-1" + tail, "fabric.in." + itoa(p) + "." + tenant + "." + group} {
		if _, err := ParseStoredInput(s); err == nil {
			t.Errorf("ParseStoredInput(%q) succeeded", s)
		}
	}
}

func itoa(i int) string {
	s, _ := InputPartition(i)
	return strings.TrimSuffix(strings.TrimPrefix(s, "fabric.in."), ".>")
}

// checkSubject fails when s has a token that is empty, a wildcard, or holds
// a byte outside printable non-space ASCII.
func checkSubject(t *testing.T, s string) {
	t.Helper()
	for _, tok := range strings.Split(s, ".") {
		if tok == "" || tok == "*" || tok == ">" {
			t.Fatalf("subject %q has token %q", s, tok)
		}
		for _, r := range tok {
			if r > unicode.MaxASCII || !unicode.IsPrint(r) || unicode.IsSpace(r) || r == '*' || r == '>' {
				t.Fatalf("subject %q has byte %q", s, r)
			}
		}
	}
}

func BenchmarkEvents(b *testing.B) {
	for b.Loop() {
		if _, err := Events(tenant, client); err != nil {
			b.Fatal(err)
		}
	}
}
