package signals

import (
	"bytes"
	"context"
	"encoding/hex"
	"maps"

	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// MaxLocalMessages bounds the messages of one group whose local changes
// (a status other than published, a local deletion) one client's record
// holds: the record is one KV value, rewritten by every signal of the
// group.
const MaxLocalMessages = 4096

// Upload states of an attachment key, as its upload signals made them.
const (
	uploadUploading = "uploading"
	uploadComplete  = "complete"
	uploadFailed    = "failed"
)

// messageFacts is what the read model says of the message a message
// signal names, read before the signal's compare-and-set: whether the
// client holds the group, and the record of the message as the client
// holds it in that group (nil when it does not).
type messageFacts struct {
	group bool
	msg   *readmodel.Message
	own   bool // the client's installation sent it
}

// factsOf reads the facts of a message signal from the stream leader, as
// the read API does (issue 26: a signal is checked against the state it
// names).
func (s *Service) factsOf(ctx context.Context, client clientstore.Record, ev schema.ClientEvent) (messageFacts, error) {
	var group, id []byte
	switch {
	case ev.MessageStatusChanged != nil:
		group, id = ev.MessageStatusChanged.GroupID, ev.MessageStatusChanged.MessageID
	case ev.MessageDeleted != nil:
		group, id = ev.MessageDeleted.GroupID, ev.MessageDeleted.MessageID
	default:
		return messageFacts{}, nil
	}
	var f messageFacts
	g := hex.EncodeToString(group)
	if subject.ValidGroup(g) != nil {
		return f, nil // no group has such an id
	}
	conv, err := readmodel.LoadConversation(ctx, s.js, client.Tenant, g, client.ClientID)
	if err != nil || conv == nil {
		return f, err
	}
	f.group = true
	if subject.ValidMessageID(hex.EncodeToString(id)) != nil {
		return f, nil
	}
	rec, _, err := readmodel.HeldMessage(ctx, s.js, client.Tenant, client.ClientID, id)
	if err != nil || rec == nil || !bytes.Equal(rec.GroupID, group) {
		return f, err
	}
	f.msg, f.own = rec, bytes.Equal(rec.SenderInstallation, conv.Installation)
	return f, nil
}

// checkMessage decides a message signal against the facts and the local
// changes the group's record holds, and returns the record's next local
// changes. A group the client does not hold is 404 unknown_group; a
// message it does not hold there (for a status, one its installation did
// not send) 404 message_not_found; a status change whose previous is not
// the message's status (published, unless a signal changed it) 409
// status_conflict; a local deletion of a message that is no longer
// delivered, or was deleted locally, 409 already_deleted.
func checkMessage(ev schema.ClientEvent, f messageFacts, cur clientstore.LocalMessages) (clientstore.LocalMessages, error) {
	if !f.group {
		return nil, ErrUnknownGroup
	}
	if f.msg == nil || (ev.MessageStatusChanged != nil && !f.own) {
		return nil, ErrMessageNotFound
	}
	key := string(f.msg.ID)
	lm := cur[key]
	switch {
	case ev.MessageStatusChanged != nil:
		sc := ev.MessageStatusChanged
		if held := statusOf(lm); sc.Previous != held {
			return nil, ErrStatusConflict.With("the message's status is %s, not %s", held, sc.Previous)
		}
		lm.Status = sc.Current
		if lm.Status == schema.StatusPublished {
			lm.Status = "" // the status of a message the group holds
		}
	default:
		if lm.DeletedLocally {
			return nil, ErrAlreadyDeleted.With("the message was deleted locally")
		}
		if f.msg.State != readmodel.StateDelivered {
			return nil, ErrAlreadyDeleted.With("the message is %s", f.msg.State)
		}
		lm.DeletedLocally = true
	}
	next := maps.Clone(cur)
	if next == nil {
		next = clientstore.LocalMessages{}
	}
	if lm == (clientstore.LocalMessage{}) {
		delete(next, key)
	} else {
		next[key] = lm
	}
	if len(next) > MaxLocalMessages {
		return nil, ErrTooManyLocalMessages.With("the client holds local changes of %d messages of this group", MaxLocalMessages)
	}
	return next, nil
}

// statusOf is the status of an own message the group holds: published,
// unless a signal made it another.
func statusOf(lm clientstore.LocalMessage) schema.MessageStatus {
	if lm.Status == "" {
		return schema.StatusPublished
	}
	return lm.Status
}

// checkAttachment decides an attachment signal against the attachment
// key's state and changes next to the state after it; emit is false for
// a report of the status the attachment already has (not a change,
// EVENT-001, as for a lockout). A download that ends without having
// started is 409 no_download (the kind table: a download that emitted
// attachment.download_started ends).
func checkAttachment(ev schema.ClientEvent, next *orderState) (emit bool, err error) {
	upload := func(to string) bool {
		if next.Upload == to {
			return false
		}
		next.Upload = to
		return true
	}
	switch ev.Kind {
	case schema.KindAttachmentUploadStarted:
		return upload(uploadUploading), nil
	case schema.KindAttachmentUploadCompleted:
		return upload(uploadComplete), nil
	case schema.KindAttachmentUploadFailed:
		return upload(uploadFailed), nil
	case schema.KindAttachmentDownloadStarted:
		if next.Downloading {
			return false, nil
		}
		next.Downloading = true
	case schema.KindAttachmentDownloadCompleted, schema.KindAttachmentDownloadFailed:
		if !next.Downloading {
			return false, ErrNoDownload
		}
		next.Downloading = false
	case schema.KindAttachmentDeleted:
		// ATCH-047: the local attachment is gone; a later upload or
		// download of the key starts afresh.
		next.Upload, next.Downloading = "", false
	}
	return true, nil
}
