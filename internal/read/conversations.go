package read

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/pkg/schema"
)

var actionNames = map[components.Action]string{
	components.ActionAddMember: "add_member", components.ActionRemoveMember: "remove_member",
	components.ActionUpdateMetadata: "update_metadata", components.ActionAddAdmin: "add_admin",
	components.ActionRemoveAdmin: "remove_admin", components.ActionUpdatePermissions: "update_permissions",
}

var policyNames = map[components.Policy]string{
	components.PolicyAllow: "allow", components.PolicyAdmin: "admin",
	components.PolicySuperAdmin: "super_admin", components.PolicyDeny: "deny",
}

func inboxes(ids []components.AccountID) []string {
	out := make([]string, len(ids))
	for i, a := range ids {
		out[i] = a.InboxID()
	}
	return out
}

func componentsOf(s components.Set) schema.ComponentValues {
	var c schema.ComponentValues
	if p := s.Profile; p != nil {
		c.GroupName, c.Description = &p.Name, &p.Description
	}
	if a := s.Avatar; a != nil {
		c.GroupImage = &schema.GroupImage{URL: a.URL, Dim: a.Dim, Thumbhash: a.Thumbhash}
	}
	if r := s.Retention; r != nil {
		ns := r.DisappearingSecs * 1e9
		c.DisappearInNS = &ns
	}
	if s.Admins != nil {
		c.AdminList = inboxes(s.Admins)
	}
	if s.SuperAdmins != nil {
		c.SuperAdminList = inboxes(s.SuperAdmins)
	}
	if s.Permissions != nil {
		c.PermissionPolicy = map[string]string{}
		for a, p := range s.Permissions {
			name, ok := actionNames[a]
			if !ok {
				name = "action:" + strconv.Itoa(int(a))
			}
			c.PermissionPolicy[name] = policyNames[p]
		}
	}
	c.MinimumProtocol = s.ProtocolFloor
	for id, b := range s.Other {
		if c.Other == nil {
			c.Other = map[string]schema.Bytes{}
		}
		c.Other[components.ComponentName(id)] = b
	}
	return c
}

// conversationOf is the answer for a stored conversation record.
func conversationOf(rec *readmodel.Conversation, consent schema.ConsentState) schema.Conversation {
	set, _ := components.Decode(rec.Components)
	c := schema.Conversation{
		GroupID: rec.GroupID, ConversationType: schema.ConversationGroup, Components: componentsOf(set), ForkState: schema.ForkStable,
		Epoch: rec.Epoch, Membership: schema.MembershipActive, Members: schema.MembersSummary{Inboxes: rec.Inboxes, Installations: rec.Installations},
		Role: schema.RoleMember, ConsentState: consent, LastActivity: rec.Activity, Messages: rec.Delivered,
	}
	if rec.DMKey != nil {
		c.DMConversationKey = rec.DMKey
	}
	if conv := set.Conversation; conv != nil && conv.Kind == components.KindDM {
		c.ConversationType = schema.ConversationDM
		if self, err := components.ParseInboxID(rec.InboxID); err == nil {
			if peer, ok := conv.PeerOf(self); ok {
				c.DMPeerInboxID = peer.InboxID()
			}
		}
	}
	if rec.PausedFloor != "" {
		c.Paused = &schema.Paused{Reason: "protocol_version_floor", Floor: rec.PausedFloor}
	}
	if rec.Forked {
		c.ForkState = schema.ForkForked
	}
	if rec.Removed {
		c.Membership = schema.MembershipRemoved
		c.Messages = rec.LastN
	}
	if self, err := components.ParseInboxID(rec.InboxID); err == nil {
		switch {
		case slices.Contains(set.SuperAdmins, self):
			c.Role = schema.RoleSuperAdmin
		case slices.Contains(set.Admins, self):
			c.Role = schema.RoleAdmin
		}
	}
	return c
}

// conversation reads a client's conversation record of a group; nil when
// the client never held the group.
func (a *API) conversation(ctx context.Context, c call, groupHex string) (*readmodel.Conversation, error) {
	subj, err := readmodel.ConversationSubject(c.tenant, groupHex, c.client)
	if err != nil {
		return nil, refusal.BadRequest("group_id: %v", err)
	}
	st, err := readmodel.Last(ctx, a.cfg.JS, subj)
	if err != nil || st.Seq == 0 || len(st.Data) == 0 {
		return nil, err
	}
	var rec readmodel.Conversation
	if err := schema.UnmarshalMsgpack(st.Data, &rec); err != nil {
		return nil, fmt.Errorf("read: decode conversation: %w", err)
	}
	return &rec, nil
}

// pathConversation reads the conversation the path's {group_id} names;
// a 404 when the client never held it.
func (a *API) pathConversation(r *http.Request, c call) (string, *readmodel.Conversation, error) {
	g := r.PathValue("group_id")
	if err := subject.ValidGroup(g); err != nil {
		return "", nil, refusal.BadRequest("group_id: want the group id in lowercase hex")
	}
	rec, err := a.conversation(r.Context(), c, g)
	if err == nil && rec == nil {
		err = ErrConversationNotFound
	}
	return g, rec, err
}

func (a *API) getConversation(r *http.Request, c call) (any, error) {
	g, rec, err := a.pathConversation(r, c)
	if err != nil {
		return nil, err
	}
	consent, err := a.cfg.Stores.Consent(r.Context(), c.tenant, c.client, schema.ConsentEntityConversation, g)
	if err != nil {
		return nil, err
	}
	conv := conversationOf(rec, consent)
	if rec.DMKey != nil {
		if conv.StitchedGroupIDs, err = a.siblings(r.Context(), c, rec); err != nil {
			return nil, err
		}
	}
	return conv, nil
}

