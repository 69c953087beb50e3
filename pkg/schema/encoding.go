package schema

import (
	"fmt"
	"time"
)

// Format is one of the two wire formats.
type Format int

// The wire formats.
const (
	// Msgpack: maps keyed by the IDL's member names, octets as bin.
	Msgpack Format = iota
	// JSON: objects keyed by the IDL's member names, octets as lowercase
	// hexadecimal strings.
	JSON
)

// String returns "msgpack" or "json".
func (f Format) String() string {
	if f == JSON {
		return "json"
	}
	return "msgpack"
}

// Marshaler is implemented by every type of the contract.
type Marshaler interface {
	AppendMsgpack(dst []byte) ([]byte, error)
	AppendJSON(dst []byte) ([]byte, error)
}

// Unmarshaler is implemented by a pointer to every type of the contract.
type Unmarshaler interface {
	UnmarshalMsgpack(data []byte) error
	UnmarshalJSON(data []byte) error
}

// Append appends v's encoding in format f to dst.
func (f Format) Append(dst []byte, v Marshaler) ([]byte, error) {
	if f == JSON {
		return v.AppendJSON(dst)
	}
	return v.AppendMsgpack(dst)
}

// Marshal returns v's encoding in format f.
func (f Format) Marshal(v Marshaler) ([]byte, error) { return f.Append(nil, v) }

// Unmarshal decodes data in format f into v.
func (f Format) Unmarshal(data []byte, v Unmarshaler) error {
	if f == JSON {
		return v.UnmarshalJSON(data)
	}
	return v.UnmarshalMsgpack(data)
}

// encoder returns a writer that appends to dst.
func encoder(dst []byte, json bool) writer {
	return writer{buf: dst, start: len(dst), json: json}
}

// finish checks that nothing but whitespace follows a decoded value.
func (r *reader) finish(err error) error {
	if err == nil {
		err = r.end()
	}
	if err != nil {
		return r.wrap("", err)
	}
	return nil
}

// --- ClientEvent ---

// eventNames are the ClientEvent members: kind, then the payload members in
// kind order, so member i (i ≥ 1) belongs to kinds[i-1].
var eventNames = func() []string {
	names := []string{"kind"}
	for _, k := range kinds {
		names = append(names, k.member)
	}
	return names
}()

func (e ClientEvent) encode(w *writer) {
	w.mapStart(2)
	w.key("kind")
	w.str(string(e.Kind))
	w.key(e.Kind.Member())
	switch e.Kind {
	case KindConversationJoined:
		e.ConversationJoined.encode(w)
	case KindConversationRemoved:
		e.ConversationRemoved.encode(w)
	case KindMembershipChanged:
		e.MembershipChanged.encode(w)
	case KindMetadataChanged:
		e.MetadataChanged.encode(w)
	case KindConversationPaused:
		e.ConversationPaused.encode(w)
	case KindMessageReceived:
		e.MessageReceived.encode(w)
	case KindMessageStatusChanged:
		e.MessageStatusChanged.encode(w)
	case KindMessageDeleted:
		e.MessageDeleted.encode(w)
	case KindMessageExpired:
		e.MessageExpired.encode(w)
	case KindConsentChanged:
		e.ConsentChanged.encode(w)
	case KindHmacKeysUpdated:
		e.HmacKeysUpdated.encode(w)
	case KindIdentityRegistered:
		e.IdentityRegistered.encode(w)
	case KindOwnInstallationAdded:
		e.OwnInstallationAdded.encode(w)
	case KindOwnInstallationRevoked:
		e.OwnInstallationRevoked.encode(w)
	case KindRejectedByServer:
		e.RejectedByServer.encode(w)
	case KindLockoutChanged:
		e.LockoutChanged.encode(w)
	case KindConversationForkDetected:
		e.ConversationForkDetected.encode(w)
	case KindNotificationsFailed:
		e.NotificationsFailed.encode(w)
	case KindArchiveRestored:
		e.ArchiveRestored.encode(w)
	case KindConnectionStateChanged:
		e.ConnectionStateChanged.encode(w)
	case KindAttachmentUploadStarted:
		e.AttachmentUploadStarted.encode(w)
	case KindAttachmentUploadCompleted:
		e.AttachmentUploadCompleted.encode(w)
	case KindAttachmentUploadFailed:
		e.AttachmentUploadFailed.encode(w)
	case KindAttachmentDownloadStarted:
		e.AttachmentDownloadStarted.encode(w)
	case KindAttachmentDownloadCompleted:
		e.AttachmentDownloadCompleted.encode(w)
	case KindAttachmentDownloadFailed:
		e.AttachmentDownloadFailed.encode(w)
	case KindAttachmentDeleted:
		e.AttachmentDeleted.encode(w)
	case KindHandleChanged:
		e.HandleChanged.encode(w)
	case KindLagged:
		e.Lagged.encode(w)
	case KindCommitSuperseded:
		e.CommitSuperseded.encode(w)
	case KindMessageInvalidated:
		e.MessageInvalidated.encode(w)
	}
	w.mapEnd()
}

