package schema

import "time"

// Disposition is a convergence disposition (Marmot foundation/errors.md,
// adopted): what happened to an input admitted to convergence. It is live
// and can change later (deferred → accepted, accepted → invalidated).
type Disposition string

// Disposition values.
const (
	// DispositionAccepted: part of, or consumed by, the selected branch.
	DispositionAccepted Disposition = "accepted"
	// DispositionDeferred: not yet classifiable; reconsidered when missing
	// state arrives or convergence advances.
	DispositionDeferred Disposition = "deferred"
	// DispositionStale: can no longer affect the group.
	DispositionStale Disposition = "stale"
	// DispositionInvalidated: an application message that decrypts only on
	// a losing branch; its app payload is withdrawn.
	DispositionInvalidated Disposition = "invalidated"
)

// Valid reports whether d is a known value.
func (d Disposition) Valid() bool {
	switch d {
	case DispositionAccepted, DispositionDeferred, DispositionStale, DispositionInvalidated:
		return true
	}
	return false
}

// Category says why an input did not produce application content (Marmot
// foundation/errors.md, adopted, plus transport_deferred and
// resource_refused from the inbound-processing spec).
type Category string

// Category values.
const (
	CategoryDuplicate                  Category = "duplicate"
	CategoryOwnEcho                    Category = "own_echo"
	CategoryWrongRecipient             Category = "wrong_recipient"
	CategoryUnknownGroup               Category = "unknown_group"
	CategoryStaleEpoch                 Category = "stale_epoch"
	CategoryInvalidEncoding            Category = "invalid_encoding"
	CategoryInvalidSignature           Category = "invalid_signature"
	CategoryUnsupportedRequiredFeature Category = "unsupported_required_feature"
	CategoryAuthorizationFailed        Category = "authorization_failed"
	CategoryMissingHistory             Category = "missing_history"
	// CategoryTransportRejected is outbound only: a publication failed at
	// the transport layer. No inbound outcome carries it.
	CategoryTransportRejected Category = "transport_rejected"
	// CategoryTransportDeferred: a transport object that no key of the
	// group's current key set opens; retained and retried when it changes.
	CategoryTransportDeferred Category = "transport_deferred"
	// CategoryResourceRefused: refused by a local resource bound; never
	// recorded as a terminal duplicate.
	CategoryResourceRefused Category = "resource_refused"
)

// Valid reports whether c is a known value.
func (c Category) Valid() bool {
	switch c {
	case CategoryDuplicate, CategoryOwnEcho, CategoryWrongRecipient, CategoryUnknownGroup,
		CategoryStaleEpoch, CategoryInvalidEncoding, CategoryInvalidSignature,
		CategoryUnsupportedRequiredFeature, CategoryAuthorizationFailed, CategoryMissingHistory,
		CategoryTransportRejected, CategoryTransportDeferred, CategoryResourceRefused:
		return true
	}
	return false
}

// NamedOutcome is a named convergence outcome; each maps to one disposition
// and one category.
type NamedOutcome string

// NamedOutcome values.
const (
	// BeyondAnchor: the source epoch is older than the retained anchor; the
	// input will never be processed. stale / stale_epoch.
	BeyondAnchor NamedOutcome = "BeyondAnchor"
	// MissingRetainedAnchor: retained state inside the rollback horizon is
	// gone; the group becomes Unrecoverable and the input stays deferred.
	// deferred / missing_history.
	MissingRetainedAnchor NamedOutcome = "MissingRetainedAnchor"
)

// Valid reports whether n is a known value.
func (n NamedOutcome) Valid() bool { return n == BeyondAnchor || n == MissingRetainedAnchor }

// Disposition returns the disposition n maps to, or "" if n is unknown.
func (n NamedOutcome) Disposition() Disposition {
	switch n {
	case BeyondAnchor:
		return DispositionStale
	case MissingRetainedAnchor:
		return DispositionDeferred
	}
	return ""
}

// Category returns the category n maps to, or "" if n is unknown.
func (n NamedOutcome) Category() Category {
	switch n {
	case BeyondAnchor:
		return CategoryStaleEpoch
	case MissingRetainedAnchor:
		return CategoryMissingHistory
	}
	return ""
}

