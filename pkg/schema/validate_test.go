package schema

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// sample returns a fresh copy of the named sample event.
func sample(t testing.TB, name string) ClientEvent {
	t.Helper()
	for _, s := range sampleEvents() {
		if s.name == name {
			return s.ev
		}
	}
	t.Fatalf("no sample %s", name)
	return ClientEvent{}
}

func wantInvalid(t *testing.T, err error, member string) {
	t.Helper()
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("err = %v, want a *ValidationError for %s", err, member)
	}
	if ve.Member != member {
		t.Fatalf("invalid member = %q (%s), want %q", ve.Member, ve.Reason, member)
	}
}

func TestSamplesAreValid(t *testing.T) {
	for _, s := range sampleEvents() {
		if err := s.ev.Validate(); err != nil {
			t.Errorf("%s: %v", s.name, err)
		}
	}
}

func TestValidateEventRules(t *testing.T) {
	tooShort := fill(31, 1)
	cases := []struct {
		name   string
		sample string
		mutate func(e *ClientEvent)
		member string
	}{
		{"unknown kind", "lagged", func(e *ClientEvent) { e.Kind = "lagged.v2" }, "kind"},
		{"empty kind", "lagged", func(e *ClientEvent) { e.Kind = "" }, "kind"},
		// EVENT-001: exactly the kind table's member.
		{"no payload", "lagged", func(e *ClientEvent) { e.Lagged = nil }, "lagged"},
		{"wrong payload", "lagged", func(e *ClientEvent) { e.Kind = KindHmacKeysUpdated }, "lagged"},
		{"two payloads", "lagged", func(e *ClientEvent) { e.HmacKeysUpdated = &HmacKeysUpdated{} }, "lagged"},
		{"two payloads, neither the kind's", "lagged", func(e *ClientEvent) {
			e.Kind = KindMessageExpired
			e.HmacKeysUpdated = &HmacKeysUpdated{}
		}, "hmac_keys_updated"},
		{"shared type, wrong member", "attachment.deleted", func(e *ClientEvent) {
			e.AttachmentUploadStarted, e.AttachmentDeleted = e.AttachmentDeleted, nil
		}, "attachment_upload_started"},

		{"joined group_id", "conversation.joined-created", func(e *ClientEvent) { e.ConversationJoined.GroupID = nil }, "conversation_joined.group_id"},
		{"joined type", "conversation.joined-created", func(e *ClientEvent) { e.ConversationJoined.ConversationType = "channel" }, "conversation_joined.conversation_type"},
		{"joined origin", "conversation.joined-created", func(e *ClientEvent) { e.ConversationJoined.Origin = "" }, "conversation_joined.origin"},
		// EVENT-023.
		{"adder missing when welcomed", "conversation.joined-welcomed", func(e *ClientEvent) { e.ConversationJoined.AdderInboxID = nil }, "conversation_joined.adder_inbox_id"},
		{"adder present when created", "conversation.joined-created", func(e *ClientEvent) { e.ConversationJoined.AdderInboxID = strp(sampleOther) }, "conversation_joined.adder_inbox_id"},
		{"adder empty", "conversation.joined-welcomed", func(e *ClientEvent) { e.ConversationJoined.AdderInboxID = strp("") }, "conversation_joined.adder_inbox_id"},
		{"removed cause", "conversation.removed", func(e *ClientEvent) { e.ConversationRemoved.Cause = "kicked" }, "conversation_removed.cause"},
		{"removed group", "conversation.removed", func(e *ClientEvent) { e.ConversationRemoved.GroupID = Bytes{} }, "conversation_removed.group_id"},
		{"membership added nil", "conversation.membership_changed", func(e *ClientEvent) { e.MembershipChanged.AddedInboxIDs = nil }, "membership_changed.added_inbox_ids"},
		{"membership removed nil", "conversation.membership_changed", func(e *ClientEvent) { e.MembershipChanged.RemovedInboxIDs = nil }, "membership_changed.removed_inbox_ids"},
		{"membership no change", "conversation.membership_changed", func(e *ClientEvent) { e.MembershipChanged.AddedInboxIDs = []string{} }, "membership_changed.added_inbox_ids"},
		{"membership empty entry", "conversation.membership_changed", func(e *ClientEvent) { e.MembershipChanged.RemovedInboxIDs = []string{""} }, "membership_changed.removed_inbox_ids"},
		{"membership group", "conversation.membership_changed", func(e *ClientEvent) { e.MembershipChanged.GroupID = nil }, "membership_changed.group_id"},
		{"metadata changed nil", "conversation.metadata_changed", func(e *ClientEvent) { e.MetadataChanged.Changed = nil }, "metadata_changed.changed"},
		{"metadata changed empty", "conversation.metadata_changed", func(e *ClientEvent) { e.MetadataChanged.Changed = []string{} }, "metadata_changed.changed"},
		// EVENT-019: component: and four lowercase hex digits.
		{"metadata bad component", "conversation.metadata_changed", func(e *ClientEvent) { e.MetadataChanged.Changed = []string{"component:F00A"} }, "metadata_changed.changed"},
		{"metadata short component", "conversation.metadata_changed", func(e *ClientEvent) { e.MetadataChanged.Changed = []string{"component:f0"} }, "metadata_changed.changed"},
		{"paused floor", "conversation.paused", func(e *ClientEvent) { e.ConversationPaused.Floor = "" }, "conversation_paused.floor"},
		{"paused group", "conversation.paused", func(e *ClientEvent) { e.ConversationPaused.GroupID = nil }, "conversation_paused.group_id"},
		{"received group", "message.received", func(e *ClientEvent) { e.MessageReceived.GroupID = nil }, "message_received.group_id"},
		{"received message", "message.received", func(e *ClientEvent) { e.MessageReceived.MessageID = nil }, "message_received.message_id"},
		{"received sender", "message.received", func(e *ClientEvent) { e.MessageReceived.SenderInboxID = "" }, "message_received.sender_inbox_id"},
		{"received sender utf8", "message.received", func(e *ClientEvent) { e.MessageReceived.SenderInboxID = "\xff" }, "message_received.sender_inbox_id"},
		{"received authority", "message.received", func(e *ClientEvent) { e.MessageReceived.ContentType.AuthorityID = "" }, "message_received.content_type.authority_id"},
		{"received type", "message.received", func(e *ClientEvent) { e.MessageReceived.ContentType.TypeID = "" }, "message_received.content_type.type_id"},
		{"status previous", "message.status_changed", func(e *ClientEvent) { e.MessageStatusChanged.Previous = "sent" }, "message_status_changed.previous"},
		{"status current", "message.status_changed", func(e *ClientEvent) { e.MessageStatusChanged.Current = "" }, "message_status_changed.current"},
		{"status unchanged", "message.status_changed", func(e *ClientEvent) { e.MessageStatusChanged.Current = StatusUnpublished }, "message_status_changed.current"},
		{"status message", "message.status_changed", func(e *ClientEvent) { e.MessageStatusChanged.MessageID = nil }, "message_status_changed.message_id"},
		{"deleted cause", "message.deleted", func(e *ClientEvent) { e.MessageDeleted.Cause = "purged" }, "message_deleted.cause"},
		{"deleted message", "message.deleted", func(e *ClientEvent) { e.MessageDeleted.MessageID = nil }, "message_deleted.message_id"},
		{"expired group", "message.expired", func(e *ClientEvent) { e.MessageExpired.GroupID = nil }, "message_expired.group_id"},
		{"expired message", "message.expired", func(e *ClientEvent) { e.MessageExpired.MessageID = Bytes{} }, "message_expired.message_id"},
		{"consent kind", "consent.changed-inbox", func(e *ClientEvent) { e.ConsentChanged.EntityKind = "address" }, "consent_changed.entity_kind"},
		{"consent entity", "consent.changed-inbox", func(e *ClientEvent) { e.ConsentChanged.Entity = "" }, "consent_changed.entity"},
		{"consent state", "consent.changed-inbox", func(e *ClientEvent) { e.ConsentChanged.State = "" }, "consent_changed.state"},
		// EVENT-009: a conversation entity is the group id in lowercase hex.
		{"consent conversation not hex", "consent.changed-conversation", func(e *ClientEvent) { e.ConsentChanged.Entity = "6A01" }, "consent_changed.entity"},
		{"registered inbox", "identity.registered", func(e *ClientEvent) { e.IdentityRegistered.InboxID = "" }, "identity_registered.inbox_id"},
		{"registered key", "identity.registered", func(e *ClientEvent) { e.IdentityRegistered.InstallationKey = tooShort }, "identity_registered.installation_key"},
		{"added key", "identity.own_installation_added", func(e *ClientEvent) { e.OwnInstallationAdded.InstallationKey = fill(33, 1) }, "own_installation_added.installation_key"},
		{"revoked key", "identity.own_installation_revoked", func(e *ClientEvent) { e.OwnInstallationRevoked.InstallationKey = nil }, "own_installation_revoked.installation_key"},
		{"rejected cause", "client.rejected_by_server-backend", func(e *ClientEvent) { e.RejectedByServer.Cause = "banned" }, "rejected_by_server.cause"},
		// EVENT-008.
		{"min version missing", "client.rejected_by_server-version", func(e *ClientEvent) { e.RejectedByServer.MinLibxmtpVersion = nil }, "rejected_by_server.min_libxmtp_version"},
		{"min version on mismatch", "client.rejected_by_server-backend", func(e *ClientEvent) { e.RejectedByServer.MinLibxmtpVersion = strp("1.0.0") }, "rejected_by_server.min_libxmtp_version"},
		{"min version empty", "client.rejected_by_server-version", func(e *ClientEvent) { e.RejectedByServer.MinLibxmtpVersion = strp("") }, "rejected_by_server.min_libxmtp_version"},
		{"lockout change", "client.lockout_changed", func(e *ClientEvent) { e.LockoutChanged.Change = "" }, "lockout_changed.change"},
		{"fork group", "conversation.fork_detected", func(e *ClientEvent) { e.ConversationForkDetected.GroupID = nil }, "conversation_fork_detected.group_id"},
		{"notifications cause", "notifications.failed", func(e *ClientEvent) { e.NotificationsFailed.Cause = "" }, "notifications_failed.cause"},
		{"connection previous", "connection.state_changed", func(e *ClientEvent) { e.ConnectionStateChanged.Previous = "offline" }, "connection_state_changed.previous"},
		{"connection current", "connection.state_changed", func(e *ClientEvent) { e.ConnectionStateChanged.Current = "" }, "connection_state_changed.current"},
		// EVENT-027: emitted only when the state changes.
		{"connection unchanged", "connection.state_changed", func(e *ClientEvent) { e.ConnectionStateChanged.Current = ConnectionConnecting }, "connection_state_changed.current"},
		{"attachment key", "attachment.upload_started", func(e *ClientEvent) { e.AttachmentUploadStarted = &AttachmentRef{URL: "u", ContentDigest: "aa"} }, "attachment_upload_started.attachment_key"},
		{"attachment url", "attachment.deleted", func(e *ClientEvent) { e.AttachmentDeleted = &AttachmentRef{AttachmentKey: "k", ContentDigest: "aa"} }, "attachment_deleted.url"},
		{"attachment digest", "attachment.download_started", func(e *ClientEvent) {
			e.AttachmentDownloadStarted = &AttachmentRef{AttachmentKey: "k", URL: "u", ContentDigest: "AA"}
		}, "attachment_download_started.content_digest"},
		{"attachment failed cause", "attachment.upload_failed", func(e *ClientEvent) {
			e.AttachmentUploadFailed = &AttachmentFailed{AttachmentKey: "k", URL: "u", ContentDigest: "aa"}
		}, "attachment_upload_failed.cause"},
		{"attachment failed digest", "attachment.download_failed", func(e *ClientEvent) {
			e.AttachmentDownloadFailed = &AttachmentFailed{AttachmentKey: "k", URL: "u", Cause: "c"}
		}, "attachment_download_failed.content_digest"},
		{"handle inbox", "handle.changed", func(e *ClientEvent) { e.HandleChanged.InboxID = "" }, "handle_changed.inbox_id"},
		{"handle", "handle.changed", func(e *ClientEvent) { e.HandleChanged.Handle = "" }, "handle_changed.handle"},
		// EVENT-031: a lagged event reports at least one discard.
		{"lagged zero", "lagged", func(e *ClientEvent) { e.Lagged.Discarded = 0 }, "lagged.discarded"},
		{"superseded digest", "fabric.commit_superseded", func(e *ClientEvent) { e.CommitSuperseded.CommitDigest = tooShort }, "commit_superseded.commit_digest"},
		{"superseded group", "fabric.commit_superseded", func(e *ClientEvent) { e.CommitSuperseded.GroupID = nil }, "commit_superseded.group_id"},
		{"superseded event id", "fabric.commit_superseded", func(e *ClientEvent) { e.CommitSuperseded.WithdrawnEventIDs[1] = "E1" }, "commit_superseded.withdrawn_event_ids"},
		{"invalidated message", "fabric.message_invalidated", func(e *ClientEvent) { e.MessageInvalidated.MessageID = nil }, "message_invalidated.message_id"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := sample(t, c.sample)
			c.mutate(&e)
			err := e.Validate()
			wantInvalid(t, err, c.member)
			// Encoders refuse what Validate refuses.
			if _, err := e.MarshalMsgpack(); err == nil {
				t.Error("MarshalMsgpack accepted an invalid event")
			}
			if _, err := e.MarshalJSON(); err == nil {
				t.Error("MarshalJSON accepted an invalid event")
			}
		})
	}
}

