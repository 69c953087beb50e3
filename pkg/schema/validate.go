package schema

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

func invalid(member, reason string) error {
	return &ValidationError{Member: member, Reason: reason}
}

// under prefixes parent to the member path of a ValidationError.
func under(parent string, err error) error {
	if e, ok := err.(*ValidationError); ok {
		e.Member = path(parent, e.Member)
	}
	return err
}

func needBytes(member string, b Bytes) error {
	if len(b) == 0 {
		return invalid(member, "required and must not be empty")
	}
	return nil
}

func needKey(member string, b Bytes, size int) error {
	if len(b) != size {
		return invalid(member, fmt.Sprintf("must be %d bytes, not %d", size, len(b)))
	}
	return nil
}

func needString(member, s string) error {
	if s == "" {
		return invalid(member, "required and must not be empty")
	}
	return checkUTF8(member, s)
}

func checkUTF8(member, s string) error {
	if !utf8.ValidString(s) {
		return invalid(member, "not valid UTF-8")
	}
	return nil
}

func needStrings(member string, list []string) error {
	if list == nil {
		return invalid(member, "required: an empty sequence is [], not absent")
	}
	for i, s := range list {
		if s == "" {
			return invalid(member, fmt.Sprintf("entry %d is empty", i))
		}
		if !utf8.ValidString(s) {
			return invalid(member, fmt.Sprintf("entry %d is not valid UTF-8", i))
		}
	}
	return nil
}

type enum interface{ Valid() bool }

func needEnum(member string, v enum) error {
	if !v.Valid() {
		return invalid(member, "unknown value")
	}
	return nil
}