// InputClass is what ingest classified an input as.
type InputClass string

// InputClass values.
const (
	ClassWelcome     InputClass = "welcome"
	ClassCommit      InputClass = "commit"
	ClassProposal    InputClass = "proposal"
	ClassApplication InputClass = "application"
	ClassGroupInfo   InputClass = "group_info"
	ClassKeyPackage  InputClass = "key_package"
	// ClassMalformed: the bytes did not parse as an MLSMessage.
	ClassMalformed InputClass = "malformed"
	// ClassUnsupported: an MLSMessage of a wire format or type the fabric
	// does not process.
	ClassUnsupported InputClass = "unsupported"
	// ClassSealed: a sealed transport object not yet opened, so not yet an
	// MLSMessage. Its record is kept under the transport id; once opened
	// the input has the class of its MLS bytes.
	ClassSealed InputClass = "sealed"
)

// Valid reports whether c is a known value.
func (c InputClass) Valid() bool {
	switch c {
	case ClassWelcome, ClassCommit, ClassProposal, ClassApplication, ClassGroupInfo,
		ClassKeyPackage, ClassMalformed, ClassUnsupported, ClassSealed:
		return true
	}
	return false
}

// OutcomeStatus is the coarse state of an input, and the intake answer of
// POST /v1/tenants/{tenant}/transport (DESIGN section 10).
type OutcomeStatus string

// OutcomeStatus values.
const (
	// StatusQueued: admitted onto the group's input subject. The record has
	// no category until convergence gives it a disposition.
	StatusQueued OutcomeStatus = "queued"
	// StatusRejected: refused with a category and no disposition, before
	// convergence or terminally during it (invalid_signature,
	// authorization_failed once the parent is identified).
	StatusRejected OutcomeStatus = "rejected"
	// StatusDeferred: held before convergence (transport_deferred) and
	// retried when the group's key set changes.
	StatusDeferred OutcomeStatus = "deferred"
)

// Valid reports whether s is a known value.
func (s OutcomeStatus) Valid() bool {
	return s == StatusQueued || s == StatusRejected || s == StatusDeferred
}

// MaxOutcomeReason bounds Outcome.Reason, in bytes.
const MaxOutcomeReason = 256

// Outcome is the durable record of one input's current protocol outcome.
// Each change is a new record with a higher Revision; the newest record is
// the current outcome. See Validate for the consistency rules.
type Outcome struct {
	// MessageID is the input's message id: SHA-256 of the peeled MLS bytes.
	MessageID Bytes `msgpack:"message_id" json:"message_id"`
	// Class is what ingest classified the input as.
	Class InputClass `msgpack:"class" json:"class"`
	// Status is queued, rejected or deferred.
	Status OutcomeStatus `msgpack:"status" json:"status"`
	// Category says why, where one applies; "" is absent.
	Category Category `msgpack:"category,omitempty" json:"category,omitempty"`
	// Disposition is the convergence disposition once convergence gave one;
	// "" is absent.
	Disposition Disposition `msgpack:"disposition,omitempty" json:"disposition,omitempty"`
	// NamedOutcome is set where a named outcome applies; "" is absent.
	NamedOutcome NamedOutcome `msgpack:"named_outcome,omitempty" json:"named_outcome,omitempty"`
	// Reason says in a short sentence why, where the fabric knows more
	// than the category (a Welcome no hosted client could join: "the
	// GroupInfo has no ratchet_tree extension"); "" is absent. Only beside
	// a category, at most MaxOutcomeReason bytes of UTF-8; it names no id,
	// key or payload.
	Reason string `msgpack:"reason,omitempty" json:"reason,omitempty"`
	// Revision counts the records of this input: 1 for the first, one more
	// for each change.
	Revision uint64 `msgpack:"revision" json:"revision"`
	// Time is when this record was made. It is encoded as an RFC 3339
	// string in UTC with nanoseconds.
	Time time.Time `msgpack:"time" json:"time"`
}
