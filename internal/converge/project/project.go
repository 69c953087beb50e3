// Package project is where converge makes events: it turns what the MLS
// engine observed for one hosted member into that member's client events,
// from its own point of view, with exactly the payload members the events
// spec names and only for the changes its kind table names.
//
// Everything here is a pure function of its arguments, so the same input
// always projects to the same events: the basis of deterministic event ids
// (EVENT-001).
package project

import (
	"bytes"
	"slices"
	"strconv"
	"strings"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// SupportedProtocolVersion is the newest protocol version the fabric
// implements. A group whose protocol version floor is above it is paused
// (META-062).
const SupportedProtocolVersion = "1.0.0"

// Event is one projected event and the facts about it that the gateway's
// filters need but the payload lacks.
type Event struct {
	schema.ClientEvent
	// ReferencesOwn is set for a message.received that is a reply or
	// reaction naming a message the member holds and whose sender is the
	// member's own inbox (EVENT-021, header Fabric-References-Own).
	ReferencesOwn bool
}

// Member is one hosted member's point of view on a group.
type Member struct {
	// InboxID is the member's own inbox (lowercase hex account id).
	InboxID string
	// Installation is the member's installation key (its leaf's signature
	// key).
	Installation []byte
	// LeaveRequested is set when the own inbox published a leave request
	// (a Remove proposal of its own leaf) in the group (EVENT-006).
	LeaveRequested bool
}

// Joined is the conversation.joined event of a member that stored the group.
// adderInboxID is set exactly when origin is welcomed (EVENT-005, EVENT-023).
func Joined(groupID []byte, comps components.Set, origin schema.JoinOrigin, adderInboxID string) Event {
	p := &schema.ConversationJoined{
		GroupID:          schema.Bytes(groupID),
		ConversationType: ConversationType(comps),
		Origin:           origin,
	}
	if origin == schema.OriginWelcomed {
		a := adderInboxID
		p.AdderInboxID = &a
	}
	return Event{ClientEvent: schema.ClientEvent{Kind: schema.KindConversationJoined, ConversationJoined: p}}
}

// ConversationType is the conversation type the components name: dm for a
// DM, group otherwise.
func ConversationType(comps components.Set) schema.ConversationType {
	if comps.Conversation != nil && comps.Conversation.Kind == components.KindDM {
		return schema.ConversationDM
	}
	return schema.ConversationGroup
}

// Commit is what one applied commit changed, as every member sees it.
type Commit struct {
	// AddedInboxIDs are inboxes that had no leaf before and have one after.
	AddedInboxIDs []string
	// RemovedInboxIDs are inboxes that had a leaf before and have none after.
	RemovedInboxIDs []string
	// RemovedInstallations are the installation keys of removed leaves.
	RemovedInstallations [][]byte
	// Before and After are the group's components around the commit.
	Before, After components.Set
}

// CommitEvents projects one applied commit for member m, in kind-table
// order (EVENT-012): conversation.removed when the commit removes m's
// installation (cause left exactly when m's inbox had a leave request,
// EVENT-006); conversation.membership_changed when it adds or removes a
// member inbox (a commit that removes only this installation while its inbox
// remains changes no inbox, so it has none); conversation.metadata_changed
// with the EVENT-019 names of the changed components; conversation.paused
// when the protocol version floor rises above the supported version.
func CommitEvents(groupID []byte, m Member, c Commit) []Event {
	var out []Event
	gid := schema.Bytes(groupID)
	if containsKey(c.RemovedInstallations, m.Installation) {
		cause := schema.RemovalRemoved
		if m.LeaveRequested {
			cause = schema.RemovalLeft
		}
		out = append(out, Event{ClientEvent: schema.ClientEvent{
			Kind:                schema.KindConversationRemoved,
			ConversationRemoved: &schema.ConversationRemoved{GroupID: gid, Cause: cause},
		}})
	}
	if len(c.AddedInboxIDs) > 0 || len(c.RemovedInboxIDs) > 0 {
		out = append(out, Event{ClientEvent: schema.ClientEvent{
			Kind: schema.KindMembershipChanged,
			MembershipChanged: &schema.MembershipChanged{
				GroupID:         gid,
				AddedInboxIDs:   sortedOrEmpty(c.AddedInboxIDs),
				RemovedInboxIDs: sortedOrEmpty(c.RemovedInboxIDs),
			},
		}})
	}
	if changed := components.Diff(c.Before, c.After); len(changed) > 0 {
		out = append(out, Event{ClientEvent: schema.ClientEvent{
			Kind:            schema.KindMetadataChanged,
			MetadataChanged: &schema.MetadataChanged{GroupID: gid, Changed: changed},
		}})
	}
	if floor, ok := Paused(c.After); ok {
		if _, was := Paused(c.Before); !was {
			out = append(out, Event{ClientEvent: schema.ClientEvent{
				Kind:               schema.KindConversationPaused,
				ConversationPaused: &schema.ConversationPaused{GroupID: gid, Floor: floor},
			}})
		}
	}
	return out
}

// Paused reports whether comps pause the group: its protocol version floor
// is above SupportedProtocolVersion (META-062). It returns the floor.
func Paused(comps components.Set) (string, bool) {
	if comps.ProtocolFloor == nil {
		return "", false
	}
	f := *comps.ProtocolFloor
	return f, CompareVersions(f, SupportedProtocolVersion) > 0
}

// CompareVersions compares two dotted numeric versions ("1.2.0"), missing
// parts counting as 0. A part that is not a number compares above every
// number, so an unknown floor pauses rather than runs.
func CompareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(as), len(bs)); i++ {
		x, y := versionPart(as, i), versionPart(bs, i)
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}

