package client

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// Operations makes a tenant's hosted clients speak over the fabric's HTTP
// API (issue 19): create a conversation, send, add and remove members,
// change components, leave, update the own leaf. Each call takes an
// idempotency key: the same key and request from the same client on the
// same route and conversation is the same operation, sent once however
// often it is called (the key with another request is refused 409). A call returns as soon
// as the operation is stored, with its id; Operation reads how it went,
// and the client's events report it (conversation.joined with origin
// created, message.status_changed, conversation.membership_changed, …).
type Operations struct {
	base, tenant, token string
	http                *http.Client
}

// NewOperations returns the operations API of tenant at baseURL (the
// fabric's HTTP API, e.g. http://127.0.0.1:8080) with a token of scope
// send (or admin). A nil httpClient is http.DefaultClient.
func NewOperations(baseURL, tenant, token string, httpClient *http.Client) *Operations {
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	return &Operations{base: baseURL, tenant: tenant, token: token, http: httpClient}
}

// CreateConversation creates a group (or, with DMKeyPackage, a DM) with the
// client as its admin; its members join from the Welcomes it sends.
func (o *Operations) CreateConversation(ctx context.Context, clientID, idempotencyKey string, body schema.CreateConversation) (schema.OperationAccepted, error) {
	return o.do(ctx, http.MethodPost, o.path(clientID, "conversations"), idempotencyKey, body)
}

// SendText sends a text message.
func (o *Operations) SendText(ctx context.Context, clientID string, groupID []byte, idempotencyKey, text string) (schema.OperationAccepted, error) {
	return o.Send(ctx, clientID, groupID, idempotencyKey, schema.SendMessage{Text: &text})
}

// Send sends an application message: a text, a reply, a reaction, a
// deletion or another content type's bytes.
func (o *Operations) Send(ctx context.Context, clientID string, groupID []byte, idempotencyKey string, msg schema.SendMessage) (schema.OperationAccepted, error) {
	return o.do(ctx, http.MethodPost, o.path(clientID, "conversations", hex.EncodeToString(groupID), "messages"), idempotencyKey, msg)
}

// AddMembers adds the members of the KeyPackages in one commit; each gets a
// Welcome.
func (o *Operations) AddMembers(ctx context.Context, clientID string, groupID []byte, idempotencyKey string, keyPackages ...[]byte) (schema.OperationAccepted, error) {
	body := schema.AddMembers{}
	for _, kp := range keyPackages {
		body.KeyPackages = append(body.KeyPackages, kp)
	}
	return o.do(ctx, http.MethodPost, o.path(clientID, "conversations", hex.EncodeToString(groupID), "members"), idempotencyKey, body)
}

// RemoveMember removes every installation of an inbox.
func (o *Operations) RemoveMember(ctx context.Context, clientID string, groupID []byte, idempotencyKey, inboxID string) (schema.OperationAccepted, error) {
	return o.do(ctx, http.MethodDelete, o.path(clientID, "conversations", hex.EncodeToString(groupID), "members", inboxID), idempotencyKey, nil)
}

// UpdateConversation changes the components the body names.
func (o *Operations) UpdateConversation(ctx context.Context, clientID string, groupID []byte, idempotencyKey string, changes schema.ConversationChanges) (schema.OperationAccepted, error) {
	return o.do(ctx, http.MethodPatch, o.path(clientID, "conversations", hex.EncodeToString(groupID)), idempotencyKey, changes)
}

// Leave publishes the client's leave request; another member commits it.
func (o *Operations) Leave(ctx context.Context, clientID string, groupID []byte, idempotencyKey string) (schema.OperationAccepted, error) {
	return o.do(ctx, http.MethodPost, o.path(clientID, "conversations", hex.EncodeToString(groupID), "leave"), idempotencyKey, nil)
}

// SelfUpdate commits a new leaf for the client (post-compromise security).
func (o *Operations) SelfUpdate(ctx context.Context, clientID string, groupID []byte, idempotencyKey string) (schema.OperationAccepted, error) {
	return o.do(ctx, http.MethodPost, o.path(clientID, "conversations", hex.EncodeToString(groupID), "update"), idempotencyKey, nil)
}

// Operation reads an operation's current record.
func (o *Operations) Operation(ctx context.Context, clientID string, operationID []byte) (schema.Operation, error) {
	var rec schema.Operation
	err := o.request(ctx, http.MethodGet, o.path(clientID, "operations", hex.EncodeToString(operationID)), "", nil, &rec)
	return rec, err
}

func (o *Operations) path(clientID string, parts ...string) string {
	p := o.base + "/v1/tenants/" + url.PathEscape(o.tenant) + "/clients/" + url.PathEscape(clientID)
	for _, s := range parts {
		p += "/" + url.PathEscape(s)
	}
	return p
}

func (o *Operations) do(ctx context.Context, method, path, idempotencyKey string, body any) (schema.OperationAccepted, error) {
	var acc schema.OperationAccepted
	err := o.request(ctx, method, path, idempotencyKey, body, &acc)
	return acc, err
}

func (o *Operations) request(ctx context.Context, method, path, idempotencyKey string, body, out any) error {
	return doJSON(ctx, o.http, method, path, o.token, idempotencyKey, body, out)
}

// doJSON sends a JSON request with a bearer token (and an Idempotency-Key
// when not empty) and decodes a 2xx answer into out; another answer is an
// *APIError.
func doJSON(ctx context.Context, hc *http.Client, method, path, token, idempotencyKey string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("fabric: encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, path, rd)
	if err != nil {
		return fmt.Errorf("fabric: request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if idempotencyKey != "" {
		req.Header.Set("Idempotency-Key", idempotencyKey)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("fabric: %s: %w", method, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("fabric: read answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		_ = json.Unmarshal(data, &e)
		return &APIError{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message}
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("fabric: decode answer: %w", err)
	}
	return nil
}
