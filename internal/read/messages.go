package read

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/pkg/schema"
)

func typeOf(c apppayload.ContentType) *schema.ContentTypeID {
	return &schema.ContentTypeID{AuthorityID: c.AuthorityID, TypeID: c.TypeID, VersionMajor: c.VersionMajor}
}

// contentOf decodes a payload; an unknown or malformed one is its raw
// content bytes.
func contentOf(p apppayload.Payload) *schema.MessageContent {
	c := &schema.MessageContent{}
	if len(p.Parameters) > 0 {
		c.Parameters = p.Parameters
	}
	switch {
	case p.ContentType.Matches(apppayload.TextType):
		if s, err := p.Text(); err == nil {
			c.Text = &s
			return c
		}
	case p.ContentType.Matches(apppayload.ReplyType):
		if ref, inner, err := p.Reply(); err == nil {
			c.Reply = &schema.Reply{Reference: ref, ContentType: typeOf(inner.ContentType), Content: contentOf(inner)}
			return c
		}
	case p.ContentType.Matches(apppayload.ReactionType):
		if r, err := p.Reaction(); err == nil {
			c.Reaction = &schema.Reaction{Reference: r.Reference, ReferenceInboxID: r.ReferenceInboxID, Action: string(r.Action), Content: r.Content, Schema: string(r.Schema)}
			return c
		}
	case p.ContentType.Matches(apppayload.DeletionType):
		if id, ok := p.DeletionTarget(); ok {
			c.Deletion = &schema.Deletion{MessageID: id}
			return c
		}
	}
	c.Raw = p.Content
	if c.Raw == nil {
		c.Raw = schema.Bytes{}
	}
	return c
}

// messageOf is the answer for a stored record; content that does not open
// (the tenant's key was dropped) is left out.
func messageOf(rec *readmodel.Message, s *readmodel.Sealer) schema.Message {
	m := schema.Message{
		MessageID: rec.ID, GroupID: rec.GroupID, DeliveryNumber: rec.N, SenderInboxID: rec.SenderInboxID,
		SenderInstallation: rec.SenderInstallation, SentAt: rec.SentAt, ExpiresAt: rec.ExpiresAt,
		ContentType: rec.ContentType, State: string(rec.State), DeletedBy: rec.DeletedBy,
	}
	if rec.State != readmodel.StateDelivered || rec.Content == nil || s == nil {
		return m
	}
	plain, err := s.Open(rec.GroupID, rec.N, rec.Content)
	if err != nil {
		return m
	}
	if p, err := apppayload.Decode(plain); err == nil {
		m.Content = contentOf(p)
	} else {
		m.Content = &schema.MessageContent{Raw: plain}
	}
	return m
}

// localRecord lays the client's local deletion over a message record it
// holds (issue 26): a message it deleted locally reads as deleted_locally,
// without content, while the group still delivers it (the group's own
// deletion, expiry or rollback stands over it).
func localRecord(rec *readmodel.Message, local clientstore.LocalMessages) *readmodel.Message {
	if local[string(rec.ID)].DeletedLocally && rec.State == readmodel.StateDelivered {
		r := *rec
		r.State, r.ContentType, r.Content = readmodel.StateDeletedLocally, nil, nil
		return &r
	}
	return rec
}

// localMessage is the answer for a record localRecord made: an own
// message carries its status, published unless a signal changed it.
func localMessage(rec *readmodel.Message, conv *readmodel.Conversation, local clientstore.LocalMessages, s *readmodel.Sealer) schema.Message {
	m := messageOf(rec, s)
	if bytes.Equal(rec.SenderInstallation, conv.Installation) {
		m.Status = schema.StatusPublished
		if st := local[string(rec.ID)].Status; st != "" {
			m.Status = st
		}
	}
	return m
}