func (e *ClientEvent) decode(r *reader) error {
	return r.fields(eventNames, 0b1, func(i int) error {
		if i == 0 {
			b, err := r.strBytes()
			if err != nil {
				return err
			}
			k, ok := kindIndex[EventKind(b)]
			if !ok {
				return &DecodeError{Format: r.format(), Err: ErrUnknownKind, Reason: quoteName(b)}
			}
			e.Kind = kinds[k].kind
			return nil
		}
		switch kinds[i-1].kind {
		case KindConversationJoined:
			e.ConversationJoined = new(ConversationJoined)
			return e.ConversationJoined.decode(r)
		case KindConversationRemoved:
			e.ConversationRemoved = new(ConversationRemoved)
			return e.ConversationRemoved.decode(r)
		case KindMembershipChanged:
			e.MembershipChanged = new(MembershipChanged)
			return e.MembershipChanged.decode(r)
		case KindMetadataChanged:
			e.MetadataChanged = new(MetadataChanged)
			return e.MetadataChanged.decode(r)
		case KindConversationPaused:
			e.ConversationPaused = new(ConversationPaused)
			return e.ConversationPaused.decode(r)
		case KindMessageReceived:
			e.MessageReceived = new(MessageReceived)
			return e.MessageReceived.decode(r)
		case KindMessageStatusChanged:
			e.MessageStatusChanged = new(MessageStatusChanged)
			return e.MessageStatusChanged.decode(r)
		case KindMessageDeleted:
			e.MessageDeleted = new(MessageDeleted)
			return e.MessageDeleted.decode(r)
		case KindMessageExpired:
			e.MessageExpired = new(MessageRef)
			return e.MessageExpired.decode(r)
		case KindConsentChanged:
			e.ConsentChanged = new(ConsentChanged)
			return e.ConsentChanged.decode(r)
		case KindHmacKeysUpdated:
			e.HmacKeysUpdated = new(HmacKeysUpdated)
			return e.HmacKeysUpdated.decode(r)
		case KindIdentityRegistered:
			e.IdentityRegistered = new(IdentityRegistered)
			return e.IdentityRegistered.decode(r)
		case KindOwnInstallationAdded:
			e.OwnInstallationAdded = new(InstallationRef)
			return e.OwnInstallationAdded.decode(r)
		case KindOwnInstallationRevoked:
			e.OwnInstallationRevoked = new(InstallationRevoked)
			return e.OwnInstallationRevoked.decode(r)
		case KindRejectedByServer:
			e.RejectedByServer = new(ClientRejectedByServer)
			return e.RejectedByServer.decode(r)
		case KindLockoutChanged:
			e.LockoutChanged = new(LockoutChanged)
			return e.LockoutChanged.decode(r)
		case KindConversationForkDetected:
			e.ConversationForkDetected = new(GroupRef)
			return e.ConversationForkDetected.decode(r)
		case KindNotificationsFailed:
			e.NotificationsFailed = new(NotificationsFailed)
			return e.NotificationsFailed.decode(r)
		case KindArchiveRestored:
			e.ArchiveRestored = new(ArchiveRestored)
			return e.ArchiveRestored.decode(r)
		case KindConnectionStateChanged:
			e.ConnectionStateChanged = new(ConnectionStateChanged)
			return e.ConnectionStateChanged.decode(r)
		case KindAttachmentUploadStarted:
			e.AttachmentUploadStarted = new(AttachmentRef)
			return e.AttachmentUploadStarted.decode(r)
		case KindAttachmentUploadCompleted:
			e.AttachmentUploadCompleted = new(AttachmentRef)
			return e.AttachmentUploadCompleted.decode(r)
		case KindAttachmentUploadFailed:
			e.AttachmentUploadFailed = new(AttachmentFailed)
			return e.AttachmentUploadFailed.decode(r)
		case KindAttachmentDownloadStarted:
			e.AttachmentDownloadStarted = new(AttachmentRef)
			return e.AttachmentDownloadStarted.decode(r)
		case KindAttachmentDownloadCompleted:
			e.AttachmentDownloadCompleted = new(AttachmentRef)
			return e.AttachmentDownloadCompleted.decode(r)
		case KindAttachmentDownloadFailed:
			e.AttachmentDownloadFailed = new(AttachmentFailed)
			return e.AttachmentDownloadFailed.decode(r)
		case KindAttachmentDeleted:
			e.AttachmentDeleted = new(AttachmentRef)
			return e.AttachmentDeleted.decode(r)
		case KindHandleChanged:
			e.HandleChanged = new(HandleChanged)
			return e.HandleChanged.decode(r)
		case KindLagged:
			e.Lagged = new(Lagged)
			return e.Lagged.decode(r)
		case KindCommitSuperseded:
			e.CommitSuperseded = new(CommitSuperseded)
			return e.CommitSuperseded.decode(r)
		default: // KindMessageInvalidated, the last member
			e.MessageInvalidated = new(MessageRef)
			return e.MessageInvalidated.decode(r)
		}
	})
}

