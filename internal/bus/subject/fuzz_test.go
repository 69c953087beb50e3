package subject

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzTenantGroup: builders taking a tenant and a group never produce a
// subject with a bad token, and parsing what they build gives back the input.
func FuzzTenantGroup(f *testing.F) {
	f.Add(tenant, group)
	f.Add("a", "00")
	f.Add("a.b", "00")
	f.Add("t", "0.")
	f.Add("*", ">")
	f.Add("t ", "00\n")
	f.Fuzz(func(t *testing.T, tn, g string) {
		in, err := Input(tn, g, msgID)
		if err != nil {
			return
		}
		checkSubject(t, in)
		if got, err := ParseInput(in); err != nil || got != (InputSubject{Tenant: tn, GroupHex: g, MessageIDHex: msgID}) {
			t.Fatalf("ParseInput(Input(%q, %q)) = %+v, %v", tn, g, got, err)
		}
		st, err := StoredInput(tn, g, msgID)
		if err != nil {
			t.Fatalf("StoredInput after Input succeeded: %v", err)
		}
		checkSubject(t, st)
		got, err := ParseStoredInput(st)
		if err != nil || got.Tenant != tn || got.GroupHex != g || got.MessageIDHex != msgID || got.Partition < 0 || got.Partition >= Partitions {
			t.Fatalf("ParseStoredInput(%q) = %+v, %v", st, got, err)
		}
		ck, err := Checkpoint(tn, g)
		if err != nil {
			t.Fatal(err)
		}
		checkSubject(t, ck)
		if a, b, err := ParseCheckpoint(ck); err != nil || a != tn || b != g {
			t.Fatalf("ParseCheckpoint(%q) = %q, %q, %v", ck, a, b, err)
		}
		k, err := GroupKey(tn, g)
		if err != nil {
			t.Fatal(err)
		}
		checkSubject(t, k)
		if a, parts, err := ParseKey(k); err != nil || a != tn || len(parts) != 1 || parts[0] != g {
			t.Fatalf("ParseKey(%q) = %q, %q, %v", k, a, parts, err)
		}
	})
}

// FuzzTenantClient covers Events, Live and ClientKey.
func FuzzTenantClient(f *testing.F) {
	f.Add(tenant, client)
	f.Add("t", "ab")
	f.Add("t", "AB")
	f.Add("t\x7f", "ab")
	f.Add("", "")
	f.Fuzz(func(t *testing.T, tn, c string) {
		ev, err := Events(tn, c)
		if err != nil {
			return
		}
		checkSubject(t, ev)
		if a, b, err := ParseEvents(ev); err != nil || a != tn || b != c {
			t.Fatalf("ParseEvents(%q) = %q, %q, %v", ev, a, b, err)
		}
		lv, err := Live(tn, c)
		if err != nil {
			t.Fatal(err)
		}
		checkSubject(t, lv)
		if a, b, err := ParseLive(lv); err != nil || a != tn || b != c {
			t.Fatalf("ParseLive(%q) = %q, %q, %v", lv, a, b, err)
		}
		k, err := ClientKey(tn, c)
		if err != nil {
			t.Fatal(err)
		}
		checkSubject(t, k)
	})
}

// FuzzOutcomeRetained covers Outcome and Retained.
func FuzzOutcomeRetained(f *testing.F) {
	f.Add(tenant, msgID, group, "deferred")
	f.Add("t", strings.ToUpper(msgID), "00", "x.y")
	f.Add("t", msgID[:63]+"g", "00", "")
	f.Fuzz(func(t *testing.T, tn, m, g, r string) {
		if oc, err := Outcome(tn, m); err == nil {
			checkSubject(t, oc)
			if a, b, err := ParseOutcome(oc); err != nil || a != tn || b != m {
				t.Fatalf("ParseOutcome(%q) = %q, %q, %v", oc, a, b, err)
			}
		}
		if rt, err := Retained(tn, g, r); err == nil {
			checkSubject(t, rt)
			if a, b, c, err := ParseRetained(rt); err != nil || a != tn || b != g || c != r {
				t.Fatalf("ParseRetained(%q) = %q, %q, %q, %v", rt, a, b, c, err)
			}
		}
	})
}

