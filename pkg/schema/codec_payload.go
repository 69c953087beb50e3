package schema

// One encode and one decode method per payload dictionary. The encode
// methods write members in IDL order; the decode methods accept any order.
// Both formats share them through writer and reader.

func (w *writer) optStr(k string, s *string) {
	if s != nil {
		w.key(k)
		w.str(*s)
	}
}

func (w *writer) strs(list []string) {
	w.arrayStart(len(list))
	for _, s := range list {
		w.str(s)
	}
	w.arrayEnd()
}

func (r *reader) strs() ([]string, error) {
	it, err := r.arrayOpen()
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, it.n)
	for {
		more, err := r.arrayNext(&it)
		if err != nil {
			return nil, err
		}
		if !more {
			return out, nil
		}
		s, err := r.str()
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
}

func (r *reader) optStr() (*string, error) {
	s, err := r.str()
	if err != nil {
		return nil, err
	}
	return &s, nil
}

var groupRefNames = []string{"group_id"}

func (p *GroupRef) encode(w *writer) {
	w.mapStart(1)
	w.key("group_id")
	w.bin(p.GroupID)
	w.mapEnd()
}

func (p *GroupRef) decode(r *reader) (err error) {
	return r.fields(groupRefNames, 1, func(int) error {
		p.GroupID, err = r.bin()
		return err
	})
}

var messageRefNames = []string{"group_id", "message_id"}

func (p *MessageRef) encode(w *writer) {
	w.mapStart(2)
	w.key("group_id")
	w.bin(p.GroupID)
	w.key("message_id")
	w.bin(p.MessageID)
	w.mapEnd()
}

func (p *MessageRef) decode(r *reader) (err error) {
	return r.fields(messageRefNames, 0b11, func(i int) error {
		if i == 0 {
			p.GroupID, err = r.bin()
		} else {
			p.MessageID, err = r.bin()
		}
		return err
	})
}

var conversationJoinedNames = []string{"group_id", "conversation_type", "origin", "adder_inbox_id"}

func (p *ConversationJoined) encode(w *writer) {
	n := 3
	if p.AdderInboxID != nil {
		n++
	}
	w.mapStart(n)
	w.key("group_id")
	w.bin(p.GroupID)
	w.key("conversation_type")
	w.str(string(p.ConversationType))
	w.key("origin")
	w.str(string(p.Origin))
	w.optStr("adder_inbox_id", p.AdderInboxID)
	w.mapEnd()
}

func (p *ConversationJoined) decode(r *reader) error {
	return r.fields(conversationJoinedNames, 0b111, func(i int) (err error) {
		var s string
		switch i {
		case 0:
			p.GroupID, err = r.bin()
		case 1:
			s, err = r.str()
			p.ConversationType = ConversationType(s)
		case 2:
			s, err = r.str()
			p.Origin = JoinOrigin(s)
		case 3:
			p.AdderInboxID, err = r.optStr()
		}
		return err
	})
}

var conversationRemovedNames = []string{"group_id", "cause"}

func (p *ConversationRemoved) encode(w *writer) {
	w.mapStart(2)
	w.key("group_id")
	w.bin(p.GroupID)
	w.key("cause")
	w.str(string(p.Cause))
	w.mapEnd()
}

func (p *ConversationRemoved) decode(r *reader) error {
	return r.fields(conversationRemovedNames, 0b11, func(i int) (err error) {
		if i == 0 {
			p.GroupID, err = r.bin()
			return err
		}
		s, err := r.str()
		p.Cause = RemovalCause(s)
		return err
	})
}

var membershipChangedNames = []string{"group_id", "added_inbox_ids", "removed_inbox_ids"}

func (p *MembershipChanged) encode(w *writer) {
	w.mapStart(3)
	w.key("group_id")
	w.bin(p.GroupID)
	w.key("added_inbox_ids")
	w.strs(p.AddedInboxIDs)
	w.key("removed_inbox_ids")
	w.strs(p.RemovedInboxIDs)
	w.mapEnd()
}

func (p *MembershipChanged) decode(r *reader) error {
	return r.fields(membershipChangedNames, 0b111, func(i int) (err error) {
		switch i {
		case 0:
			p.GroupID, err = r.bin()
		case 1:
			p.AddedInboxIDs, err = r.strs()
		case 2:
			p.RemovedInboxIDs, err = r.strs()
		}
		return err
	})
}

var metadataChangedNames = []string{"group_id", "changed"}

