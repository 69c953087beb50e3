// Package filter applies a subscription's EventFilter at the gateway, before
// an event enters the subscription's queue (EVENT-020 to EVENT-022).
//
// A filter is compiled once, when the subscription is created, into a form
// whose Match allocates nothing; the facts an event is matched on are
// extracted once per event (Describe) and shared by every subscription.
package filter

import (
	"errors"
	"fmt"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// ErrInvalid is wrapped by every error Compile returns for a malformed
// filter, so the gateway can answer it as the caller's mistake.
var ErrInvalid = errors.New("invalid event filter")

// MaxGroupIDs bounds the group_ids of one filter, so a subscribe frame cannot
// make the gateway resolve an unbounded number of stitched-DM keys.
const MaxGroupIDs = 256

// MaxContentTypes bounds the content_types of one filter.
const MaxContentTypes = 64

// DMKeys resolves a group id to the conversation key of the stitched DM the
// group belongs to (DMS-009). ok is false for a group that is not a DM's, or
// that the resolver does not know.
type DMKeys interface {
	DMKeys(groupID []byte) (key []byte, ok bool)
}

// Event is the facts of one event that a filter reads. Build it with
// Describe, once per event.
type Event struct {
	kindBit uint64
	lagged  bool
	msgRecv bool

	// group is the group the event names; valid when namesGroup.
	group      []byte
	namesGroup bool
	// convKey is the Fabric-Conversation-Key: the stitched DM's
	// conversation key, or nil.
	convKey []byte
	// contentType is message.received's content type, or nil.
	contentType *schema.ContentTypeID
	// refOwn is the Fabric-References-Own header (EVENT-021).
	refOwn bool
}

// Describe extracts the facts a filter needs from ev and the two headers
// convergence sets: conversationKey (Fabric-Conversation-Key, decoded; nil
// when absent) and referencesOwn (Fabric-References-Own is "1").
func Describe(ev *schema.ClientEvent, conversationKey []byte, referencesOwn bool) Event {
	e := Event{
		kindBit: kindBit(ev.Kind),
		lagged:  ev.Kind == schema.KindLagged,
		msgRecv: ev.Kind == schema.KindMessageReceived,
		convKey: conversationKey,
		refOwn:  referencesOwn,
	}
	e.group, e.namesGroup = ev.GroupID()
	if ev.MessageReceived != nil {
		e.contentType = ev.MessageReceived.ContentType
	}
	return e
}

// kindBit maps a kind to one bit of a 64-bit set; 0 for an unknown kind,
// which therefore no filter selects.
func kindBit(k schema.EventKind) uint64 {
	o := k.Order()
	if o < 1 || o > 64 {
		return 0
	}
	return 1 << (o - 1)
}

// Filter is a compiled EventFilter. It is immutable and safe for concurrent
// use.
type Filter struct {
	kinds uint64
	// groups is nil when group_ids is absent (every group is selected).
	groups map[string]struct{}
	// dmKeys are the conversation keys of the stitched DMs any filter group
	// belongs to (EVENT-020, DMS-009).
	dmKeys       map[string]struct{}
	contentTypes []schema.ContentTypeID // nil when absent
	refOwn       bool
}

// Compile checks f and compiles it. dm resolves the filter's group ids to
// stitched-DM conversation keys; it may be nil when no group is a DM's.
// Errors wrap ErrInvalid.
func Compile(f schema.EventFilter, dm DMKeys) (*Filter, error) {
	c := &Filter{refOwn: f.ReferencesOwnMessages}
	kinds := f.Kinds
	if kinds == nil {
		kinds = schema.AllKinds() // absent: every kind (issue 28)
	}
	for _, k := range kinds {
		b := kindBit(k)
		if b == 0 {
			return nil, fmt.Errorf("%w: unknown kind %q", ErrInvalid, truncate(string(k)))
		}
		c.kinds |= b
	}
	if f.GroupIDs != nil {
		if len(f.GroupIDs) > MaxGroupIDs {
			return nil, fmt.Errorf("%w: %d group_ids, at most %d", ErrInvalid, len(f.GroupIDs), MaxGroupIDs)
		}
		c.groups = make(map[string]struct{}, len(f.GroupIDs))
		for _, g := range f.GroupIDs {
			if len(g) == 0 {
				return nil, fmt.Errorf("%w: empty group id", ErrInvalid)
			}
			c.groups[string(g)] = struct{}{}
			if dm == nil {
				continue
			}
			if key, ok := dm.DMKeys(g); ok && len(key) > 0 {
				if c.dmKeys == nil {
					c.dmKeys = make(map[string]struct{})
				}
				c.dmKeys[string(key)] = struct{}{}
			}
		}
	}
	if f.ContentTypes != nil {
		if len(f.ContentTypes) > MaxContentTypes {
			return nil, fmt.Errorf("%w: %d content_types, at most %d", ErrInvalid, len(f.ContentTypes), MaxContentTypes)
		}
		c.contentTypes = append(make([]schema.ContentTypeID, 0, len(f.ContentTypes)), f.ContentTypes...)
	}
	return c, nil
}

// Stitched returns the filter that also knows group to be a group of the
// stitched DM with conversation key key (EVENT-020, DMS-009): f itself when
// f does not name group or knows key already, else a copy. A group becomes a
// DM's after its subscription started when the DM is stitched later.
func (f *Filter) Stitched(group, key []byte) *Filter {
	if f.groups == nil || len(key) == 0 {
		return f
	}
	if _, ok := f.groups[string(group)]; !ok {
		return f
	}
	if _, ok := f.dmKeys[string(key)]; ok {
		return f
	}
	c := *f
	c.dmKeys = make(map[string]struct{}, len(f.dmKeys)+1)
	for k := range f.dmKeys {
		c.dmKeys[k] = struct{}{}
	}
	c.dmKeys[string(key)] = struct{}{}
	return &c
}

// truncate keeps an echoed value short in an error message.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Match reports whether e enters the subscription's queue (EVENT-020). It
// does not allocate.
func (f *Filter) Match(e *Event) bool {
	if e.lagged {
		return true // EVENT-022
	}
	if f.kinds&e.kindBit == 0 {
		return false
	}
	// An event that names no group is not narrowed by group_ids.
	if f.groups != nil && e.namesGroup {
		if _, ok := f.groups[string(e.group)]; !ok {
			// A stitched DM is one conversation: a filter naming any of its
			// groups selects the events of all of them.
			if len(e.convKey) == 0 {
				return false
			}
			if _, ok := f.dmKeys[string(e.convKey)]; !ok {
				return false
			}
		}
	}
	if !e.msgRecv {
		return true
	}
	if f.contentTypes != nil {
		if e.contentType == nil {
			return false
		}
		found := false
		for i := range f.contentTypes {
			if f.contentTypes[i].Matches(*e.contentType) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	if f.refOwn && !e.refOwn {
		return false // EVENT-021
	}
	return true
}