// FuzzSplit: split finds the tokens strings.Split finds and refuses what it
// would count differently. Seeds: testdata/fuzz/FuzzSplit.
func FuzzSplit(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string, n uint8) {
		n = n%maxTokens + 1
		toks, err := split(s, prefixEvents, int(n))
		rest, ok := strings.CutPrefix(s, prefixEvents)
		want := strings.Split(rest, ".")
		if !ok || len(want) != int(n) {
			if err == nil {
				t.Fatalf("split(%q, %d) = %q, want an error", s, n, toks)
			}
			return
		}
		if err != nil || [maxTokens]string(append(want, make([]string, maxTokens-len(want))...)) != toks {
			t.Fatalf("split(%q, %d) = %q, %v; want %q", s, n, toks, err, want)
		}
	})
}

// FuzzParse: parsers never panic on arbitrary input, and what they accept
// builds back to the same subject.
func FuzzParse(f *testing.F) {
	f.Add("fabric.in." + tenant + "." + group + "." + msgID)
	f.Add("fabric.in.12." + tenant + "." + group + "." + msgID)
	f.Add("fabric.ev." + tenant + "." + client)
	f.Add("fabric.live.t.00")
	f.Add("fabric.ck.t.00")
	f.Add("fabric.outcome.t." + msgID)
	f.Add("fabric.retained.t.00.deferred")
	f.Add("fabric.intake.t")
	f.Add("fabric.intake.t.x")
	f.Add("fabric.operate.t.00.send_message")
	f.Add("fabric.in.12.t.00")
	f.Add("t.a.b")
	f.Add("fabric.in.t.*")
	f.Add("fabric.in..")
	f.Fuzz(func(t *testing.T, s string) {
		if in, err := ParseInput(s); err == nil {
			if re, _ := Input(in.Tenant, in.GroupHex, in.MessageIDHex); re != s {
				t.Fatalf("ParseInput(%q) rebuilds as %q", s, re)
			}
		}
		if in, err := ParseStoredInput(s); err == nil {
			if re, _ := StoredInput(in.Tenant, in.GroupHex, in.MessageIDHex); re != s || !strings.HasPrefix(s, "fabric.in."+strconv.Itoa(in.Partition)+".") {
				t.Fatalf("ParseStoredInput(%q) rebuilds as %q", s, re)
			}
		}
		if a, b, err := ParseEvents(s); err == nil {
			if re, _ := Events(a, b); re != s {
				t.Fatalf("ParseEvents(%q) rebuilds as %q", s, re)
			}
		}
		if a, b, err := ParseLive(s); err == nil {
			if re, _ := Live(a, b); re != s {
				t.Fatalf("ParseLive(%q) rebuilds as %q", s, re)
			}
		}
		if a, b, err := ParseCheckpoint(s); err == nil {
			if re, _ := Checkpoint(a, b); re != s {
				t.Fatalf("ParseCheckpoint(%q) rebuilds as %q", s, re)
			}
		}
		if a, err := ParseIntake(s); err == nil {
			if re, _ := Intake(a); re != s {
				t.Fatalf("ParseIntake(%q) rebuilds as %q", s, re)
			}
		}
		if a, b, c, err := ParseOperateRequest(s); err == nil {
			if re, _ := OperateRequest(a, b, c); re != s {
				t.Fatalf("ParseOperateRequest(%q) rebuilds as %q", s, re)
			}
		}
		if a, b, err := ParseOutcome(s); err == nil {
			if re, _ := Outcome(a, b); re != s {
				t.Fatalf("ParseOutcome(%q) rebuilds as %q", s, re)
			}
		}
		if a, b, c, err := ParseRetained(s); err == nil {
			if re, _ := Retained(a, b, c); re != s {
				t.Fatalf("ParseRetained(%q) rebuilds as %q", s, re)
			}
		}
		if a, parts, err := ParseKey(s); err == nil {
			if re, _ := Key(a, parts...); re != s {
				t.Fatalf("ParseKey(%q) rebuilds as %q", s, re)
			}
		}
	})
}