func (p *MetadataChanged) encode(w *writer) {
	w.mapStart(2)
	w.key("group_id")
	w.bin(p.GroupID)
	w.key("changed")
	w.strs(p.Changed)
	w.mapEnd()
}

func (p *MetadataChanged) decode(r *reader) error {
	return r.fields(metadataChangedNames, 0b11, func(i int) (err error) {
		if i == 0 {
			p.GroupID, err = r.bin()
		} else {
			p.Changed, err = r.strs()
		}
		return err
	})
}

var conversationPausedNames = []string{"group_id", "floor"}

func (p *ConversationPaused) encode(w *writer) {
	w.mapStart(2)
	w.key("group_id")
	w.bin(p.GroupID)
	w.key("floor")
	w.str(p.Floor)
	w.mapEnd()
}

func (p *ConversationPaused) decode(r *reader) error {
	return r.fields(conversationPausedNames, 0b11, func(i int) (err error) {
		if i == 0 {
			p.GroupID, err = r.bin()
		} else {
			p.Floor, err = r.str()
		}
		return err
	})
}

var messageReceivedNames = []string{"group_id", "message_id", "content_type", "sender_inbox_id"}

func (p *MessageReceived) encode(w *writer) {
	n := 3
	if p.ContentType != nil {
		n++
	}
	w.mapStart(n)
	w.key("group_id")
	w.bin(p.GroupID)
	w.key("message_id")
	w.bin(p.MessageID)
	if p.ContentType != nil {
		w.key("content_type")
		p.ContentType.encode(w)
	}
	w.key("sender_inbox_id")
	w.str(p.SenderInboxID)
	w.mapEnd()
}

func (p *MessageReceived) decode(r *reader) error {
	return r.fields(messageReceivedNames, 0b1011, func(i int) (err error) {
		switch i {
		case 0:
			p.GroupID, err = r.bin()
		case 1:
			p.MessageID, err = r.bin()
		case 2:
			p.ContentType = new(ContentTypeID)
			err = p.ContentType.decode(r)
		case 3:
			p.SenderInboxID, err = r.str()
		}
		return err
	})
}

var contentTypeNames = []string{"authority_id", "type_id", "version_major"}

func (c *ContentTypeID) encode(w *writer) {
	w.mapStart(3)
	w.key("authority_id")
	w.str(c.AuthorityID)
	w.key("type_id")
	w.str(c.TypeID)
	w.key("version_major")
	w.uint(uint64(c.VersionMajor))
	w.mapEnd()
}

func (c *ContentTypeID) decode(r *reader) error {
	return r.fields(contentTypeNames, 0b111, func(i int) (err error) {
		switch i {
		case 0:
			c.AuthorityID, err = r.str()
		case 1:
			c.TypeID, err = r.str()
		case 2:
			var u uint64
			u, err = r.uint(1<<32 - 1)
			c.VersionMajor = uint32(u)
		}
		return err
	})
}

var messageStatusChangedNames = []string{"group_id", "message_id", "previous", "current"}

func (p *MessageStatusChanged) encode(w *writer) {
	w.mapStart(4)
	w.key("group_id")
	w.bin(p.GroupID)
	w.key("message_id")
	w.bin(p.MessageID)
	w.key("previous")
	w.str(string(p.Previous))
	w.key("current")
	w.str(string(p.Current))
	w.mapEnd()
}

func (p *MessageStatusChanged) decode(r *reader) error {
	return r.fields(messageStatusChangedNames, 0b1111, func(i int) (err error) {
		var s string
		switch i {
		case 0:
			p.GroupID, err = r.bin()
		case 1:
			p.MessageID, err = r.bin()
		case 2:
			s, err = r.str()
			p.Previous = MessageStatus(s)
		case 3:
			s, err = r.str()
			p.Current = MessageStatus(s)
		}
		return err
	})
}

var messageDeletedNames = []string{"group_id", "message_id", "cause"}

func (p *MessageDeleted) encode(w *writer) {
	w.mapStart(3)
	w.key("group_id")
	w.bin(p.GroupID)
	w.key("message_id")
	w.bin(p.MessageID)
	w.key("cause")
	w.str(string(p.Cause))
	w.mapEnd()
}

func (p *MessageDeleted) decode(r *reader) error {
	return r.fields(messageDeletedNames, 0b111, func(i int) (err error) {
		var s string
		switch i {
		case 0:
			p.GroupID, err = r.bin()
		case 1:
			p.MessageID, err = r.bin()
		case 2:
			s, err = r.str()
			p.Cause = DeletionCause(s)
		}
		return err
	})
}