// AppendMsgpack validates e and appends its msgpack encoding to dst.
func (e ClientEvent) AppendMsgpack(dst []byte) ([]byte, error) { return e.append(dst, false) }

// AppendJSON validates e and appends its JSON encoding to dst.
func (e ClientEvent) AppendJSON(dst []byte) ([]byte, error) { return e.append(dst, true) }

// MarshalMsgpack validates e and returns its msgpack encoding. It makes
// ClientEvent a msgpack.Marshaler, so frames that embed an event encode it
// the same way.
func (e ClientEvent) MarshalMsgpack() ([]byte, error) { return e.AppendMsgpack(make([]byte, 0, 384)) }

// MarshalJSON validates e and returns its JSON encoding.
func (e ClientEvent) MarshalJSON() ([]byte, error) { return e.AppendJSON(make([]byte, 0, 512)) }

// UnmarshalMsgpack decodes a msgpack ClientEvent strictly and validates it.
// On error *e is unchanged.
func (e *ClientEvent) UnmarshalMsgpack(data []byte) error { return e.unmarshal(data, false) }

// UnmarshalMsgpackView is UnmarshalMsgpack without copies: the event's
// strings and octets point into data, which must not change while they are
// in use. It accepts and refuses what UnmarshalMsgpack does, with the same
// errors (FuzzUnmarshalMsgpackView). For a reader that decodes every event
// and keeps little of it, such as the fanout gateway.
func (e *ClientEvent) UnmarshalMsgpackView(data []byte) error {
	r := reader{data: data, view: true}
	return e.read(&r)
}

// UnmarshalJSON decodes a JSON ClientEvent strictly and validates it. On
// error *e is unchanged.
func (e *ClientEvent) UnmarshalJSON(data []byte) error { return e.unmarshal(data, true) }

