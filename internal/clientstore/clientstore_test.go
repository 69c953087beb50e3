package clientstore

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/thomas-vilte/mls-go/ciphersuite"
	"github.com/thomas-vilte/mls-go/credentials"
	"github.com/thomas-vilte/mls-go/keypackages"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/pkg/schema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const tenant = "acme"

func clientURL(srv string, tenant, clientID string) string {
	return srv + "/v1/tenants/" + tenant + "/clients/" + clientID
}

func TestRegisterEmitsIdentityRegistered(t *testing.T) {
	e := newEnv(t)
	s, srv := e.store()
	ci := register(t, srv, tenant, RegisterRequest{InboxID: inboxOf(1)})

	if len(ci.InstallationKey) != schema.InstallationKeySize || ci.ClientID != hex.EncodeToString(ci.InstallationKey) {
		t.Fatalf("client_id %q is not the hex of a 32-byte installation key", ci.ClientID)
	}
	if ci.InboxID != inboxOf(1) || len(ci.KeyPackages) != DefaultKeyPackages {
		t.Fatalf("answer: inbox %q, %d key packages", ci.InboxID, len(ci.KeyPackages))
	}
	// The KeyPackage is indexed under its ref, and its private keys are in
	// the sealed installation.
	ref, err := engine.KeyPackageRef(ci.KeyPackages[0])
	if err != nil {
		t.Fatal(err)
	}
	got, err := LookupKeyPackage(context.Background(), s.Clients(), tenant, hex.EncodeToString(ref))
	if err != nil || got != ci.ClientID {
		t.Fatalf("key package index: %q, %v", got, err)
	}
	rec, err := Lookup(context.Background(), s.Clients(), tenant, ci.ClientID)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := e.vault.Open(rec.Installation)
	if err != nil {
		t.Fatal(err)
	}
	if inst.ClientID() != ci.ClientID || inst.InboxID() != inboxOf(1) {
		t.Fatal("sealed installation is not the registered one")
	}
	if _, ok := inst.KeyPackageMessage(ref); !ok {
		t.Fatal("sealed installation lacks the handed-out KeyPackage")
	}
	if rec.CredentialHandle != ci.ClientID {
		t.Fatalf("default credential handle %q, want the client id", rec.CredentialHandle)
	}

	evs := e.events(tenant, ci.ClientID)
	if len(evs) != 1 {
		t.Fatalf("%d events, want 1", len(evs))
	}
	ev := evs[0]
	if ev.Event.Kind != schema.KindIdentityRegistered || ev.Event.IdentityRegistered == nil {
		t.Fatalf("event %+v", ev.Event)
	}
	if p := ev.Event.IdentityRegistered; p.InboxID != inboxOf(1) || !bytes.Equal(p.InstallationKey, ci.InstallationKey) {
		t.Fatalf("identity_registered %+v", p)
	}
	if ev.ID != eventID(tenant, ci.ClientID, "registered") {
		t.Fatalf("event id %q", ev.ID)
	}

	var got2 ClientInfo
	if status, raw := do(t, http.MethodGet, clientURL(srv.URL, tenant, ci.ClientID), adminToken(t, tenant), nil, &got2); status != http.StatusOK {
		t.Fatalf("get: %d %s", status, raw)
	}
	if got2.ClientID != ci.ClientID || got2.InboxID != ci.InboxID || len(got2.KeyPackages) != 0 {
		t.Fatalf("get answer %+v", got2)
	}
}

func TestRegisterRefusesBadInput(t *testing.T) {
	e := newEnv(t)
	_, srv := e.store()
	url := srv.URL + "/v1/tenants/" + tenant + "/clients"
	for name, body := range map[string]any{
		"uppercase inbox":   map[string]any{"inbox_id": "AB" + inboxOf(1)[2:]},
		"short inbox":       map[string]any{"inbox_id": "abcd"},
		"too many kps":      map[string]any{"inbox_id": inboxOf(1), "key_packages": MaxKeyPackages + 1},
		"unknown member":    map[string]any{"inbox_id": inboxOf(1), "extra": 1},
		"bad import":        map[string]any{"inbox_id": inboxOf(1), "import": map[string]any{"key_package": "00", "signature_private_key": "00", "encryption_private_key": "00", "init_private_key": "00"}},
		"zero key packages": map[string]any{"inbox_id": inboxOf(1), "key_packages": 0},
	} {
		if status, raw := do(t, http.MethodPost, url, adminToken(t, tenant), body, nil); status != http.StatusBadRequest {
			t.Errorf("%s: %d %s", name, status, raw)
		}
	}
}