var consentChangedNames = []string{"entity_kind", "entity", "state"}

func (p *ConsentChanged) encode(w *writer) {
	w.mapStart(3)
	w.key("entity_kind")
	w.str(string(p.EntityKind))
	w.key("entity")
	w.str(p.Entity)
	w.key("state")
	w.str(string(p.State))
	w.mapEnd()
}

func (p *ConsentChanged) decode(r *reader) error {
	return r.fields(consentChangedNames, 0b111, func(i int) (err error) {
		var s string
		switch i {
		case 0:
			s, err = r.str()
			p.EntityKind = ConsentEntityKind(s)
		case 1:
			p.Entity, err = r.str()
		case 2:
			s, err = r.str()
			p.State = ConsentState(s)
		}
		return err
	})
}

func (p *HmacKeysUpdated) encode(w *writer) {
	w.mapStart(0)
	w.mapEnd()
}

func (p *HmacKeysUpdated) decode(r *reader) error {
	return r.fields(nil, 0, func(int) error { return nil })
}

var identityRegisteredNames = []string{"inbox_id", "installation_key"}

func (p *IdentityRegistered) encode(w *writer) {
	w.mapStart(2)
	w.key("inbox_id")
	w.str(p.InboxID)
	w.key("installation_key")
	w.bin(p.InstallationKey)
	w.mapEnd()
}

func (p *IdentityRegistered) decode(r *reader) error {
	return r.fields(identityRegisteredNames, 0b11, func(i int) (err error) {
		if i == 0 {
			p.InboxID, err = r.str()
		} else {
			p.InstallationKey, err = r.bin()
		}
		return err
	})
}

var installationRefNames = []string{"installation_key"}

func (p *InstallationRef) encode(w *writer) {
	w.mapStart(1)
	w.key("installation_key")
	w.bin(p.InstallationKey)
	w.mapEnd()
}

func (p *InstallationRef) decode(r *reader) (err error) {
	return r.fields(installationRefNames, 1, func(int) error {
		p.InstallationKey, err = r.bin()
		return err
	})
}

var installationRevokedNames = []string{"installation_key", "is_this_installation"}

func (p *InstallationRevoked) encode(w *writer) {
	w.mapStart(2)
	w.key("installation_key")
	w.bin(p.InstallationKey)
	w.key("is_this_installation")
	w.boolean(p.IsThisInstallation)
	w.mapEnd()
}

func (p *InstallationRevoked) decode(r *reader) error {
	return r.fields(installationRevokedNames, 0b11, func(i int) (err error) {
		if i == 0 {
			p.InstallationKey, err = r.bin()
		} else {
			p.IsThisInstallation, err = r.boolean()
		}
		return err
	})
}

var rejectedNames = []string{"cause", "min_libxmtp_version"}

func (p *ClientRejectedByServer) encode(w *writer) {
	n := 1
	if p.MinLibxmtpVersion != nil {
		n++
	}
	w.mapStart(n)
	w.key("cause")
	w.str(string(p.Cause))
	w.optStr("min_libxmtp_version", p.MinLibxmtpVersion)
	w.mapEnd()
}

func (p *ClientRejectedByServer) decode(r *reader) error {
	return r.fields(rejectedNames, 0b1, func(i int) (err error) {
		if i == 0 {
			var s string
			s, err = r.str()
			p.Cause = RejectionCause(s)
		} else {
			p.MinLibxmtpVersion, err = r.optStr()
		}
		return err
	})
}

var lockoutChangedNames = []string{"change"}

func (p *LockoutChanged) encode(w *writer) {
	w.mapStart(1)
	w.key("change")
	w.str(string(p.Change))
	w.mapEnd()
}

func (p *LockoutChanged) decode(r *reader) error {
	return r.fields(lockoutChangedNames, 1, func(int) error {
		s, err := r.str()
		p.Change = LockoutChange(s)
		return err
	})
}

var notificationsFailedNames = []string{"cause"}

func (p *NotificationsFailed) encode(w *writer) {
	w.mapStart(1)
	w.key("cause")
	w.str(p.Cause)
	w.mapEnd()
}

func (p *NotificationsFailed) decode(r *reader) (err error) {
	return r.fields(notificationsFailedNames, 1, func(int) error {
		p.Cause, err = r.str()
		return err
	})
}

var archiveRestoredNames = []string{"complete"}

func (p *ArchiveRestored) encode(w *writer) {
	w.mapStart(1)
	w.key("complete")
	w.boolean(p.Complete)
	w.mapEnd()
}