func TestValidationErrorCarriesNoValue(t *testing.T) {
	e := sample(t, "message.received")
	e.MessageReceived.SenderInboxID = "\xffsecret-inbox"
	err := e.Validate()
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("err = %v", err)
	}
}

func TestValidateFilter(t *testing.T) {
	cases := []struct {
		name   string
		f      EventFilter
		member string
	}{
		{"unknown kind", EventFilter{Kinds: []EventKind{KindLagged, "message.sent"}}, "kinds"},
		{"empty group id", EventFilter{Kinds: []EventKind{}, GroupIDs: []Bytes{sampleGroup, {}}}, "group_ids"},
		{"content type authority", EventFilter{Kinds: []EventKind{}, ContentTypes: []ContentTypeID{{TypeID: "text"}}}, "content_types[0].authority_id"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { wantInvalid(t, c.f.Validate(), c.member) })
	}
}

func TestValidateTransportMessage(t *testing.T) {
	ok := TransportMessage{V: 1, Group: sampleGroup, Kind: TransportSealed, Payload: fill(MinSealedPayloadSize, 1)}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		mutate func(m *TransportMessage)
		member string
	}{
		{"version 0", func(m *TransportMessage) { m.V = 0 }, "v"},
		{"version 2", func(m *TransportMessage) { m.V = 2 }, "v"},
		{"no group", func(m *TransportMessage) { m.Group = nil }, "group"},
		{"group too long", func(m *TransportMessage) { m.Group = fill(MaxGroupIDSize+1, 1) }, "group"},
		{"unknown kind", func(m *TransportMessage) { m.Kind = "nostr" }, "kind"},
		{"no payload", func(m *TransportMessage) { m.Payload = Bytes{} }, "payload"},
		{"payload too long", func(m *TransportMessage) { m.Payload = fill(MaxTransportPayloadSize+1, 1) }, "payload"},
		{"sealed too short", func(m *TransportMessage) { m.Payload = fill(MinSealedPayloadSize-1, 1) }, "payload"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := ok
			c.mutate(&m)
			wantInvalid(t, m.Validate(), c.member)
		})
	}
}