// firstErr returns the first non-nil error.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Validate checks e against the contract:
//   - Kind is known, and exactly one payload member is present: the one the
//     kind table names for Kind (EVENT-001);
//   - every required member is set: non-empty group_id, message_id and
//     required strings, non-nil required sequences; strings are UTF-8;
//   - enums hold known values; installation keys and commit digests are 32
//     bytes;
//   - adder_inbox_id is present exactly when origin is welcomed (EVENT-023);
//   - min_libxmtp_version is present exactly when cause is version_too_old
//     (EVENT-008);
//   - previous and current differ in message.status_changed and in
//     connection.state_changed (EVENT-027 emits only on a change);
//   - membership_changed adds or removes at least one inbox, and
//     metadata_changed names at least one item, "component:" names with four
//     lowercase hex digits (EVENT-019);
//   - a conversation consent entity is the group id in lowercase hex;
//     content digests are lowercase hex; lagged discarded at least one event.
//
// A failure is a *ValidationError naming the member.
func (e ClientEvent) Validate() error {
	if !e.Kind.Valid() {
		return invalid("kind", "unknown kind")
	}
	want := e.Kind.Member()
	n := b2i(e.ConversationJoined != nil) +
		b2i(e.ConversationRemoved != nil) +
		b2i(e.MembershipChanged != nil) +
		b2i(e.MetadataChanged != nil) +
		b2i(e.ConversationPaused != nil) +
		b2i(e.MessageReceived != nil) +
		b2i(e.MessageStatusChanged != nil) +
		b2i(e.MessageDeleted != nil) +
		b2i(e.MessageExpired != nil) +
		b2i(e.ConsentChanged != nil) +
		b2i(e.HmacKeysUpdated != nil) +
		b2i(e.IdentityRegistered != nil) +
		b2i(e.OwnInstallationAdded != nil) +
		b2i(e.OwnInstallationRevoked != nil) +
		b2i(e.RejectedByServer != nil) +
		b2i(e.LockoutChanged != nil) +
		b2i(e.ConversationForkDetected != nil) +
		b2i(e.NotificationsFailed != nil) +
		b2i(e.ArchiveRestored != nil) +
		b2i(e.ConnectionStateChanged != nil) +
		b2i(e.AttachmentUploadStarted != nil) +
		b2i(e.AttachmentUploadCompleted != nil) +
		b2i(e.AttachmentUploadFailed != nil) +
		b2i(e.AttachmentDownloadStarted != nil) +
		b2i(e.AttachmentDownloadCompleted != nil) +
		b2i(e.AttachmentDownloadFailed != nil) +
		b2i(e.AttachmentDeleted != nil) +
		b2i(e.HandleChanged != nil) +
		b2i(e.Lagged != nil) +
		b2i(e.CommitSuperseded != nil) +
		b2i(e.MessageInvalidated != nil)
	var (
		p  interface{ validate() error }
		ok bool
	)
	switch e.Kind {
	case KindConversationJoined:
		p, ok = e.ConversationJoined, e.ConversationJoined != nil
	case KindConversationRemoved:
		p, ok = e.ConversationRemoved, e.ConversationRemoved != nil
	case KindMembershipChanged:
		p, ok = e.MembershipChanged, e.MembershipChanged != nil
	case KindMetadataChanged:
		p, ok = e.MetadataChanged, e.MetadataChanged != nil
	case KindConversationPaused:
		p, ok = e.ConversationPaused, e.ConversationPaused != nil
	case KindMessageReceived:
		p, ok = e.MessageReceived, e.MessageReceived != nil
	case KindMessageStatusChanged:
		p, ok = e.MessageStatusChanged, e.MessageStatusChanged != nil
	case KindMessageDeleted:
		p, ok = e.MessageDeleted, e.MessageDeleted != nil
	case KindMessageExpired:
		p, ok = e.MessageExpired, e.MessageExpired != nil
	case KindConsentChanged:
		p, ok = e.ConsentChanged, e.ConsentChanged != nil
	case KindHmacKeysUpdated:
		p, ok = e.HmacKeysUpdated, e.HmacKeysUpdated != nil
	case KindIdentityRegistered:
		p, ok = e.IdentityRegistered, e.IdentityRegistered != nil
	case KindOwnInstallationAdded:
		p, ok = e.OwnInstallationAdded, e.OwnInstallationAdded != nil
	case KindOwnInstallationRevoked:
		p, ok = e.OwnInstallationRevoked, e.OwnInstallationRevoked != nil
	case KindRejectedByServer:
		p, ok = e.RejectedByServer, e.RejectedByServer != nil
	case KindLockoutChanged:
		p, ok = e.LockoutChanged, e.LockoutChanged != nil
	case KindConversationForkDetected:
		p, ok = e.ConversationForkDetected, e.ConversationForkDetected != nil
	case KindNotificationsFailed:
		p, ok = e.NotificationsFailed, e.NotificationsFailed != nil
	case KindArchiveRestored:
		p, ok = e.ArchiveRestored, e.ArchiveRestored != nil
	case KindConnectionStateChanged:
		p, ok = e.ConnectionStateChanged, e.ConnectionStateChanged != nil
	case KindAttachmentUploadStarted:
		p, ok = e.AttachmentUploadStarted, e.AttachmentUploadStarted != nil
	case KindAttachmentUploadCompleted:
		p, ok = e.AttachmentUploadCompleted, e.AttachmentUploadCompleted != nil
	case KindAttachmentUploadFailed:
		p, ok = e.AttachmentUploadFailed, e.AttachmentUploadFailed != nil
	case KindAttachmentDownloadStarted:
		p, ok = e.AttachmentDownloadStarted, e.AttachmentDownloadStarted != nil
	case KindAttachmentDownloadCompleted:
		p, ok = e.AttachmentDownloadCompleted, e.AttachmentDownloadCompleted != nil
	case KindAttachmentDownloadFailed:
		p, ok = e.AttachmentDownloadFailed, e.AttachmentDownloadFailed != nil
	case KindAttachmentDeleted:
		p, ok = e.AttachmentDeleted, e.AttachmentDeleted != nil
	case KindHandleChanged:
		p, ok = e.HandleChanged, e.HandleChanged != nil
	case KindLagged:
		p, ok = e.Lagged, e.Lagged != nil
	case KindCommitSuperseded:
		p, ok = e.CommitSuperseded, e.CommitSuperseded != nil
	case KindMessageInvalidated:
		p, ok = e.MessageInvalidated, e.MessageInvalidated != nil
	}
	switch {
	case !ok && n == 0:
		return invalid(want, "missing: kind "+string(e.Kind)+" carries this member")
	case !ok:
		return invalid(e.presentMember(), "not the member of kind "+string(e.Kind)+" (want "+want+")")
	case n > 1:
		return invalid(want, "exactly one payload member may be present")
	}
	return under(want, p.validate())
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// presentMember names the first payload member present, for an error.
func (e ClientEvent) presentMember() string {
	switch {
	case e.ConversationJoined != nil:
		return "conversation_joined"
	case e.ConversationRemoved != nil:
		return "conversation_removed"
	case e.MembershipChanged != nil:
		return "membership_changed"
	case e.MetadataChanged != nil:
		return "metadata_changed"
	case e.ConversationPaused != nil:
		return "conversation_paused"
	case e.MessageReceived != nil:
		return "message_received"
	case e.MessageStatusChanged != nil:
		return "message_status_changed"
	case e.MessageDeleted != nil:
		return "message_deleted"
	case e.MessageExpired != nil:
		return "message_expired"
	case e.ConsentChanged != nil:
		return "consent_changed"
	case e.HmacKeysUpdated != nil:
		return "hmac_keys_updated"
	case e.IdentityRegistered != nil:
		return "identity_registered"
	case e.OwnInstallationAdded != nil:
		return "own_installation_added"
	case e.OwnInstallationRevoked != nil:
		return "own_installation_revoked"
	case e.RejectedByServer != nil:
		return "rejected_by_server"
	case e.LockoutChanged != nil:
		return "lockout_changed"
	case e.ConversationForkDetected != nil:
		return "conversation_fork_detected"
	case e.NotificationsFailed != nil:
		return "notifications_failed"
	case e.ArchiveRestored != nil:
		return "archive_restored"
	case e.ConnectionStateChanged != nil:
		return "connection_state_changed"
	case e.AttachmentUploadStarted != nil:
		return "attachment_upload_started"
	case e.AttachmentUploadCompleted != nil:
		return "attachment_upload_completed"
	case e.AttachmentUploadFailed != nil:
		return "attachment_upload_failed"
	case e.AttachmentDownloadStarted != nil:
		return "attachment_download_started"
	case e.AttachmentDownloadCompleted != nil:
		return "attachment_download_completed"
	case e.AttachmentDownloadFailed != nil:
		return "attachment_download_failed"
	case e.AttachmentDeleted != nil:
		return "attachment_deleted"
	case e.HandleChanged != nil:
		return "handle_changed"
	case e.Lagged != nil:
		return "lagged"
	case e.CommitSuperseded != nil:
		return "commit_superseded"
	case e.MessageInvalidated != nil:
		return "message_invalidated"
	}
	return ""
}

func (p *GroupRef) validate() error { return needBytes("group_id", p.GroupID) }

func (p *MessageRef) validate() error {
	return firstErr(needBytes("group_id", p.GroupID), needBytes("message_id", p.MessageID))
}

func (p *ConversationJoined) validate() error {
	if err := firstErr(
		needBytes("group_id", p.GroupID),
		needEnum("conversation_type", p.ConversationType),
		needEnum("origin", p.Origin),
	); err != nil {
		return err
	}
	// EVENT-023: present exactly when welcomed.
	switch {
	case p.Origin == OriginWelcomed && p.AdderInboxID == nil:
		return invalid("adder_inbox_id", "required when origin is welcomed (EVENT-023)")
	case p.Origin != OriginWelcomed && p.AdderInboxID != nil:
		return invalid("adder_inbox_id", "present only when origin is welcomed (EVENT-023)")
	case p.AdderInboxID != nil:
		return needString("adder_inbox_id", *p.AdderInboxID)
	}
	return nil
}

func (p *ConversationRemoved) validate() error {
	return firstErr(needBytes("group_id", p.GroupID), needEnum("cause", p.Cause))
}

func (p *MembershipChanged) validate() error {
	if err := firstErr(
		needBytes("group_id", p.GroupID),
		needStrings("added_inbox_ids", p.AddedInboxIDs),
		needStrings("removed_inbox_ids", p.RemovedInboxIDs),
	); err != nil {
		return err
	}
	if len(p.AddedInboxIDs) == 0 && len(p.RemovedInboxIDs) == 0 {
		return invalid("added_inbox_ids", "a membership change adds or removes at least one inbox")
	}
	return nil
}

func (p *MetadataChanged) validate() error {
	if err := firstErr(needBytes("group_id", p.GroupID), needStrings("changed", p.Changed)); err != nil {
		return err
	}
	if len(p.Changed) == 0 {
		return invalid("changed", "names at least one changed item (EVENT-019)")
	}
	for i, c := range p.Changed {
		if id, ok := strings.CutPrefix(c, "component:"); ok && !isComponentID(id) {
			return invalid("changed", fmt.Sprintf("entry %d: component: must be followed by four lowercase hex digits (EVENT-019)", i))
		}
	}
	return nil
}

func isComponentID(s string) bool { return len(s) == 4 && isLowerHex(s) }

func (p *ConversationPaused) validate() error {
	return firstErr(needBytes("group_id", p.GroupID), needString("floor", p.Floor))
}

func (p *MessageReceived) validate() error {
	if err := firstErr(
		needBytes("group_id", p.GroupID),
		needBytes("message_id", p.MessageID),
		needString("sender_inbox_id", p.SenderInboxID),
	); err != nil {
		return err
	}
	if p.ContentType != nil {
		return under("content_type", p.ContentType.validate())
	}
	return nil
}

func (c *ContentTypeID) validate() error {
	return firstErr(needString("authority_id", c.AuthorityID), needString("type_id", c.TypeID))
}

func (p *MessageStatusChanged) validate() error {
	if err := firstErr(
		needBytes("group_id", p.GroupID),
		needBytes("message_id", p.MessageID),
		needEnum("previous", p.Previous),
		needEnum("current", p.Current),
	); err != nil {
		return err
	}
	if p.Previous == p.Current {
		return invalid("current", "must differ from previous: the event reports a change")
	}
	return nil
}

func (p *MessageDeleted) validate() error {
	return firstErr(
		needBytes("group_id", p.GroupID),
		needBytes("message_id", p.MessageID),
		needEnum("cause", p.Cause),
	)
}

func (p *ConsentChanged) validate() error {
	if err := firstErr(
		needEnum("entity_kind", p.EntityKind),
		needString("entity", p.Entity),
		needEnum("state", p.State),
	); err != nil {
		return err
	}
	if p.EntityKind == ConsentEntityConversation && !isLowerHex(p.Entity) {
		return invalid("entity", "a conversation entity is the group id in lowercase hex (EVENT-009)")
	}
	return nil
}

func (p *HmacKeysUpdated) validate() error { return nil }

func (p *IdentityRegistered) validate() error {
	return firstErr(
		needString("inbox_id", p.InboxID),
		needKey("installation_key", p.InstallationKey, InstallationKeySize),
	)
}

func (p *InstallationRef) validate() error {
	return needKey("installation_key", p.InstallationKey, InstallationKeySize)
}

func (p *InstallationRevoked) validate() error {
	return needKey("installation_key", p.InstallationKey, InstallationKeySize)
}

func (p *ClientRejectedByServer) validate() error {
	if err := needEnum("cause", p.Cause); err != nil {
		return err
	}
	// EVENT-008: present exactly when version_too_old.
	switch {
	case p.Cause == RejectionVersionTooOld && p.MinLibxmtpVersion == nil:
		return invalid("min_libxmtp_version", "required when cause is version_too_old (EVENT-008)")
	case p.Cause != RejectionVersionTooOld && p.MinLibxmtpVersion != nil:
		return invalid("min_libxmtp_version", "present only when cause is version_too_old (EVENT-008)")
	case p.MinLibxmtpVersion != nil:
		return needString("min_libxmtp_version", *p.MinLibxmtpVersion)
	}
	return nil
}

func (p *LockoutChanged) validate() error { return needEnum("change", p.Change) }

func (p *NotificationsFailed) validate() error { return needString("cause", p.Cause) }

func (p *ArchiveRestored) validate() error { return nil }

func (p *ConnectionStateChanged) validate() error {
	if err := firstErr(needEnum("previous", p.Previous), needEnum("current", p.Current)); err != nil {
		return err
	}
	if p.Previous == p.Current {
		return invalid("current", "must differ from previous (EVENT-027)")
	}
	return nil
}

func validateAttachment(key, url, digest string) error {
	if err := firstErr(
		needString("attachment_key", key),
		needString("url", url),
		needString("content_digest", digest),
	); err != nil {
		return err
	}
	if !isLowerHex(digest) {
		return invalid("content_digest", "must be lowercase hex")
	}
	return nil
}

func (p *AttachmentRef) validate() error {
	return validateAttachment(p.AttachmentKey, p.URL, p.ContentDigest)
}

func (p *AttachmentFailed) validate() error {
	return firstErr(
		validateAttachment(p.AttachmentKey, p.URL, p.ContentDigest),
		needString("cause", p.Cause),
	)
}

func (p *HandleChanged) validate() error {
	return firstErr(needString("inbox_id", p.InboxID), needString("handle", p.Handle))
}

func (p *Lagged) validate() error {
	if p.Discarded == 0 {
		return invalid("discarded", "a lagged event reports at least one discarded event (EVENT-031)")
	}
	return nil
}

func (p *CommitSuperseded) validate() error {
	if err := firstErr(
		needBytes("group_id", p.GroupID),
		needKey("commit_digest", p.CommitDigest, CommitDigestSize),
	); err != nil {
		return err
	}
	for i, id := range p.WithdrawnEventIDs {
		if len(id) != EventIDSize || !isLowerHex(id) {
			return invalid("withdrawn_event_ids", fmt.Sprintf("entry %d: an event id is %d lowercase hex digits", i, EventIDSize))
		}
	}
	return nil
}

// Validate checks f: every kind is known; group ids are non-empty; content
// types are complete. A failure is a *ValidationError naming the member.
func (f EventFilter) Validate() error {
	for i, k := range f.Kinds {
		if !k.Valid() {
			return invalid("kinds", fmt.Sprintf("entry %d is an unknown kind", i))
		}
	}
	for i, g := range f.GroupIDs {
		if len(g) == 0 {
			return invalid("group_ids", fmt.Sprintf("entry %d is empty", i))
		}
	}
	for i := range f.ContentTypes {
		if err := f.ContentTypes[i].validate(); err != nil {
			return under(fmt.Sprintf("content_types[%d]", i), err)
		}
	}
	return nil
}

// Validate checks m: V is TransportVersion, Kind is known, Group and
// Payload are non-empty and within MaxGroupIDSize and
// MaxTransportPayloadSize, and a sealed payload is at least
// MinSealedPayloadSize. A failure is a *ValidationError naming the member.
func (m TransportMessage) Validate() error {
	switch {
	case m.V != TransportVersion:
		return invalid("v", fmt.Sprintf("must be %d", TransportVersion))
	case len(m.Group) == 0:
		return invalid("group", "required and must not be empty")
	case len(m.Group) > MaxGroupIDSize:
		return invalid("group", fmt.Sprintf("longer than %d bytes", MaxGroupIDSize))
	case !m.Kind.Valid():
		return invalid("kind", "unknown transport kind")
	case len(m.Payload) == 0:
		return invalid("payload", "required and must not be empty")
	case len(m.Payload) > MaxTransportPayloadSize:
		return invalid("payload", fmt.Sprintf("longer than %d bytes", MaxTransportPayloadSize))
	case m.Kind == TransportSealed && len(m.Payload) < MinSealedPayloadSize:
		return invalid("payload", fmt.Sprintf("a sealed payload is at least %d bytes", MinSealedPayloadSize))
	}
	return nil
}

// rejectable lists the categories a rejection (status rejected) may carry:
// the pre-convergence gate and local admission checks, the terminal
// parent-dependent failures, and resource_refused.
func rejectable(c Category) bool {
	switch c {
	case CategoryDuplicate, CategoryOwnEcho, CategoryWrongRecipient, CategoryUnknownGroup,
		CategoryInvalidEncoding, CategoryInvalidSignature, CategoryUnsupportedRequiredFeature,
		CategoryAuthorizationFailed, CategoryResourceRefused:
		return true
	}
	return false
}

// Validate checks o against the outcome vocabulary:
//   - message_id is non-empty, class and status are known, revision ≥ 1 and
//     time is set;
//   - rejected: a category from the rejection set (no transport_rejected,
//     which is outbound; no transport_deferred, stale_epoch or
//     missing_history, which are not terminal) and no disposition or named
//     outcome;
//   - deferred: category transport_deferred and no disposition or named
//     outcome;
//   - queued without a disposition: no category and no named outcome;
//   - class sealed (an object not yet opened) is never queued;
//   - queued with a disposition: accepted carries no category or named
//     outcome; deferred, stale and invalidated may carry stale_epoch,
//     missing_history or duplicate; a named outcome fixes both disposition
//     and category (BeyondAnchor → stale/stale_epoch,
//     MissingRetainedAnchor → deferred/missing_history);
//   - reason only beside a category, UTF-8, at most MaxOutcomeReason bytes.
//
// A failure is a *ValidationError naming the member.
func (o Outcome) Validate() error {
	if err := firstErr(
		needBytes("message_id", o.MessageID),
		needEnum("class", o.Class),
		needEnum("status", o.Status),
	); err != nil {
		return err
	}
	if o.Revision == 0 {
		return invalid("revision", "must be at least 1")
	}
	if o.Time.IsZero() {
		return invalid("time", "required")
	}
	if o.Category != "" && !o.Category.Valid() {
		return invalid("category", "unknown value")
	}
	if o.Disposition != "" && !o.Disposition.Valid() {
		return invalid("disposition", "unknown value")
	}
	if o.NamedOutcome != "" && !o.NamedOutcome.Valid() {
		return invalid("named_outcome", "unknown value")
	}
	if o.Reason != "" {
		switch {
		case o.Category == "":
			return invalid("reason", "only beside a category")
		case len(o.Reason) > MaxOutcomeReason:
			return invalid("reason", "longer than MaxOutcomeReason bytes")
		case !utf8.ValidString(o.Reason):
			return invalid("reason", "not UTF-8")
		}
	}
	if o.Class == ClassSealed && o.Status == StatusQueued {
		return invalid("class", "a sealed object is not queued before it is opened")
	}
	switch o.Status {
	case StatusRejected, StatusDeferred:
		switch {
		case o.Disposition != "":
			return invalid("disposition", "a "+string(o.Status)+" input has no convergence disposition")
		case o.NamedOutcome != "":
			return invalid("named_outcome", "a "+string(o.Status)+" input has no named outcome")
		case o.Category == "":
			return invalid("category", "required when status is "+string(o.Status))
		case o.Status == StatusRejected && !rejectable(o.Category):
			return invalid("category", string(o.Category)+" is not a rejection category")
		case o.Status == StatusDeferred && o.Category != CategoryTransportDeferred:
			return invalid("category", "a deferred intake is transport_deferred")
		}
		return nil
	}
	// Queued.
	if o.Disposition == "" {
		switch {
		case o.Category != "":
			return invalid("category", "a queued input without a disposition has no category")
		case o.NamedOutcome != "":
			return invalid("named_outcome", "a named outcome needs its disposition")
		}
		return nil
	}
	if o.NamedOutcome != "" {
		switch {
		case o.Disposition != o.NamedOutcome.Disposition():
			return invalid("disposition", string(o.NamedOutcome)+" is "+string(o.NamedOutcome.Disposition()))
		case o.Category != o.NamedOutcome.Category():
			return invalid("category", string(o.NamedOutcome)+" is "+string(o.NamedOutcome.Category()))
		}
		return nil
	}
	switch o.Category {
	case "":
	case CategoryStaleEpoch, CategoryMissingHistory, CategoryDuplicate:
		if o.Disposition == DispositionAccepted {
			return invalid("category", "an accepted input carries no category")
		}
	default:
		return invalid("category", string(o.Category)+" does not go with a disposition")
	}
	return nil
}