func (p *ArchiveRestored) decode(r *reader) (err error) {
	return r.fields(archiveRestoredNames, 1, func(int) error {
		p.Complete, err = r.boolean()
		return err
	})
}

var connectionStateChangedNames = []string{"previous", "current"}

func (p *ConnectionStateChanged) encode(w *writer) {
	w.mapStart(2)
	w.key("previous")
	w.str(string(p.Previous))
	w.key("current")
	w.str(string(p.Current))
	w.mapEnd()
}

func (p *ConnectionStateChanged) decode(r *reader) error {
	return r.fields(connectionStateChangedNames, 0b11, func(i int) error {
		s, err := r.str()
		if i == 0 {
			p.Previous = ConnectionState(s)
		} else {
			p.Current = ConnectionState(s)
		}
		return err
	})
}

var attachmentRefNames = []string{"attachment_key", "url", "content_digest"}

func (p *AttachmentRef) encode(w *writer) {
	w.mapStart(3)
	w.key("attachment_key")
	w.str(p.AttachmentKey)
	w.key("url")
	w.str(p.URL)
	w.key("content_digest")
	w.str(p.ContentDigest)
	w.mapEnd()
}

func (p *AttachmentRef) decode(r *reader) error {
	return r.fields(attachmentRefNames, 0b111, func(i int) (err error) {
		switch i {
		case 0:
			p.AttachmentKey, err = r.str()
		case 1:
			p.URL, err = r.str()
		case 2:
			p.ContentDigest, err = r.str()
		}
		return err
	})
}

var attachmentFailedNames = []string{"attachment_key", "url", "content_digest", "cause"}

func (p *AttachmentFailed) encode(w *writer) {
	w.mapStart(4)
	w.key("attachment_key")
	w.str(p.AttachmentKey)
	w.key("url")
	w.str(p.URL)
	w.key("content_digest")
	w.str(p.ContentDigest)
	w.key("cause")
	w.str(p.Cause)
	w.mapEnd()
}

func (p *AttachmentFailed) decode(r *reader) error {
	return r.fields(attachmentFailedNames, 0b1111, func(i int) (err error) {
		switch i {
		case 0:
			p.AttachmentKey, err = r.str()
		case 1:
			p.URL, err = r.str()
		case 2:
			p.ContentDigest, err = r.str()
		case 3:
			p.Cause, err = r.str()
		}
		return err
	})
}

var handleChangedNames = []string{"inbox_id", "handle"}

func (p *HandleChanged) encode(w *writer) {
	w.mapStart(2)
	w.key("inbox_id")
	w.str(p.InboxID)
	w.key("handle")
	w.str(p.Handle)
	w.mapEnd()
}

func (p *HandleChanged) decode(r *reader) error {
	return r.fields(handleChangedNames, 0b11, func(i int) (err error) {
		if i == 0 {
			p.InboxID, err = r.str()
		} else {
			p.Handle, err = r.str()
		}
		return err
	})
}

var laggedNames = []string{"discarded"}

func (p *Lagged) encode(w *writer) {
	w.mapStart(1)
	w.key("discarded")
	w.uint(p.Discarded)
	w.mapEnd()
}

func (p *Lagged) decode(r *reader) (err error) {
	return r.fields(laggedNames, 1, func(int) error {
		p.Discarded, err = r.uint(1<<64 - 1)
		return err
	})
}

var commitSupersededNames = []string{"group_id", "commit_digest", "withdrawn_event_ids"}

func (p *CommitSuperseded) encode(w *writer) {
	w.mapStart(3)
	w.key("group_id")
	w.bin(p.GroupID)
	w.key("commit_digest")
	w.bin(p.CommitDigest)
	w.key("withdrawn_event_ids")
	w.strs(p.WithdrawnEventIDs)
	w.mapEnd()
}

// decode reads withdrawn_event_ids as optional: payloads of versions
// before it have none.
func (p *CommitSuperseded) decode(r *reader) error {
	return r.fields(commitSupersededNames, 0b11, func(i int) (err error) {
		switch i {
		case 0:
			p.GroupID, err = r.bin()
		case 1:
			p.CommitDigest, err = r.bin()
		default:
			p.WithdrawnEventIDs, err = r.strs()
			// Absent (older versions) and empty are one value, so a
			// decoded event re-encodes and decodes to itself.
			if len(p.WithdrawnEventIDs) == 0 {
				p.WithdrawnEventIDs = nil
			}
		}
		return err
	})
}