// maxSiblings bounds the stitched groups one answer lists.
const maxSiblings = 64

// siblings are the client's other groups of the DM rec is a group of.
func (a *API) siblings(ctx context.Context, c call, rec *readmodel.Conversation) ([]schema.Bytes, error) {
	filter, err := readmodel.SiblingFilter(c.tenant, rec.DMKey, c.client)
	if err != nil {
		return nil, err
	}
	last, err := readmodel.LastSeq(ctx, a.cfg.JS, streams.StreamEvents, filter)
	if err != nil {
		return nil, err
	}
	got, err := readmodel.ScanCurrent(ctx, a.cfg.JS, streams.StreamEvents, filter, 1, maxSiblings, last)
	if err != nil {
		return nil, err
	}
	out := []schema.Bytes{}
	for _, st := range got {
		var s readmodel.Sibling
		if err := schema.UnmarshalMsgpack(st.Data, &s); err != nil {
			return nil, fmt.Errorf("read: decode sibling: %w", err)
		}
		if !s.Removed && !bytes.Equal(s.GroupID, rec.GroupID) {
			out = append(out, s.GroupID)
		}
	}
	return out, nil
}

// consentReads bounds the consent records one page reads in parallel.
const consentReads = 16

// consents reads the client's consent state of each conversation of recs,
// in parallel: each is a read from the store's leader (EVENT-010).
func (a *API) consents(ctx context.Context, c call, recs []readmodel.Conversation) ([]schema.ConsentState, error) {
	out := make([]schema.ConsentState, len(recs))
	errs := make([]error, len(recs))
	sem := make(chan struct{}, consentReads)
	var wg sync.WaitGroup
	for i := range recs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i], errs[i] = a.cfg.Stores.Consent(ctx, c.tenant, c.client, schema.ConsentEntityConversation, hex.EncodeToString(recs[i].GroupID))
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// conversationFilter is what GET …/conversations selects.
type conversationFilter struct {
	kind    string // group, dm or ""
	consent schema.ConsentState
	paused  *bool
	since   int64 // unix ms, 0 for none
}

func conversationFilterOf(r *http.Request) (conversationFilter, error) {
	q := r.URL.Query()
	var f conversationFilter
	switch t := q.Get("type"); t {
	case "", "group", "dm":
		f.kind = t
	default:
		return f, refusal.BadRequest("type: want group or dm")
	}
	if s := q.Get("consent_state"); s != "" {
		f.consent = schema.ConsentState(s)
		if !f.consent.Valid() {
			return f, refusal.BadRequest("consent_state: want unknown, allowed or denied")
		}
	}
	if s := q.Get("paused"); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return f, refusal.BadRequest("paused: want true or false")
		}
		f.paused = &b
	}
	if s := q.Get("updated_since"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return f, refusal.BadRequest("updated_since: want unix milliseconds")
		}
		f.since = n
	}
	return f, nil
}

func (f conversationFilter) match(c schema.Conversation) bool {
	return (f.kind == "" || string(c.ConversationType) == f.kind) &&
		(f.consent == "" || c.ConsentState == f.consent) &&
		(f.paused == nil || (c.Paused != nil) == *f.paused)
}

// listConversations pages a client's conversation records newest first.
// Each record is rewritten (a rollup of its subject) at every change, so
// stream order is activity order; a page is read backwards from the
// cursor, a stream sequence: the records below it are counted to find
// where the page starts, then read forward (newest.go).
func (a *API) listConversations(r *http.Request, c call) (any, error) {
	p, err := pageOf(r)
	if err != nil {
		return nil, err
	}
	f, err := conversationFilterOf(r)
	if err != nil {
		return nil, err
	}
	filter, err := readmodel.ConversationFilter(c.tenant, c.client)
	if err != nil {
		return nil, refusal.BadRequest("%v", err)
	}
	out := schema.ConversationPage{Conversations: []schema.Conversation{}}
	upTo := p.cursor // exclusive; 0 is the end of the stream
	scanned := 0
	for len(out.Conversations) < p.limit {
		recs, more, err := a.newest(r.Context(), filter, upTo, p.limit-len(out.Conversations))
		if err != nil {
			return nil, err
		}
		a.metrics.records.WithLabelValues("conversations").Add(float64(len(recs)))
		if len(recs) == 0 {
			upTo = 0
			break
		}
		stop := false
		var got []readmodel.Conversation
		for _, st := range recs {
			var rec readmodel.Conversation
			if err := schema.UnmarshalMsgpack(st.Data, &rec); err != nil {
				return nil, fmt.Errorf("read: decode conversation: %w", err)
			}
			if f.since != 0 && rec.Activity < f.since {
				stop = true // older still are older: activity order
				break
			}
			got = append(got, rec)
		}
		consent, err := a.consents(r.Context(), c, got)
		if err != nil {
			return nil, err
		}
		for i := range got {
			upTo = recs[i].Seq
			if conv := conversationOf(&got[i], consent[i]); f.match(conv) {
				out.Conversations = append(out.Conversations, conv)
			}
		}
		scanned += len(recs)
		if stop || !more {
			upTo = 0
			break
		}
		if scanned >= scanFactor*p.limit {
			break
		}
	}
	out.NextCursor = cursorString(upTo)
	return out, nil
}