func versionPart(parts []string, i int) uint64 {
	if i >= len(parts) {
		return 0
	}
	n, err := strconv.ParseUint(parts[i], 10, 32)
	if err != nil {
		return 1 << 40
	}
	return n
}

// Message is one decrypted application message as the group stores it.
type Message struct {
	ID []byte
	// SenderInboxID and SenderInstallation name the sending leaf.
	SenderInboxID      string
	SenderInstallation []byte
	// ContentType is the payload's content type; nil when it has none.
	ContentType *schema.ContentTypeID
	// ExpiresAt is the message's expiry under disappearing messages
	// (META-050) in unix milliseconds; 0 when it has none.
	ExpiresAt int64
	// ReferencesOwn is set when the message is a reply or reaction whose
	// referenced message the member holds and was sent by its own inbox.
	ReferencesOwn bool
}

// Received is the message.received event of msg for member m, or false when
// the kind table gives none: the sender installation is m's own, or the
// message had expired by now (unix ms). The group id is the group the
// message is stored in (EVENT-018).
func Received(groupID []byte, m Member, msg Message, now int64) (Event, bool) {
	if bytes.Equal(msg.SenderInstallation, m.Installation) {
		return Event{}, false
	}
	if msg.ExpiresAt != 0 && msg.ExpiresAt <= now {
		return Event{}, false
	}
	return Event{
		ClientEvent: schema.ClientEvent{
			Kind: schema.KindMessageReceived,
			MessageReceived: &schema.MessageReceived{
				GroupID:       schema.Bytes(groupID),
				MessageID:     schema.Bytes(msg.ID),
				ContentType:   msg.ContentType,
				SenderInboxID: msg.SenderInboxID,
			},
		},
		ReferencesOwn: msg.ReferencesOwn,
	}, true
}

// Deleted is the message.deleted event (cause deleted) of a deletion applied
// under PROC-037 to target.
func Deleted(groupID, target []byte) Event {
	return Event{ClientEvent: schema.ClientEvent{
		Kind: schema.KindMessageDeleted,
		MessageDeleted: &schema.MessageDeleted{
			GroupID: schema.Bytes(groupID), MessageID: schema.Bytes(target), Cause: schema.DeletionDeleted,
		},
	}}
}

// Expired is the message.expired event of a message the cleanup pass
// deleted under META-063.
func Expired(groupID, msgID []byte) Event {
	return Event{ClientEvent: schema.ClientEvent{
		Kind:           schema.KindMessageExpired,
		MessageExpired: &schema.MessageRef{GroupID: schema.Bytes(groupID), MessageID: schema.Bytes(msgID)},
	}}
}

// ForkDetected is the conversation.fork_detected event of a group whose
// fork state became forked: the member is left with no branch it can
// follow (convergence.Group.Forked). Competing commits that branch
// selection resolves are not a fork in this sense (docs/convergence.md,
// "Fork state").
func ForkDetected(groupID []byte) Event {
	return Event{ClientEvent: schema.ClientEvent{
		Kind:                     schema.KindConversationForkDetected,
		ConversationForkDetected: &schema.GroupRef{GroupID: schema.Bytes(groupID)},
	}}
}

// Superseded is the fabric.commit_superseded event of an applied commit
// that branch selection replaced: the events attributed to its digest, the
// ones withdrawn names, no longer hold.
func Superseded(groupID, commitDigest []byte, withdrawn []string) Event {
	return Event{ClientEvent: schema.ClientEvent{
		Kind: schema.KindCommitSuperseded,
		CommitSuperseded: &schema.CommitSuperseded{
			GroupID: schema.Bytes(groupID), CommitDigest: schema.Bytes(commitDigest), WithdrawnEventIDs: append([]string{}, withdrawn...),
		},
	}}
}

// Invalidated is the fabric.message_invalidated event of a delivered
// application message that is not on the selected branch.
func Invalidated(groupID, msgID []byte) Event {
	return Event{ClientEvent: schema.ClientEvent{
		Kind:               schema.KindMessageInvalidated,
		MessageInvalidated: &schema.MessageRef{GroupID: schema.Bytes(groupID), MessageID: schema.Bytes(msgID)},
	}}
}

// StatusChanged is the message.status_changed event of a message the
// member's own installation sent (SEND): from the fabric's own state, not a
// tenant's assertion.
func StatusChanged(groupID, msgID []byte, previous, current schema.MessageStatus) Event {
	return Event{ClientEvent: schema.ClientEvent{
		Kind: schema.KindMessageStatusChanged,
		MessageStatusChanged: &schema.MessageStatusChanged{
			GroupID: schema.Bytes(groupID), MessageID: schema.Bytes(msgID), Previous: previous, Current: current,
		},
	}}
}

// Order sorts the events of one transaction into kind-table order, keeping
// the order of events of one kind (EVENT-012).
func Order(evs []Event) {
	slices.SortStableFunc(evs, func(a, b Event) int { return a.Kind.Order() - b.Kind.Order() })
}

func containsKey(keys [][]byte, k []byte) bool {
	return slices.ContainsFunc(keys, func(x []byte) bool { return bytes.Equal(x, k) })
}

func sortedOrEmpty(s []string) []string {
	out := append([]string{}, s...)
	slices.Sort(out)
	return out
}