func TestFreshKeyPackagesAreIndexedAndSealed(t *testing.T) {
	e := newEnv(t)
	s, srv := e.store()
	ci := register(t, srv, tenant, RegisterRequest{InboxID: inboxOf(2)})
	var ans KeyPackagesAnswer
	if status, raw := do(t, http.MethodPost, clientURL(srv.URL, tenant, ci.ClientID)+"/key-packages", adminToken(t, tenant), KeyPackagesRequest{Count: 3}, &ans); status != http.StatusOK {
		t.Fatalf("key-packages: %d %s", status, raw)
	}
	if len(ans.KeyPackages) != 3 {
		t.Fatalf("%d key packages", len(ans.KeyPackages))
	}
	rec, err := s.Lookup(context.Background(), tenant, ci.ClientID)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := e.vault.Open(rec.Installation)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(inst.KeyPackageRefs()); n != 4 {
		t.Fatalf("sealed installation holds %d KeyPackages, want 4", n)
	}
	for _, kp := range ans.KeyPackages {
		ref, err := engine.KeyPackageRef(kp)
		if err != nil {
			t.Fatal(err)
		}
		if id, err := LookupKeyPackage(context.Background(), s.Clients(), tenant, hex.EncodeToString(ref)); err != nil || id != ci.ClientID {
			t.Fatalf("index: %q %v", id, err)
		}
	}
	if status, _ := do(t, http.MethodPost, clientURL(srv.URL, tenant, ci.ClientID)+"/key-packages", adminToken(t, tenant), KeyPackagesRequest{Count: 0}, nil); status != http.StatusBadRequest {
		t.Fatalf("count 0: %d", status)
	}
	if n := len(e.events(tenant, ci.ClientID)); n != 1 {
		t.Fatalf("%d events, want only identity.registered", n)
	}
}

func putConsent(t *testing.T, srv, clientID string, rec ConsentRecord) consentAnswer {
	t.Helper()
	var ans consentAnswer
	if status, raw := do(t, http.MethodPut, clientURL(srv, tenant, clientID)+"/consent", adminToken(t, tenant), rec, &ans); status != http.StatusOK {
		t.Fatalf("consent: %d %s", status, raw)
	}
	return ans
}

func TestConsentChangedOnlyWhenStoredStateChanges_EVENT009(t *testing.T) {
	e := newEnv(t)
	_, srv := e.store()
	ci := register(t, srv, tenant, RegisterRequest{InboxID: inboxOf(3)})
	group := "0a1b2c3d"
	conv := ConsentRecord{EntityKind: schema.ConsentEntityConversation, Entity: group, State: schema.ConsentAllowed}

	if ans := putConsent(t, srv.URL, ci.ClientID, ConsentRecord{EntityKind: schema.ConsentEntityInbox, Entity: inboxOf(9), State: schema.ConsentUnknown}); ans.Changed {
		t.Fatal("unknown for a record never stored is no change")
	}
	if ans := putConsent(t, srv.URL, ci.ClientID, conv); !ans.Changed {
		t.Fatal("first allowed: not changed")
	}
	if ans := putConsent(t, srv.URL, ci.ClientID, conv); ans.Changed {
		t.Fatal("same consent twice: changed")
	}
	conv.State = schema.ConsentDenied
	putConsent(t, srv.URL, ci.ClientID, conv)
	inbox := ConsentRecord{EntityKind: schema.ConsentEntityInbox, Entity: inboxOf(9), State: schema.ConsentDenied}
	putConsent(t, srv.URL, ci.ClientID, inbox)

	var got ConsentRecord
	if status, raw := do(t, http.MethodGet, clientURL(srv.URL, tenant, ci.ClientID)+"/consent/conversation/"+group, adminToken(t, tenant), nil, &got); status != http.StatusOK || got.State != schema.ConsentDenied {
		t.Fatalf("read back: %d %s", status, raw)
	}

	evs := e.events(tenant, ci.ClientID)[1:] // after identity.registered
	want := []struct {
		kind   schema.ConsentEntityKind
		entity string
		state  schema.ConsentState
		id     string
	}{
		{schema.ConsentEntityConversation, group, schema.ConsentAllowed, eventID(tenant, ci.ClientID, "consent", "conversation", group, "1")},
		{schema.ConsentEntityConversation, group, schema.ConsentDenied, eventID(tenant, ci.ClientID, "consent", "conversation", group, "2")},
		{schema.ConsentEntityInbox, inboxOf(9), schema.ConsentDenied, eventID(tenant, ci.ClientID, "consent", "inbox", inboxOf(9), "1")},
	}
	if len(evs) != len(want) {
		t.Fatalf("%d consent events, want %d", len(evs), len(want))
	}
	for i, w := range want {
		p := evs[i].Event.ConsentChanged
		if evs[i].Event.Kind != schema.KindConsentChanged || p == nil {
			t.Fatalf("event %d: %+v", i, evs[i].Event)
		}
		if p.EntityKind != w.kind || p.Entity != w.entity || p.State != w.state || evs[i].ID != w.id {
			t.Errorf("event %d: %+v id %s", i, p, evs[i].ID)
		}
	}

	for name, body := range map[string]ConsentRecord{
		"uppercase group": {EntityKind: schema.ConsentEntityConversation, Entity: "0A1B", State: schema.ConsentAllowed},
		"short inbox":     {EntityKind: schema.ConsentEntityInbox, Entity: "abcd", State: schema.ConsentAllowed},
		"unknown kind":    {EntityKind: "group", Entity: group, State: schema.ConsentAllowed},
		"unknown state":   {EntityKind: schema.ConsentEntityConversation, Entity: group, State: "maybe"},
	} {
		if status, raw := do(t, http.MethodPut, clientURL(srv.URL, tenant, ci.ClientID)+"/consent", adminToken(t, tenant), body, nil); status != http.StatusBadRequest {
			t.Errorf("%s: %d %s", name, status, raw)
		}
	}
}