func (e *ClientEvent) unmarshal(data []byte, json bool) error {
	r := reader{data: data, json: json}
	return e.read(&r)
}

func (e *ClientEvent) read(r *reader) error {
	var v ClientEvent
	if err := r.finish(v.decode(r)); err != nil {
		return err
	}
	if err := v.Validate(); err != nil {
		return err
	}
	*e = v
	return nil
}

// append validates e and appends its encoding: what goes on the wire is
// valid.
func (e ClientEvent) append(dst []byte, json bool) ([]byte, error) {
	if err := e.Validate(); err != nil {
		return dst, err
	}
	w := encoder(dst, json)
	e.encode(&w)
	return w.buf, nil
}

// --- EventFilter ---

var filterNames = []string{"kinds", "group_ids", "content_types", "references_own_messages"}

func (f EventFilter) encode(w *writer) {
	n := 0
	if f.Kinds != nil {
		n++
	}
	if f.GroupIDs != nil {
		n++
	}
	if f.ContentTypes != nil {
		n++
	}
	if f.ReferencesOwnMessages {
		n++
	}
	w.mapStart(n)
	if f.Kinds != nil {
		w.key("kinds")
		w.arrayStart(len(f.Kinds))
		for _, k := range f.Kinds {
			w.str(string(k))
		}
		w.arrayEnd()
	}
	if f.GroupIDs != nil {
		w.key("group_ids")
		w.arrayStart(len(f.GroupIDs))
		for _, g := range f.GroupIDs {
			w.bin(g)
		}
		w.arrayEnd()
	}
	if f.ContentTypes != nil {
		w.key("content_types")
		w.arrayStart(len(f.ContentTypes))
		for i := range f.ContentTypes {
			f.ContentTypes[i].encode(w)
		}
		w.arrayEnd()
	}
	if f.ReferencesOwnMessages {
		w.key("references_own_messages")
		w.boolean(true)
	}
	w.mapEnd()
}

func (f *EventFilter) decode(r *reader) error {
	return r.fields(filterNames, 0, func(i int) error {
		if i == 3 {
			var err error
			f.ReferencesOwnMessages, err = r.boolean()
			return err
		}
		it, err := r.arrayOpen()
		if err != nil {
			return err
		}
		switch i {
		case 0:
			f.Kinds = make([]EventKind, 0, it.n)
		case 1:
			f.GroupIDs = make([]Bytes, 0, it.n)
		case 2:
			f.ContentTypes = make([]ContentTypeID, 0, it.n)
		}
		for n := 0; ; n++ {
			more, err := r.arrayNext(&it)
			if err != nil || !more {
				return err
			}
			switch i {
			case 0:
				b, err := r.strBytes()
				if err != nil {
					return err
				}
				k, ok := kindIndex[EventKind(b)]
				if !ok {
					return &DecodeError{Format: r.format(), Err: ErrUnknownKind, Reason: fmt.Sprintf("entry %d: %s", n, quoteName(b))}
				}
				f.Kinds = append(f.Kinds, kinds[k].kind)
			case 1:
				g, err := r.bin()
				if err != nil {
					return err
				}
				f.GroupIDs = append(f.GroupIDs, g)
			case 2:
				var c ContentTypeID
				if err := c.decode(r); err != nil {
					return r.wrap(fmt.Sprintf("[%d]", n), err)
				}
				f.ContentTypes = append(f.ContentTypes, c)
			}
		}
	})
}

// AppendMsgpack validates f and appends its msgpack encoding to dst.
func (f EventFilter) AppendMsgpack(dst []byte) ([]byte, error) { return f.append(dst, false) }

// AppendJSON validates f and appends its JSON encoding to dst.
func (f EventFilter) AppendJSON(dst []byte) ([]byte, error) { return f.append(dst, true) }

