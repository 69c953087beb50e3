package tests

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Issue 28, item 7: the Go SDK registers a hosted client and mints a
// connection token for it (POST …/clients, POST …/connection-tokens;
// docs/client-stores.md, docs/auth.md) against a real all-in-one, and the
// token it minted connects, subscribes to that client (its
// identity.registered, from the stream) and to no other.
func TestGoSDKRegistersClientsAndMintsConnectionTokens(t *testing.T) {
	t.Parallel()
	f := startAllInOne(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := client.NewAdmin(f.url, "dev", f.admin, nil)

	account := make([]byte, 32)
	rand.Read(account)
	inbox := hex.EncodeToString(account)
	two := 2
	hosted, err := admin.RegisterClient(ctx, client.Registration{InboxID: inbox, KeyPackages: &two, CredentialHandle: "device-7"})
	if err != nil {
		t.Fatal(err)
	}
	if hosted.ClientID == "" || hosted.ClientID != hex.EncodeToString(hosted.InstallationKey) || hosted.InboxID != inbox ||
		hosted.CredentialHandle != "device-7" || len(hosted.KeyPackages) != 2 || hosted.CreatedAt.IsZero() {
		t.Fatalf("registered %+v", hosted)
	}
	other, err := admin.RegisterClient(ctx, client.Registration{InboxID: inbox})
	if err != nil || len(other.KeyPackages) != 1 {
		t.Fatalf("second installation of the inbox: %+v %v", other, err)
	}

	began := time.Now()
	tok, err := admin.MintConnectionToken(ctx, client.ConnectionTokenRequest{Clients: []string{hosted.ClientID}, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if tok.Token == "" || tok.Expires.Before(began.Add(59*time.Second)) || tok.Expires.After(time.Now().Add(61*time.Second)) {
		t.Fatalf("connection token %+v, want one valid for a minute", tok)
	}
	c, err := client.Connect(ctx, f.wsURL(), tok.Token, client.WithoutReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sub, err := c.Subscribe(ctx, hosted.ClientID, schema.EventFilter{}, client.FromStart())
	if err != nil {
		t.Fatal(err)
	}
	ev := next(t, sub, schema.KindIdentityRegistered)
	if ev.IdentityRegistered.InboxID != inbox || hex.EncodeToString(ev.IdentityRegistered.InstallationKey) != hosted.ClientID {
		t.Fatalf("identity.registered %+v", ev.IdentityRegistered)
	}
	var ge *client.GatewayError
	if _, err := c.Subscribe(ctx, other.ClientID, schema.EventFilter{}); !errors.As(err, &ge) || ge.Code != "forbidden" {
		t.Fatalf("subscribing a client the token does not name: %v, want forbidden", err)
	}

	// Refusals are the API's status and code.
	var ae *client.APIError
	if _, err := admin.RegisterClient(ctx, client.Registration{InboxID: "not hex"}); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
		t.Errorf("a bad inbox id: %v, want a 400 APIError", err)
	}
	if _, err := admin.MintConnectionToken(ctx, client.ConnectionTokenRequest{Clients: []string{hosted.ClientID}, Scopes: []string{"admin"}}); !errors.As(err, &ae) || ae.Status != http.StatusForbidden {
		t.Errorf("delegating admin: %v, want a 403 APIError", err)
	}
	if _, err := admin.MintConnectionToken(ctx, client.ConnectionTokenRequest{Clients: []string{hosted.ClientID}, TTL: 1500 * time.Millisecond}); err == nil {
		t.Error("a TTL of a second and a half was sent; the API takes whole seconds")
	}
}
