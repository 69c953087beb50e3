package schema

// EventFilter is what a subscription selects (spec section 3). The gateway
// applies it before an event enters the subscription's queue (EVENT-020).
type EventFilter struct {
	// Kinds are the kinds the subscription selects. nil means absent and
	// selects every kind (AllKinds), as SSE without a kinds parameter, the
	// console and `fabric tail` do (issue 28); a non-nil empty list is
	// present and selects no kind (EVENT-020). lagged is handed off whether
	// or not Kinds names it (EVENT-022).
	Kinds []EventKind `msgpack:"kinds,omitzero" json:"kinds,omitzero"`

	// GroupIDs narrows events that name a group (see ClientEvent.GroupID)
	// to these groups, or to another group of the same stitched DM. nil
	// means absent and selects every group; a non-nil empty list is present
	// and selects no group. An event that names no group is never narrowed.
	GroupIDs []Bytes `msgpack:"group_ids,omitempty" json:"group_ids,omitempty"`

	// ContentTypes narrows message.received only: when present (non-nil),
	// the event passes only if its content type is present and matches an
	// entry under CTYPE-001 (ContentTypeID.Matches). nil means absent and
	// selects every content type.
	ContentTypes []ContentTypeID `msgpack:"content_types,omitempty" json:"content_types,omitempty"`

	// ReferencesOwnMessages narrows message.received only: when true, the
	// event passes only for a reply or reaction naming a message of the own
	// inbox that the client holds at emission (EVENT-021). Absent is false.
	ReferencesOwnMessages bool `msgpack:"references_own_messages,omitempty" json:"references_own_messages,omitempty"`
}

// HasKind reports whether f's Kinds selects k: names it, or is absent and
// k is a known kind. It does not apply EVENT-022: lagged is always
// selected whatever HasKind says.
func (f EventFilter) HasKind(k EventKind) bool {
	if f.Kinds == nil {
		return k.Valid()
	}
	for _, x := range f.Kinds {
		if x == k {
			return true
		}
	}
	return false
}