// sealer is the tenant's content sealer; nil when the tenant has no key
// (dropped, or no message stored yet): no content opens.
func (a *API) sealer(ctx context.Context, tenant string) (*readmodel.Sealer, error) {
	salt, err := readmodel.TenantSalt(ctx, a.clients, tenant, false)
	if err == readmodel.ErrNoTenantKey {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return readmodel.NewSealer(a.cfg.Vault, tenant, salt)
}

// messageFilter is what GET …/messages selects.
type messageFilter struct {
	types         []schema.ContentTypeID
	after, before int64
	descending    bool
}

func messageFilterOf(r *http.Request) (messageFilter, error) {
	q := r.URL.Query()
	var f messageFilter
	if s := q.Get("content_types"); s != "" {
		for _, t := range strings.Split(s, ",") {
			ct, err := parseContentType(t)
			if err != nil {
				return f, refusal.BadRequest("content_types: %v", err)
			}
			f.types = append(f.types, ct)
		}
	}
	for _, p := range []struct {
		name string
		v    *int64
	}{{"sent_after", &f.after}, {"sent_before", &f.before}} {
		if s := q.Get(p.name); s != "" {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n < 0 {
				return f, refusal.BadRequest("%s: want unix milliseconds", p.name)
			}
			*p.v = n
		}
	}
	switch q.Get("direction") {
	case "", "ascending":
	case "descending":
		f.descending = true
	default:
		return f, refusal.BadRequest("direction: want ascending or descending")
	}
	return f, nil
}

// parseContentType reads authority/type:major.
func parseContentType(s string) (schema.ContentTypeID, error) {
	auth, rest, ok := strings.Cut(s, "/")
	typ, ver, ok2 := strings.Cut(rest, ":")
	major, err := strconv.ParseUint(strings.SplitN(ver, ".", 2)[0], 10, 32)
	if !ok || !ok2 || auth == "" || typ == "" || err != nil {
		return schema.ContentTypeID{}, fmt.Errorf("%q: want authority/type:major", s)
	}
	return schema.ContentTypeID{AuthorityID: auth, TypeID: typ, VersionMajor: uint32(major)}, nil
}

func (f messageFilter) match(m *readmodel.Message) bool {
	if f.after != 0 && m.SentAt <= f.after || f.before != 0 && m.SentAt >= f.before {
		return false
	}
	if len(f.types) == 0 {
		return true
	}
	for _, t := range f.types {
		if m.ContentType != nil && m.ContentType.Matches(t) {
			return true
		}
	}
	return false
}

// listMessages pages a conversation's messages by delivery number, the
// canonical order: each page reads the records of the next numbers by
// subject, so it costs its limit, not the conversation's length.
func (a *API) listMessages(r *http.Request, c call) (any, error) {
	p, err := pageOf(r)
	if err != nil {
		return nil, err
	}
	f, err := messageFilterOf(r)
	if err != nil {
		return nil, err
	}
	g, conv, err := a.pathConversation(r, c)
	if err != nil {
		return nil, err
	}
	first, last := max(conv.FirstN, 1), conv.Delivered
	if conv.Removed {
		last = conv.LastN
	}
	next := first
	if f.descending {
		next = last
	}
	if p.cursor != 0 {
		next = p.cursor
	}
	sealer, err := a.sealer(r.Context(), c.tenant)
	if err != nil {
		return nil, err
	}
	local, err := a.cfg.Stores.LocalMessages(r.Context(), c.tenant, c.client, conv.GroupID)
	if err != nil {
		return nil, err
	}
	out := schema.MessagePage{Messages: []schema.Message{}}
	step := uint64(1)
	if f.descending {
		step = ^uint64(0) // -1
	}
	// A page ends at its limit, at its scan bound, or before the message
	// that would take it past its byte bound (issue 27), the cursor naming
	// that message; a single message larger is a page of its own. The
	// first read is of a few records, later ones of as many as the bytes
	// left can hold, by the largest record read: a page of large messages
	// does not read far more than it answers.
	bound := a.limits.q.PageBytes
	scanned, size, largest, full := 0, 0, 0, false
	for !full && len(out.Messages) < p.limit && next >= first && next <= last && scanned < scanFactor*p.limit {
		want := min(p.limit-len(out.Messages), firstRead)
		switch {
		case largest > largeRecord:
			// One at a time: the server answers record reads with a
			// few workers for every tenant (its JetStream API queue).
			want = 1
		case largest > 0:
			want = min(p.limit-len(out.Messages), max(1, (bound-size)/largest+1))
		}
		var subjects []string
		for n := next; len(subjects) < want && n >= first && n <= last; n += step {
			s, err := readmodel.MessageSubject(c.tenant, g, n)
			if err != nil {
				return nil, err
			}
			subjects = append(subjects, s)
		}
		got, err := readmodel.LastMany(r.Context(), a.cfg.JS, subjects)
		if err != nil {
			return nil, err
		}
		scanned += len(got)
		a.metrics.records.WithLabelValues("messages").Add(float64(len(got)))
		read := 0
		for _, st := range got {
			read += len(st.Data)
		}
		if !c.hold(read) {
			// The tenant's reads in flight are at their bound: the page
			// ends here, or, with nothing yet, is refused.
			if len(out.Messages) == 0 {
				return nil, a.limits.refuse(ErrReadsInFlight.After(time.Second))
			}
			break
		}
		for _, st := range got {
			if st.Seq == 0 || len(st.Data) == 0 {
				next += step
				continue
			}
			largest = max(largest, len(st.Data))
			var rec readmodel.Message
			if err := schema.UnmarshalMsgpack(st.Data, &rec); err != nil {
				return nil, fmt.Errorf("read: decode message: %w", err)
			}
			if lr := localRecord(&rec, local); conv.Holds(&rec) && f.match(lr) {
				m := localMessage(lr, conv, local, sealer)
				n, err := jsonSize(m)
				if err != nil {
					return nil, err
				}
				if len(out.Messages) > 0 && size+n > bound {
					full = true
					break
				}
				size += n
				out.Messages = append(out.Messages, m)
			}
			next += step
		}
	}
	if next >= first && next <= last {
		out.NextCursor = cursorString(next)
	}
	return out, nil
}

// A page reads firstRead records before it knows how large they are, and
// records larger than largeRecord one at a time.
const (
	firstRead   = 1
	largeRecord = 64 << 10
)

// jsonSize is the length of m as JSON, what the page bound counts (its
// msgpack is no longer).
func jsonSize(m schema.Message) (int, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return 0, fmt.Errorf("read: encode message: %w", err)
	}
	return len(b), nil
}

func (a *API) getMessage(r *http.Request, c call) (any, error) {
	idHex := r.PathValue("message_id")
	if err := subject.ValidMessageID(idHex); err != nil {
		return nil, refusal.BadRequest("message_id: want %d lowercase hex digits", subject.MessageIDHexLen)
	}
	id, _ := hex.DecodeString(idHex)
	rec, conv, err := readmodel.HeldMessage(r.Context(), a.cfg.JS, c.tenant, c.client, id)
	if err != nil || rec == nil {
		return nil, errOr(err, ErrMessageNotFound)
	}
	sealer, err := a.sealer(r.Context(), c.tenant)
	if err != nil {
		return nil, err
	}
	local, err := a.cfg.Stores.LocalMessages(r.Context(), c.tenant, c.client, rec.GroupID)
	if err != nil {
		return nil, err
	}
	return localMessage(localRecord(rec, local), conv, local, sealer), nil
}

func errOr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}
