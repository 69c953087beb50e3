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

	explained bool // unknownGroupNote printed
}

// unknownGroupNote says what becomes of input answered unknown_group, as
// docs/ingest.md (Retained objects) has it: printed under the first, since a
// newcomer reads "rejected" as lost (issue 28).
const unknownGroupNote = `  ↳ expected: no hosted client holds this group until its Welcome is processed.
    The fabric retains the input and hands it to convergence once the Welcome
    has made the hosted client a member: a commit the Welcome's epoch already
    includes then ends stale, a message is delivered; nothing is lost.
    (GET /v1/tenants/{tenant}/outcomes/{message_id} shows its record move on.)`

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

// Step is one message of the conversation and what it does.
type Step struct {
	Name string
	Msg  testpeer.Message
}

// Flow is the demo's conversation, made in advance by its remote members:
// alice creates a group, adds bob and invites the hosted client (Join);
// bob says hello, alice replies and bob reacts (Talk); alice renames the
// group, bob sends a message and deletes it, asks to leave, and alice
// commits his leave (Settle).
type Flow struct {
	GroupID             []byte
	Alice, Bob          *testpeer.Peer
	Join, Talk, Settle  []Step
	Hello, Reply, React testpeer.Message
	Oops, Delete, Leave testpeer.Message
}

// NewFlow makes the conversation for a hosted client with one KeyPackage.
func NewFlow(hosted Registered) (*Flow, error) {
	alice, err := testpeer.New("alice")
	if err != nil {
		return nil, err
	}
	bob, err := testpeer.New("bob")
	if err != nil {
		return nil, err
	}
	a, err := alice.CreateGroup(components.Set{
		Profile: &components.ProfileState{Name: "demo"},
		Admins:  []components.AccountID{alice.AccountID()},
	})
	if err != nil {
		return nil, err
	}
	f := &Flow{GroupID: a.ID(), Alice: alice, Bob: bob}
	addBob, joined, err := a.Add(bob)
	if err != nil {
		return nil, err
	}
	b := joined[0]
	invite, welcome, err := a.Invite(hosted.KeyPackages[0])
	if err != nil {
		return nil, err
	}
	if _, err := b.Process(invite.Transport); err != nil {
		return nil, err
	}
	// Joining (Marmot joining.md): the commit is published before the Welcome.
	f.Join = []Step{{"alice adds bob", addBob}, {"alice invites the hosted client", invite}, {"the hosted client's Welcome", welcome}}

	if f.Hello, err = b.SendText("hello from bob"); err != nil {
		return nil, err
	}
	if f.Reply, err = a.SendReply(f.Hello.ID, "hi bob!"); err != nil {
		return nil, err
	}
	if f.React, err = b.SendReaction(f.Reply.ID, "👍"); err != nil {
		return nil, err
	}
	f.Talk = []Step{{"bob says hello", f.Hello}, {"alice replies", f.Reply}, {"bob reacts", f.React}}

	rename, err := a.SetComponents(components.Set{
		Profile: &components.ProfileState{Name: "demo, renamed", Description: "a fabric demo"},
		Admins:  []components.AccountID{alice.AccountID()},
	})
	if err != nil {
		return nil, err
	}
	if _, err := b.Process(rename.Transport); err != nil {
		return nil, err
	}
	if f.Oops, err = b.SendText("oops, wrong chat"); err != nil {
		return nil, err
	}
	if f.Delete, err = b.SendDelete(f.Oops.ID); err != nil {
		return nil, err
	}
	if f.Leave, err = b.Leave(); err != nil {
		return nil, err
	}
	if _, err := a.Process(f.Leave.Transport); err != nil {
		return nil, err
	}
	commit, err := a.Commit()
	if err != nil {
		return nil, err
	}
	f.Settle = []Step{
		{"alice renames the group", rename}, {"bob sends a message", f.Oops}, {"bob deletes it", f.Delete},
		{"bob asks to leave", f.Leave}, {"alice commits bob's leave", commit},
	}
	return f, nil
}

// Play plays the conversation into the fabric, one step at a time.
func (s *Script) Play(ctx context.Context, hosted Registered) error {
	f, err := NewFlow(hosted)
	if err != nil {
		return err
	}
	return s.PlayFlow(ctx, f)
}

// PlayFlow plays a conversation made by NewFlow, one step a request.
func (s *Script) PlayFlow(ctx context.Context, f *Flow) error {
	for _, part := range [][]Step{f.Join, f.Talk, f.Settle} {
		for _, st := range part {
			if err := s.post(ctx, st.Name, st.Msg); err != nil {
				return err
			}
		}
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
	if r.Status == string(schema.StatusRejected) && r.Category == string(schema.CategoryUnknownGroup) && !s.explained {
		s.explained = true
		s.say("%s", unknownGroupNote)
	}
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