// MarshalMsgpack validates f and returns its msgpack encoding.
func (f EventFilter) MarshalMsgpack() ([]byte, error) { return f.AppendMsgpack(nil) }

// MarshalJSON validates f and returns its JSON encoding.
func (f EventFilter) MarshalJSON() ([]byte, error) { return f.AppendJSON(nil) }

// UnmarshalMsgpack decodes a msgpack EventFilter strictly and validates it.
func (f *EventFilter) UnmarshalMsgpack(data []byte) error { return f.unmarshal(data, false) }

// UnmarshalJSON decodes a JSON EventFilter strictly and validates it.
func (f *EventFilter) UnmarshalJSON(data []byte) error { return f.unmarshal(data, true) }

func (f *EventFilter) unmarshal(data []byte, json bool) error {
	r := reader{data: data, json: json}
	var v EventFilter
	if err := r.finish(v.decode(&r)); err != nil {
		return err
	}
	if err := v.Validate(); err != nil {
		return err
	}
	*f = v
	return nil
}

// append validates f and appends its encoding: what goes on the wire is
// valid.
func (f EventFilter) append(dst []byte, json bool) ([]byte, error) {
	if err := f.Validate(); err != nil {
		return dst, err
	}
	w := encoder(dst, json)
	f.encode(&w)
	return w.buf, nil
}

// --- TransportMessage ---

var transportNames = []string{"v", "group", "kind", "payload"}

func (m TransportMessage) encode(w *writer) {
	w.mapStart(4)
	w.key("v")
	w.uint(uint64(m.V))
	w.key("group")
	w.bin(m.Group)
	w.key("kind")
	w.str(string(m.Kind))
	w.key("payload")
	w.bin(m.Payload)
	w.mapEnd()
}

func (m *TransportMessage) decode(r *reader) error {
	return r.fields(transportNames, 0b1111, func(i int) (err error) {
		switch i {
		case 0:
			var u uint64
			u, err = r.uint(1 << 16)
			m.V = int(u)
		case 1:
			m.Group, err = r.bin()
		case 2:
			var s string
			s, err = r.str()
			m.Kind = TransportKind(s)
		case 3:
			m.Payload, err = r.bin()
		}
		return err
	})
}

// AppendMsgpack validates m and appends its msgpack encoding to dst.
func (m TransportMessage) AppendMsgpack(dst []byte) ([]byte, error) { return m.append(dst, false) }

// AppendJSON validates m and appends its JSON encoding to dst.
func (m TransportMessage) AppendJSON(dst []byte) ([]byte, error) { return m.append(dst, true) }

// MarshalMsgpack validates m and returns its msgpack encoding.
func (m TransportMessage) MarshalMsgpack() ([]byte, error) { return m.AppendMsgpack(nil) }

// MarshalJSON validates m and returns its JSON encoding.
func (m TransportMessage) MarshalJSON() ([]byte, error) { return m.AppendJSON(nil) }

// UnmarshalMsgpack decodes a msgpack TransportMessage strictly and
// validates it.
func (m *TransportMessage) UnmarshalMsgpack(data []byte) error { return m.unmarshal(data, false) }

// UnmarshalJSON decodes a JSON TransportMessage strictly and validates it.
func (m *TransportMessage) UnmarshalJSON(data []byte) error { return m.unmarshal(data, true) }

func (m *TransportMessage) unmarshal(data []byte, json bool) error {
	r := reader{data: data, json: json}
	var v TransportMessage
	if err := r.finish(v.decode(&r)); err != nil {
		return err
	}
	if err := v.Validate(); err != nil {
		return err
	}
	*m = v
	return nil
}

// append validates m and appends its encoding: what goes on the wire is
// valid.
func (m TransportMessage) append(dst []byte, json bool) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return dst, err
	}
	w := encoder(dst, json)
	m.encode(&w)
	return w.buf, nil
}

// --- Outcome ---

var outcomeNames = []string{"message_id", "class", "status", "category", "disposition", "named_outcome", "revision", "time", "reason"}

