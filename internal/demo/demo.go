// Package demo plays remote MLS members into a running fabric, so a newcomer
// can watch the whole path: a hosted client is registered, remote members
// invite it, talk, react, rename the group, delete a message and leave, and
// the hosted client's events arrive at the gateway.
package demo

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// API calls the fabric's HTTP API with bearer tokens.
type API struct {
	BaseURL     string // like http://127.0.0.1:8080
	Tenant      string
	AdminToken  string // scope admin: client registration
	IngestToken string // scope ingest: transport intake
	HTTP        *http.Client
}

// Registered is the answer to a client registration.
type Registered struct {
	ClientID        string         `json:"client_id"`
	InboxID         string         `json:"inbox_id"`
	InstallationKey schema.Bytes   `json:"installation_key"`
	KeyPackages     []schema.Bytes `json:"key_packages"`
}

// IntakeResult is one message's answer from the transport endpoint.
type IntakeResult struct {
	MessageID schema.Bytes `json:"message_id"`
	Status    string       `json:"status"`
	Category  string       `json:"category,omitempty"`
}

// Register registers a hosted client for inboxID and returns it with one
// KeyPackage.
func (a *API) Register(ctx context.Context, inboxID string) (Registered, error) {
	var out Registered
	err := a.call(ctx, http.MethodPost, "/v1/tenants/"+a.Tenant+"/clients", a.AdminToken, map[string]any{"inbox_id": inboxID}, &out)
	if err == nil && len(out.KeyPackages) == 0 {
		err = fmt.Errorf("register: the answer has no KeyPackage")
	}
	return out, err
}

// Post sends transport messages to the intake and returns one result each.
func (a *API) Post(ctx context.Context, msgs ...schema.TransportMessage) ([]IntakeResult, error) {
	var out struct {
		Results []IntakeResult `json:"results"`
	}
	if err := a.call(ctx, http.MethodPost, "/v1/tenants/"+a.Tenant+"/transport", a.IngestToken, map[string]any{"messages": msgs}, &out); err != nil {
		return nil, err
	}
	if len(out.Results) != len(msgs) {
		return nil, fmt.Errorf("transport: %d results for %d messages", len(out.Results), len(msgs))
	}
	return out.Results, nil
}

func (a *API) call(ctx context.Context, method, path, token string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(a.BaseURL, "/")+path, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	hc := a.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(rb))
	}
	if err := json.Unmarshal(rb, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// Script is the demo's cast: a hosted client and two remote members.
type Script struct {
	API   *API
	Out   io.Writer     // one line per step
	Pause time.Duration // between steps, so a tail shows them arriving
}

// Register registers the demo's hosted client under a fresh inbox.
func (s *Script) Register(ctx context.Context) (Registered, error) {
	account := make([]byte, 32)
	if _, err := rand.Read(account); err != nil {
		return Registered{}, err
	}
	hosted, err := s.API.Register(ctx, hex.EncodeToString(account))
	if err != nil {
		return Registered{}, err
	}
	s.say("registered hosted client %s (inbox %s)", hosted.ClientID, hosted.InboxID)
	return hosted, nil
}

// Play plays the conversation: two remote members create a group, invite
// the hosted client, talk, reply, react, rename the group, delete a message,
// and one of them leaves.
func (s *Script) Play(ctx context.Context, hosted Registered) error {

	alice, err := testpeer.New("alice")
	if err != nil {
		return err
	}
	bob, err := testpeer.New("bob")
	if err != nil {
		return err
	}
	a, err := alice.CreateGroup(components.Set{
		Profile: &components.ProfileState{Name: "demo"},
		Admins:  []components.AccountID{alice.AccountID()},
	})
	if err != nil {
		return err
	}
	addBob, joined, err := a.Add(bob)
	if err != nil {
		return err
	}
	b := joined[0]
	invite, welcome, err := a.Invite(hosted.KeyPackages[0])
	if err != nil {
		return err
	}
	if _, err := b.Process(invite.Transport); err != nil {
		return err
	}
	// Joining (Marmot joining.md): the commit is published before the Welcome.
	if err := s.post(ctx, "alice adds bob", addBob); err != nil {
		return err
	}
	if err := s.post(ctx, "alice invites the hosted client", invite); err != nil {
		return err
	}
	if err := s.post(ctx, "the hosted client's Welcome", welcome); err != nil {
		return err
	}

	hi, err := b.SendText("hello from bob")
	if err != nil {
		return err
	}
	if err := s.post(ctx, "bob says hello", hi); err != nil {
		return err
	}
	reply, err := a.SendReply(hi.ID, "hi bob!")
	if err != nil {
		return err
	}
	if err := s.post(ctx, "alice replies", reply); err != nil {
		return err
	}
	react, err := b.SendReaction(reply.ID, "👍")
	if err != nil {
		return err
	}
	if err := s.post(ctx, "bob reacts", react); err != nil {
		return err
	}
	rename, err := a.SetComponents(components.Set{
		Profile: &components.ProfileState{Name: "demo, renamed", Description: "a fabric demo"},
		Admins:  []components.AccountID{alice.AccountID()},
	})
	if err != nil {
		return err
	}
	if _, err := b.Process(rename.Transport); err != nil {
		return err
	}
	if err := s.post(ctx, "alice renames the group", rename); err != nil {
		return err
	}
	oops, err := b.SendText("oops, wrong chat")
	if err != nil {
		return err
	}
	if err := s.post(ctx, "bob sends a message", oops); err != nil {
		return err
	}
	del, err := b.SendDelete(oops.ID)
	if err != nil {
		return err
	}
	if err := s.post(ctx, "bob deletes it", del); err != nil {
		return err
	}
	leave, err := b.Leave()
	if err != nil {
		return err
	}
	if _, err := a.Process(leave.Transport); err != nil {
		return err
	}
	if err := s.post(ctx, "bob asks to leave", leave); err != nil {
		return err
	}
	commit, err := a.Commit()
	if err != nil {
		return err
	}
	if err := s.post(ctx, "alice commits bob's leave", commit); err != nil {
		return err
	}
	return nil
}

func (s *Script) post(ctx context.Context, step string, m testpeer.Message) error {
	res, err := s.API.Post(ctx, m.Transport)
	if err != nil {
		return fmt.Errorf("%s: %w", step, err)
	}
	r := res[0]
	line := fmt.Sprintf("%-34s %s", step, r.Status)
	if r.Category != "" {
		line += " (" + r.Category + ")"
	}
	s.say("%s", line)
	if s.Pause > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(s.Pause):
		}
	}
	return nil
}

func (s *Script) say(format string, args ...any) {
	if s.Out != nil {
		fmt.Fprintf(s.Out, format+"\n", args...)
	}
}