// Concurrent writers of one consent entity: every event reports a change
// from the state the previous event reported, in the order of the stored
// versions (EVENT-012).
func TestConsentOrderPerEntity_EVENT012(t *testing.T) {
	e := newEnv(t)
	s, srv := e.store()
	ci := register(t, srv, tenant, RegisterRequest{InboxID: inboxOf(4)})
	states := []schema.ConsentState{schema.ConsentAllowed, schema.ConsentDenied}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 6 {
				rec := ConsentRecord{EntityKind: schema.ConsentEntityInbox, Entity: inboxOf(8), State: states[(w+i)%2]}
				if _, err := s.SetConsent(context.Background(), tenant, ci.ClientID, rec); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	evs := e.events(tenant, ci.ClientID)[1:]
	if len(evs) == 0 {
		t.Fatal("no consent events")
	}
	prev := schema.ConsentUnknown
	for i, ev := range evs {
		p := ev.Event.ConsentChanged
		if p.State == prev {
			t.Fatalf("event %d repeats state %s", i, p.State)
		}
		if ev.ID != eventID(tenant, ci.ClientID, "consent", "inbox", inboxOf(8), strconv.Itoa(i+1)) {
			t.Fatalf("event %d is not version %d", i, i+1)
		}
		prev = p.State
	}
	var got ConsentRecord
	do(t, http.MethodGet, clientURL(srv.URL, tenant, ci.ClientID)+"/consent/inbox/"+inboxOf(8), adminToken(t, tenant), nil, &got)
	if got.State != prev {
		t.Fatalf("stored %s, last event %s", got.State, prev)
	}
}

func TestHMACKeyStoredEmitsOnce(t *testing.T) {
	e := newEnv(t)
	s, srv := e.store()
	ci := register(t, srv, tenant, RegisterRequest{InboxID: inboxOf(5)})
	put := func(key []byte) HMACKeyAnswer {
		var ans HMACKeyAnswer
		if status, raw := do(t, http.MethodPut, clientURL(srv.URL, tenant, ci.ClientID)+"/hmac-keys", adminToken(t, tenant), HMACKeyRequest{RootKey: key}, &ans); status != http.StatusOK {
			t.Fatalf("hmac-keys: %d %s", status, raw)
		}
		return ans
	}
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	if !put(k1).Stored || put(k1).Stored || !put(k2).Stored {
		t.Fatal("stored flags: want new, not new, new")
	}
	keys, err := s.HMACRootKeys(context.Background(), tenant, ci.ClientID)
	if err != nil || len(keys) != 2 || !bytes.Equal(keys[0], k1) || !bytes.Equal(keys[1], k2) {
		t.Fatalf("stored keys: %d, %v", len(keys), err)
	}
	evs := e.events(tenant, ci.ClientID)[1:]
	if len(evs) != 2 {
		t.Fatalf("%d hmac events, want 2", len(evs))
	}
	for i, ev := range evs {
		if ev.Event.Kind != schema.KindHmacKeysUpdated || ev.Event.HmacKeysUpdated == nil {
			t.Fatalf("event %d: %+v", i, ev.Event)
		}
		if ev.ID != eventID(tenant, ci.ClientID, "hmac-key", strconv.Itoa(i+1)) {
			t.Fatalf("event %d id", i)
		}
	}
	if status, _ := do(t, http.MethodPut, clientURL(srv.URL, tenant, ci.ClientID)+"/hmac-keys", adminToken(t, tenant), HMACKeyRequest{RootKey: []byte{1}}, nil); status != http.StatusBadRequest {
		t.Fatalf("short key: %d", status)
	}
}

func hmacEpochEvents(evs []received) []received {
	var out []received
	for _, ev := range evs {
		if ev.Event.Kind == schema.KindHmacKeysUpdated {
			out = append(out, ev)
		}
	}
	return out
}

func TestHMACEpochIncreaseEmitsOnce_EVENT026(t *testing.T) {
	e := newEnv(t)
	s, srv := e.store()
	// A second store over the same NATS, as a second process hosting the
	// same clients: still one event per increase.
	s2, err := New(context.Background(), Config{JS: e.js, Vault: e.vault, Verifier: e.ver, Clock: e.clock, HMACEpochPeriod: testPeriod})
	if err != nil {
		t.Fatal(err)
	}
	running(t, s2)
	ci := register(t, srv, tenant, RegisterRequest{InboxID: inboxOf(6)})
	start := s.epoch(e.clock.Now())

	armed := e.clock.Armed()
	e.clock.Advance(testPeriod / 2) // still the startup epoch
	if n := len(hmacEpochEvents(e.events(tenant, ci.ClientID))); n != 0 {
		t.Fatalf("%d events in the startup epoch", n)
	}
	e.clock.Advance(testPeriod / 2)
	e.clock.WaitArmed(t, armed+2) // both stores handled the boundary
	evs := hmacEpochEvents(e.events(tenant, ci.ClientID))
	if len(evs) != 1 || evs[0].ID != eventID(tenant, ci.ClientID, "hmac-epoch", strconv.FormatInt(start+1, 10)) {
		t.Fatalf("after one increase: %d events", len(evs))
	}
	e.clock.Advance(testPeriod)
	e.clock.WaitArmed(t, armed+4)
	if evs := hmacEpochEvents(e.events(tenant, ci.ClientID)); len(evs) != 2 || evs[1].ID != eventID(tenant, ci.ClientID, "hmac-epoch", strconv.FormatInt(start+2, 10)) {
		t.Fatalf("after two increases: %d events", len(evs))
	}
}

// Epochs reached while no store ran are not reported, nor is the epoch a
// new store starts in; the next increase is (EVENT-026).
func TestHMACEpochNotForClosedOrStartupEpochs_EVENT026(t *testing.T) {
	e := newEnv(t)
	s, srv := e.store()
	ci := register(t, srv, tenant, RegisterRequest{InboxID: inboxOf(7)})
	srv.Close()
	e.stops[s]()

	e.clock.Advance(3 * testPeriod) // closed across three increases
	armed := e.clock.Armed()
	s2, _ := e.store()
	e.clock.WaitArmed(t, armed+1)
	start := s2.epoch(e.clock.Now())
	if n := len(hmacEpochEvents(e.events(tenant, ci.ClientID))); n != 0 {
		t.Fatalf("%d events for epochs passed while closed or the startup epoch", n)
	}
	e.clock.Advance(testPeriod)
	e.clock.WaitArmed(t, armed+2)
	evs := hmacEpochEvents(e.events(tenant, ci.ClientID))
	if len(evs) != 1 || evs[0].ID != eventID(tenant, ci.ClientID, "hmac-epoch", strconv.FormatInt(start+1, 10)) {
		t.Fatalf("%d events after the first increase while open, want 1", len(evs))
	}
}

func putIdentity(t *testing.T, srv, clientID, inbox string, st AssociationState) (int, AssociationAnswer) {
	t.Helper()
	var ans AssociationAnswer
	status, _ := do(t, http.MethodPut, clientURL(srv, tenant, clientID)+"/identities/"+inbox, adminToken(t, tenant), st, &ans)
	return status, ans
}

func handle(s string) *string { return &s }

func key(b byte) schema.Bytes { return bytes.Repeat([]byte{b}, 32) }

func TestHandleChanged_EVENT058(t *testing.T) {
	e := newEnv(t)
	_, srv := e.store()
	ci := register(t, srv, tenant, RegisterRequest{InboxID: inboxOf(10)})
	other := inboxOf(11)
	steps := []struct {
		st     AssociationState
		status int
		stored bool
	}{
		{AssociationState{SequenceID: 5, InstallationKeys: []schema.Bytes{key(1)}, DisplayHandle: handle("alice")}, 200, true},  // first: no event
		{AssociationState{SequenceID: 6, InstallationKeys: []schema.Bytes{key(1)}, DisplayHandle: handle("alice")}, 200, true},  // same handle
		{AssociationState{SequenceID: 7, InstallationKeys: []schema.Bytes{key(1)}, DisplayHandle: handle("bob")}, 200, true},    // event bob
		{AssociationState{SequenceID: 6, InstallationKeys: []schema.Bytes{key(1)}, DisplayHandle: handle("carol")}, 200, false}, // older
		{AssociationState{SequenceID: 7, InstallationKeys: []schema.Bytes{key(2)}}, http.StatusConflict, false},
		{AssociationState{SequenceID: 8, InstallationKeys: []schema.Bytes{key(1)}}, 200, true},                               // no handle
		{AssociationState{SequenceID: 9, InstallationKeys: []schema.Bytes{key(1)}, DisplayHandle: handle("bob")}, 200, true}, // event bob
	}
	for i, s := range steps {
		status, ans := putIdentity(t, srv.URL, ci.ClientID, other, s.st)
		if status != s.status || (status == 200 && ans.Stored != s.stored) {
			t.Fatalf("step %d: status %d stored %v", i, status, ans.Stored)
		}
	}
	evs := e.events(tenant, ci.ClientID)[1:]
	wantIDs := []string{
		eventID(tenant, ci.ClientID, "identity", other, "7", string(schema.KindHandleChanged), ""),
		eventID(tenant, ci.ClientID, "identity", other, "9", string(schema.KindHandleChanged), ""),
	}
	if len(evs) != len(wantIDs) {
		t.Fatalf("%d events, want %d", len(evs), len(wantIDs))
	}
	for i, ev := range evs {
		p := ev.Event.HandleChanged
		if ev.Event.Kind != schema.KindHandleChanged || p == nil || p.InboxID != other || p.Handle != "bob" || ev.ID != wantIDs[i] {
			t.Fatalf("event %d: %+v", i, ev.Event)
		}
	}
	var held AssociationState
	do(t, http.MethodGet, clientURL(srv.URL, tenant, ci.ClientID)+"/identities/"+other, adminToken(t, tenant), nil, &held)
	if held.SequenceID != 9 || held.DisplayHandle == nil || *held.DisplayHandle != "bob" {
		t.Fatalf("held %+v", held)
	}
}

func TestOwnInstallationAddedAndRevoked(t *testing.T) {
	e := newEnv(t)
	_, srv := e.store()
	ci := register(t, srv, tenant, RegisterRequest{InboxID: inboxOf(12)})
	own := ci.InstallationKey
	steps := []AssociationState{
		{SequenceID: 1, InstallationKeys: []schema.Bytes{own}},                                         // first: nothing
		{SequenceID: 2, InstallationKeys: []schema.Bytes{own, key(2), key(3)}},                         // added 2, 3
		{SequenceID: 3, InstallationKeys: []schema.Bytes{own, key(3)}},                                 // revoked 2
		{SequenceID: 4, InstallationKeys: []schema.Bytes{key(3), key(4)}, DisplayHandle: handle("me")}, // added 4, revoked own, handle
	}
	for i, st := range steps {
		if status, _ := putIdentity(t, srv.URL, ci.ClientID, ci.InboxID, st); status != 200 {
			t.Fatalf("step %d: %d", i, status)
		}
	}
	type want struct {
		kind schema.EventKind
		key  schema.Bytes
		this bool
	}
	wants := []want{
		{schema.KindOwnInstallationAdded, key(2), false},
		{schema.KindOwnInstallationAdded, key(3), false},
		{schema.KindOwnInstallationRevoked, key(2), false},
		{schema.KindOwnInstallationAdded, key(4), false},
		{schema.KindOwnInstallationRevoked, own, true},
		{schema.KindHandleChanged, nil, false},
	}
	evs := e.events(tenant, ci.ClientID)[1:]
	if len(evs) != len(wants) {
		t.Fatalf("%d events, want %d", len(evs), len(wants))
	}
	for i, w := range wants {
		ev := evs[i].Event
		if ev.Kind != w.kind {
			t.Fatalf("event %d: kind %s, want %s", i, ev.Kind, w.kind)
		}
		switch w.kind {
		case schema.KindOwnInstallationAdded:
			if !ev.OwnInstallationAdded.InstallationKey.Equal(w.key) {
				t.Errorf("event %d: wrong key", i)
			}
		case schema.KindOwnInstallationRevoked:
			if p := ev.OwnInstallationRevoked; !p.InstallationKey.Equal(w.key) || p.IsThisInstallation != w.this {
				t.Errorf("event %d: %+v", i, p)
			}
		case schema.KindHandleChanged:
			if p := ev.HandleChanged; p.InboxID != ci.InboxID || p.Handle != "me" {
				t.Errorf("event %d: %+v", i, p)
			}
		}
	}
	// Another inbox's installation changes are not the own inbox's.
	putIdentity(t, srv.URL, ci.ClientID, inboxOf(13), AssociationState{SequenceID: 1, InstallationKeys: []schema.Bytes{key(5)}})
	putIdentity(t, srv.URL, ci.ClientID, inboxOf(13), AssociationState{SequenceID: 2, InstallationKeys: []schema.Bytes{key(6)}})
	if n := len(e.events(tenant, ci.ClientID)); n != len(wants)+1 {
		t.Fatalf("another inbox's update emitted %d events", n-len(wants)-1)
	}
	for name, st := range map[string]AssociationState{
		"short key":    {SequenceID: 9, InstallationKeys: []schema.Bytes{{1, 2}}},
		"repeated key": {SequenceID: 9, InstallationKeys: []schema.Bytes{key(1), key(1)}},
		"no keys":      {SequenceID: 9},
		"empty handle": {SequenceID: 9, InstallationKeys: []schema.Bytes{}, DisplayHandle: handle("")},
	} {
		if status, _ := putIdentity(t, srv.URL, ci.ClientID, inboxOf(13), st); status != http.StatusBadRequest {
			t.Errorf("%s: %d", name, status)
		}
	}
}

func TestRefusesOtherTenantsAndScopes(t *testing.T) {
	e := newEnv(t)
	_, srv := e.store()
	ci := register(t, srv, tenant, RegisterRequest{InboxID: inboxOf(14)})
	other := register(t, srv, "globex", RegisterRequest{InboxID: inboxOf(15)})
	cases := []struct {
		name   string
		url    string
		tok    string
		status int
	}{
		{"no token", clientURL(srv.URL, tenant, ci.ClientID), "", http.StatusUnauthorized},
		{"bad token", clientURL(srv.URL, tenant, ci.ClientID), "x.y.z", http.StatusUnauthorized},
		{"other tenant's token", clientURL(srv.URL, tenant, ci.ClientID), adminToken(t, "globex"), http.StatusForbidden},
		{"signals scope", clientURL(srv.URL, tenant, ci.ClientID), token(t, tenant, []string{"*"}, auth.ScopeSignals), http.StatusForbidden},
		{"another client", clientURL(srv.URL, tenant, ci.ClientID), token(t, tenant, []string{other.ClientID}, auth.ScopeAdmin), http.StatusForbidden},
		{"other tenant's client", clientURL(srv.URL, tenant, other.ClientID), adminToken(t, tenant), http.StatusNotFound},
		{"bad client id", clientURL(srv.URL, tenant, "XYZ"), adminToken(t, tenant), http.StatusBadRequest},
	}
	for _, c := range cases {
		if status, raw := do(t, http.MethodGet, c.url, c.tok, nil, nil); status != c.status {
			t.Errorf("%s: %d %s", c.name, status, raw)
		}
	}
	// Nothing reached the other tenant's client.
	if n := len(e.events("globex", other.ClientID)); n != 1 {
		t.Fatalf("other tenant's client has %d events", n)
	}
}

// A new store over the same NATS data, after a server restart, holds every
// change and emits nothing again.
func TestRestartKeepsStateAndEmitsNothingTwice(t *testing.T) {
	e := newEnv(t)
	s, srv := e.store()
	ci := register(t, srv, tenant, RegisterRequest{InboxID: inboxOf(16)})
	conv := ConsentRecord{EntityKind: schema.ConsentEntityConversation, Entity: "abcd", State: schema.ConsentDenied}
	putConsent(t, srv.URL, ci.ClientID, conv)
	putIdentity(t, srv.URL, ci.ClientID, inboxOf(17), AssociationState{SequenceID: 1, InstallationKeys: []schema.Bytes{}, DisplayHandle: handle("a")})
	putIdentity(t, srv.URL, ci.ClientID, inboxOf(17), AssociationState{SequenceID: 2, InstallationKeys: []schema.Bytes{}, DisplayHandle: handle("b")})
	before := e.events(tenant, ci.ClientID)
	srv.Close()
	e.stops[s]()

	e.restartServer()
	_, srv2 := e.store()
	if ans := putConsent(t, srv2.URL, ci.ClientID, conv); ans.Changed {
		t.Fatal("consent state lost across restart")
	}
	if status, ans := putIdentity(t, srv2.URL, ci.ClientID, inboxOf(17), AssociationState{SequenceID: 2, InstallationKeys: []schema.Bytes{}, DisplayHandle: handle("b")}); status != 200 || ans.Stored {
		t.Fatalf("association state lost across restart: %d %+v", status, ans)
	}
	var got ClientInfo
	if status, _ := do(t, http.MethodGet, clientURL(srv2.URL, tenant, ci.ClientID), adminToken(t, tenant), nil, &got); status != 200 || got.ClientID != ci.ClientID {
		t.Fatal("client record lost across restart")
	}
	after := e.events(tenant, ci.ClientID)
	if len(after) != len(before) {
		t.Fatalf("%d events before restart, %d after", len(before), len(after))
	}
	for i := range before {
		if before[i].ID != after[i].ID {
			t.Fatalf("event %d changed", i)
		}
	}
	if len(before) != 3 {
		t.Fatalf("%d events, want registered, consent, handle", len(before))
	}
}

// A registration interrupted after its record was stored (a crash before
// identity.registered) completes with the next request about the client.
func TestInterruptedRegistrationCompletes(t *testing.T) {
	e := newEnv(t)
	s, srv := e.store()
	inst, err := engine.CreateInstallation(bytes.Repeat([]byte{20}, 32), 0)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := e.vault.Seal(inst)
	if err != nil {
		t.Fatal(err)
	}
	rec := Record{Tenant: tenant, ClientID: inst.ClientID(), InboxID: inst.InboxID(), InstallationKey: inst.InstallationKey(), CredentialHandle: inst.ClientID(), Installation: sealed}
	b, err := msgpack.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Clients().Create(context.Background(), tenant+"."+rec.ClientID, b); err != nil {
		t.Fatal(err)
	}
	if n := len(e.events(tenant, rec.ClientID)); n != 0 {
		t.Fatalf("%d events before completion", n)
	}
	for range 2 {
		if status, raw := do(t, http.MethodGet, clientURL(srv.URL, tenant, rec.ClientID), adminToken(t, tenant), nil, nil); status != http.StatusOK {
			t.Fatalf("get: %d %s", status, raw)
		}
	}
	evs := e.events(tenant, rec.ClientID)
	if len(evs) != 1 || evs[0].Event.Kind != schema.KindIdentityRegistered || evs[0].Event.IdentityRegistered.InboxID != rec.InboxID {
		t.Fatalf("events %+v", evs)
	}
}

// Registration can host existing key material: the installation key and
// the KeyPackage are the imported ones.
func TestRegisterImportsKeyMaterial(t *testing.T) {
	e := newEnv(t)
	s, srv := e.store()
	account := bytes.Repeat([]byte{21}, 32)
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cred := &credentials.CredentialWithKey{Credential: credentials.NewBasicCredential(account), SignatureKeyBytes: pub, Ed25519PrivateKey: priv}
	kp, kpPriv, err := keypackages.Generate(cred, ciphersuite.CipherSuite(engine.DefaultCipherSuite))
	if err != nil {
		t.Fatal(err)
	}
	msg := append([]byte{0, 1, 0, byte(engine.WireKeyPackage)}, kp.Marshal()...)
	imp := &ImportMaterial{KeyPackage: msg, SignaturePrivateKey: priv.Seed(), EncryptionPrivateKey: kpPriv.EncryptionKey.Bytes(), InitPrivateKey: kpPriv.InitKey.Bytes()}

	// The KeyPackage's credential must be the inbox registered.
	if status, raw := do(t, http.MethodPost, srv.URL+"/v1/tenants/"+tenant+"/clients", adminToken(t, tenant), RegisterRequest{InboxID: inboxOf(22), Import: imp}, nil); status != http.StatusBadRequest {
		t.Fatalf("import for another inbox: %d %s", status, raw)
	}
	ci := register(t, srv, tenant, RegisterRequest{InboxID: hex.EncodeToString(account), Import: imp})
	if !bytes.Equal(ci.InstallationKey, pub) || len(ci.KeyPackages) != 1 || !bytes.Equal(ci.KeyPackages[0], msg) {
		t.Fatal("imported installation not hosted as given")
	}
	ref, err := engine.KeyPackageRef(msg)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := LookupKeyPackage(context.Background(), s.Clients(), tenant, hex.EncodeToString(ref)); err != nil || id != ci.ClientID {
		t.Fatalf("imported KeyPackage not indexed: %q %v", id, err)
	}
	if status, _ := do(t, http.MethodPost, srv.URL+"/v1/tenants/"+tenant+"/clients", adminToken(t, tenant), RegisterRequest{InboxID: hex.EncodeToString(account), Import: imp}, nil); status != http.StatusConflict {
		t.Fatalf("second import of one installation: %d", status)
	}
	if n := len(e.events(tenant, ci.ClientID)); n != 1 {
		t.Fatalf("%d events, want one identity.registered", n)
	}
}

// Registration and consent speak msgpack too, bytes as bin.
func TestMsgpackBodies(t *testing.T) {
	e := newEnv(t)
	_, srv := e.store()
	send := func(method, url string, body, out any) int {
		b, err := msgpack.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(method, url, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+adminToken(t, tenant))
		req.Header.Set("Content-Type", "application/msgpack")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode < 300 {
			if err := msgpack.NewDecoder(resp.Body).Decode(out); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode
	}
	var ci ClientInfo
	if status := send(http.MethodPost, srv.URL+"/v1/tenants/"+tenant+"/clients", RegisterRequest{InboxID: inboxOf(23)}, &ci); status != http.StatusCreated {
		t.Fatalf("register: %d", status)
	}
	if len(ci.InstallationKey) != 32 || len(ci.KeyPackages) != 1 {
		t.Fatalf("answer %+v", ci)
	}
	var ans consentAnswer
	if status := send(http.MethodPut, clientURL(srv.URL, tenant, ci.ClientID)+"/consent", ConsentRecord{EntityKind: schema.ConsentEntityInbox, Entity: inboxOf(24), State: schema.ConsentAllowed}, &ans); status != 200 || !ans.Changed {
		t.Fatalf("consent: %d %+v", status, ans)
	}
	if n := len(e.events(tenant, ci.ClientID)); n != 2 {
		t.Fatalf("%d events", n)
	}
}

// A 41-byte msgpack body whose root_key bin declares 4 GiB (issue 17
// item 1) is answered 400, ten times, without the server allocating what
// the header claims.
func TestHMACKeyHostileBinLengthIs400WithBoundedMemory(t *testing.T) {
	e := newEnv(t)
	_, srv := e.store()
	ci := register(t, srv, tenant, RegisterRequest{InboxID: inboxOf(27)})
	body := append([]byte("\x81\xa8root_key\xc6\xff\xff\xff\xf0"), bytes.Repeat([]byte{'A'}, 26)...)
	tok := adminToken(t, tenant)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 10 {
		req, _ := http.NewRequest(http.MethodPut, clientURL(srv.URL, tenant, ci.ClientID)+"/hmac-keys", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/msgpack")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("status %d, want 400", resp.StatusCode)
		}
	}
	runtime.ReadMemStats(&after)
	// The server and this client share the process: the bound covers ten
	// requests of both, far below one 4 GiB allocation.
	if n := after.TotalAlloc - before.TotalAlloc; n > 64<<20 {
		t.Fatalf("ten 41-byte requests allocated %d bytes", n)
	}
}

func TestMetricsCountEventsAndRefusals(t *testing.T) {
	e := newEnv(t)
	reg := prometheus.NewRegistry()
	s, err := New(context.Background(), Config{JS: e.js, Vault: e.vault, Verifier: e.ver, Clock: e.clock, HMACEpochPeriod: testPeriod, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	running(t, s)
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	ci := register(t, srv, tenant, RegisterRequest{InboxID: inboxOf(25)})
	rec := ConsentRecord{EntityKind: schema.ConsentEntityInbox, Entity: inboxOf(26), State: schema.ConsentAllowed}
	putConsent(t, srv.URL, ci.ClientID, rec)
	putConsent(t, srv.URL, ci.ClientID, rec)
	do(t, http.MethodGet, clientURL(srv.URL, tenant, ci.ClientID), "", nil, nil)
	for kind, want := range map[schema.EventKind]float64{schema.KindIdentityRegistered: 1, schema.KindConsentChanged: 1} {
		if got := testutil.ToFloat64(s.metrics.events.WithLabelValues(string(kind))); got != want {
			t.Errorf("%s: %v", kind, got)
		}
	}
	if got := testutil.ToFloat64(s.metrics.refusals.WithLabelValues("unauthenticated")); got != 1 {
		t.Errorf("refusals: %v", got)
	}
}

// A KeyPackage a stored join used is retired (Marmot joining.md steps
// 11–12): its private keys leave the sealed installation and its index
// entry goes; the others stay; doing it again changes nothing.
func TestConsumeKeyPackageRetiresOnlyThatOne(t *testing.T) {
	e := newEnv(t)
	s, srv := e.store()
	ci := register(t, srv, tenant, RegisterRequest{InboxID: inboxOf(3)})
	var ans KeyPackagesAnswer
	if status, raw := do(t, http.MethodPost, clientURL(srv.URL, tenant, ci.ClientID)+"/key-packages", adminToken(t, tenant), KeyPackagesRequest{Count: 2}, &ans); status != http.StatusOK {
		t.Fatalf("key-packages: %d %s", status, raw)
	}
	used, err := engine.KeyPackageRef(ans.KeyPackages[0])
	if err != nil {
		t.Fatal(err)
	}
	kept, err := engine.KeyPackageRef(ans.KeyPackages[1])
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 2 {
		if err := ConsumeKeyPackage(ctx, s.Clients(), e.vault, tenant, ci.ClientID, used, DefaultKeyPackagePool); err != nil {
			t.Fatal(err)
		}
		rec, err := s.Lookup(ctx, tenant, ci.ClientID)
		if err != nil {
			t.Fatal(err)
		}
		inst, err := e.vault.Open(rec.Installation)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := inst.KeyPackageMessage(used); ok {
			t.Fatal("the used KeyPackage's keys are still in the installation")
		}
		if _, ok := inst.KeyPackageMessage(kept); !ok {
			t.Fatal("another KeyPackage was retired too")
		}
		if _, err := LookupKeyPackage(ctx, s.Clients(), tenant, hex.EncodeToString(used)); !errors.Is(err, ErrNotFound) {
			t.Fatalf("used KeyPackage still indexed: %v", err)
		}
		if id, err := LookupKeyPackage(ctx, s.Clients(), tenant, hex.EncodeToString(kept)); err != nil || id != ci.ClientID {
			t.Fatalf("kept KeyPackage index: %q %v", id, err)
		}
	}
	// A client that is gone has nothing to retire.
	if err := ConsumeKeyPackage(ctx, s.Clients(), e.vault, tenant, strings.Repeat("ab", 32), used, DefaultKeyPackagePool); err != nil {
		t.Fatalf("unknown client: %v", err)
	}
}

// Issue 19: the KeyPackage pool refills itself when a join consumes one.
// Retiring the used KeyPackage tops the client up to the pool's size with
// fresh KeyPackages, each indexed to the client and listed by GET
// …/key-packages beside the ones it still held; the used one is listed
// nowhere. Retiring it again (a retried transaction) makes nothing new.
func TestConsumedKeyPackageRefillsThePool(t *testing.T) {
	e := newEnv(t)
	s, srv := e.store()
	ci := register(t, srv, tenant, RegisterRequest{InboxID: inboxOf(4)})
	used, err := engine.KeyPackageRef(ci.KeyPackages[0])
	if err != nil {
		t.Fatal(err)
	}
	listed := func() [][]byte {
		t.Helper()
		var ans KeyPackagesAnswer
		if status, raw := do(t, http.MethodGet, clientURL(srv.URL, tenant, ci.ClientID)+"/key-packages", adminToken(t, tenant), nil, &ans); status != http.StatusOK {
			t.Fatalf("GET key-packages: %d %s", status, raw)
		}
		var refs [][]byte
		for _, kp := range ans.KeyPackages {
			ref, err := engine.KeyPackageRef(kp)
			if err != nil {
				t.Fatal(err)
			}
			refs = append(refs, ref)
		}
		return refs
	}
	if refs := listed(); len(refs) != 1 || !bytes.Equal(refs[0], used) {
		t.Fatalf("before the join GET lists %d KeyPackages, want the registered one", len(refs))
	}
	const pool = 3
	ctx := context.Background()
	var first [][]byte
	for i := range 2 {
		if err := ConsumeKeyPackage(ctx, s.Clients(), e.vault, tenant, ci.ClientID, used, pool); err != nil {
			t.Fatal(err)
		}
		refs := listed()
		if len(refs) != pool {
			t.Fatalf("after the join GET lists %d KeyPackages, want the pool's %d", len(refs), pool)
		}
		for _, ref := range refs {
			if bytes.Equal(ref, used) {
				t.Fatal("the used KeyPackage is still listed")
			}
			if id, err := LookupKeyPackage(ctx, s.Clients(), tenant, hex.EncodeToString(ref)); err != nil || id != ci.ClientID {
				t.Fatalf("fresh KeyPackage index: %q %v", id, err)
			}
		}
		if i == 0 {
			first = refs
		} else if !slices.EqualFunc(first, refs, bytes.Equal) {
			t.Fatal("retiring the same KeyPackage again changed the pool")
		}
	}
	if _, err := LookupKeyPackage(ctx, s.Clients(), tenant, hex.EncodeToString(used)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("used KeyPackage still indexed: %v", err)
	}
}