// outcomeTime is the one form of Outcome.Time on the wire.
const outcomeTime = time.RFC3339Nano

func (o Outcome) encode(w *writer) {
	n := 5
	for _, s := range []string{string(o.Category), o.Reason, string(o.Disposition), string(o.NamedOutcome)} {
		if s != "" {
			n++
		}
	}
	w.mapStart(n)
	w.key("message_id")
	w.bin(o.MessageID)
	w.key("class")
	w.str(string(o.Class))
	w.key("status")
	w.str(string(o.Status))
	if o.Category != "" {
		w.key("category")
		w.str(string(o.Category))
	}
	if o.Reason != "" {
		w.key("reason")
		w.str(o.Reason)
	}
	if o.Disposition != "" {
		w.key("disposition")
		w.str(string(o.Disposition))
	}
	if o.NamedOutcome != "" {
		w.key("named_outcome")
		w.str(string(o.NamedOutcome))
	}
	w.key("revision")
	w.uint(o.Revision)
	w.key("time")
	w.str(o.Time.UTC().Format(outcomeTime))
	w.mapEnd()
}

func (o *Outcome) decode(r *reader) error {
	return r.fields(outcomeNames, 0b11000111, func(i int) (err error) {
		switch i {
		case 0:
			o.MessageID, err = r.bin()
			return err
		case 6:
			o.Revision, err = r.uint(1<<64 - 1)
			return err
		}
		s, err := r.str()
		if err != nil {
			return err
		}
		switch i {
		case 1:
			o.Class = InputClass(s)
		case 2:
			o.Status = OutcomeStatus(s)
		case 3:
			o.Category = Category(s)
		case 4:
			o.Disposition = Disposition(s)
		case 5:
			o.NamedOutcome = NamedOutcome(s)
		case 8:
			o.Reason = s
		case 7:
			t, err := time.Parse(outcomeTime, s)
			if err != nil || t.Format(outcomeTime) != s || t.Location() != time.UTC {
				return &readErr{"want an RFC 3339 time in UTC (Z) without trailing zeros"}
			}
			o.Time = t
		}
		// An empty optional member would not round-trip: absent is omitted.
		if s == "" && (i >= 3 && i <= 5 || i == 8) {
			return &readErr{"empty: omit an absent member"}
		}
		return nil
	})
}

// AppendMsgpack validates o and appends its msgpack encoding to dst.
func (o Outcome) AppendMsgpack(dst []byte) ([]byte, error) { return o.append(dst, false) }

// AppendJSON validates o and appends its JSON encoding to dst.
func (o Outcome) AppendJSON(dst []byte) ([]byte, error) { return o.append(dst, true) }

// MarshalMsgpack validates o and returns its msgpack encoding.
func (o Outcome) MarshalMsgpack() ([]byte, error) { return o.AppendMsgpack(nil) }

// MarshalJSON validates o and returns its JSON encoding.
func (o Outcome) MarshalJSON() ([]byte, error) { return o.AppendJSON(nil) }

// UnmarshalMsgpack decodes a msgpack Outcome strictly and validates it.
func (o *Outcome) UnmarshalMsgpack(data []byte) error { return o.unmarshal(data, false) }

// UnmarshalJSON decodes a JSON Outcome strictly and validates it.
func (o *Outcome) UnmarshalJSON(data []byte) error { return o.unmarshal(data, true) }

func (o *Outcome) unmarshal(data []byte, json bool) error {
	r := reader{data: data, json: json}
	var v Outcome
	if err := r.finish(v.decode(&r)); err != nil {
		return err
	}
	if err := v.Validate(); err != nil {
		return err
	}
	*o = v
	return nil
}

// append validates o and appends its encoding: what goes on the wire is
// valid.
func (o Outcome) append(dst []byte, json bool) ([]byte, error) {
	if err := o.Validate(); err != nil {
		return dst, err
	}
	w := encoder(dst, json)
	o.encode(&w)
	return w.buf, nil
}