func TestValidateOutcome(t *testing.T) {
	base := Outcome{MessageID: sampleMessage, Class: ClassCommit, Status: StatusQueued, Revision: 1, Time: sampleTime}
	valid := []Outcome{
		base,
		with(base, func(o *Outcome) { o.Status, o.Category = StatusRejected, CategoryDuplicate }),
		with(base, func(o *Outcome) { o.Status, o.Category = StatusRejected, CategoryAuthorizationFailed }),
		with(base, func(o *Outcome) { o.Status, o.Category = StatusRejected, CategoryResourceRefused }),
		with(base, func(o *Outcome) { o.Status, o.Category = StatusDeferred, CategoryTransportDeferred }),
		with(base, func(o *Outcome) {
			o.Class, o.Status, o.Category = ClassSealed, StatusDeferred, CategoryTransportDeferred
		}),
		with(base, func(o *Outcome) { o.Class, o.Status, o.Category = ClassSealed, StatusRejected, CategoryResourceRefused }),
		with(base, func(o *Outcome) { o.Disposition = DispositionAccepted }),
		with(base, func(o *Outcome) { o.Disposition = DispositionDeferred }),
		with(base, func(o *Outcome) { o.Disposition, o.Category = DispositionStale, CategoryStaleEpoch }),
		with(base, func(o *Outcome) { o.Class, o.Disposition = ClassApplication, DispositionInvalidated }),
		with(base, func(o *Outcome) {
			o.Disposition, o.Category, o.NamedOutcome = DispositionDeferred, CategoryMissingHistory, MissingRetainedAnchor
		}),
		with(base, func(o *Outcome) {
			o.Disposition, o.Category, o.NamedOutcome = DispositionStale, CategoryStaleEpoch, BeyondAnchor
		}),
		with(base, func(o *Outcome) {
			o.Class, o.Status, o.Category, o.Reason = ClassWelcome, StatusRejected, CategoryInvalidEncoding, "no ratchet tree"
		}),
		with(base, func(o *Outcome) {
			o.Status, o.Category, o.Reason = StatusRejected, CategoryDuplicate, strings.Repeat("é", 128)
		}),
	}
	for i, o := range valid {
		if err := o.Validate(); err != nil {
			t.Errorf("valid[%d]: %v", i, err)
		}
	}
	cases := []struct {
		name   string
		mutate func(o *Outcome)
		member string
	}{
		{"no message id", func(o *Outcome) { o.MessageID = nil }, "message_id"},
		{"unknown class", func(o *Outcome) { o.Class = "blob" }, "class"},
		{"sealed queued", func(o *Outcome) { o.Class = ClassSealed }, "class"},
		{"unknown status", func(o *Outcome) { o.Status = "done" }, "status"},
		{"revision 0", func(o *Outcome) { o.Revision = 0 }, "revision"},
		{"no time", func(o *Outcome) { o.Time = time.Time{} }, "time"},
		{"unknown category", func(o *Outcome) { o.Status, o.Category = StatusRejected, "bad" }, "category"},
		{"unknown disposition", func(o *Outcome) { o.Disposition = "dropped" }, "disposition"},
		{"unknown named outcome", func(o *Outcome) { o.Disposition, o.NamedOutcome = DispositionStale, "SelfEvicted" }, "named_outcome"},
		{"rejection without category", func(o *Outcome) { o.Status = StatusRejected }, "category"},
		{"rejection with disposition", func(o *Outcome) {
			o.Status, o.Category, o.Disposition = StatusRejected, CategoryUnknownGroup, DispositionStale
		}, "disposition"},
		{"rejection with named outcome", func(o *Outcome) {
			o.Status, o.Category, o.NamedOutcome = StatusRejected, CategoryUnknownGroup, BeyondAnchor
		}, "named_outcome"},
		{"rejection transport_rejected", func(o *Outcome) { o.Status, o.Category = StatusRejected, CategoryTransportRejected }, "category"},
		{"rejection stale_epoch", func(o *Outcome) { o.Status, o.Category = StatusRejected, CategoryStaleEpoch }, "category"},
		{"deferred wrong category", func(o *Outcome) { o.Status, o.Category = StatusDeferred, CategoryMissingHistory }, "category"},
		{"queued category only", func(o *Outcome) { o.Category = CategoryDuplicate }, "category"},
		{"named outcome alone", func(o *Outcome) { o.NamedOutcome = BeyondAnchor }, "named_outcome"},
		{"BeyondAnchor deferred", func(o *Outcome) {
			o.Disposition, o.Category, o.NamedOutcome = DispositionDeferred, CategoryStaleEpoch, BeyondAnchor
		}, "disposition"},
		{"BeyondAnchor missing_history", func(o *Outcome) {
			o.Disposition, o.Category, o.NamedOutcome = DispositionStale, CategoryMissingHistory, BeyondAnchor
		}, "category"},
		{"MissingRetainedAnchor without category", func(o *Outcome) {
			o.Disposition, o.NamedOutcome = DispositionDeferred, MissingRetainedAnchor
		}, "category"},
		{"accepted with category", func(o *Outcome) { o.Disposition, o.Category = DispositionAccepted, CategoryStaleEpoch }, "category"},
		{"reason without category", func(o *Outcome) { o.Disposition, o.Reason = DispositionAccepted, "fine" }, "reason"},
		{"reason too long", func(o *Outcome) {
			o.Status, o.Category, o.Reason = StatusRejected, CategoryDuplicate, strings.Repeat("x", 257)
		}, "reason"},
		{"reason not UTF-8", func(o *Outcome) { o.Status, o.Category, o.Reason = StatusRejected, CategoryDuplicate, "\xff" }, "reason"},
		{"disposition with pre-convergence category", func(o *Outcome) {
			o.Disposition, o.Category = DispositionStale, CategoryInvalidEncoding
		}, "category"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantInvalid(t, with(base, c.mutate).Validate(), c.member)
		})
	}
}

func with(o Outcome, f func(*Outcome)) Outcome {
	f(&o)
	return o
}

func TestNamedOutcomeMapping(t *testing.T) {
	if BeyondAnchor.Disposition() != DispositionStale || BeyondAnchor.Category() != CategoryStaleEpoch {
		t.Error("BeyondAnchor is stale / stale_epoch")
	}
	if MissingRetainedAnchor.Disposition() != DispositionDeferred || MissingRetainedAnchor.Category() != CategoryMissingHistory {
		t.Error("MissingRetainedAnchor is deferred / missing_history")
	}
	if NamedOutcome("SelfEvicted").Disposition() != "" || NamedOutcome("x").Category() != "" {
		t.Error("an unknown named outcome maps to nothing")
	}
}
