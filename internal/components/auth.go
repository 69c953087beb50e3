package components

import (
	"bytes"
	"errors"
	"slices"
)

// OpType is the kind of one proposal of a commit, as authorization sees it.
type OpType uint8

// Proposal kinds (RFC 9420 §12.1). OpOtherExtensions is a
// GroupContextExtensions proposal that changes extensions other than the
// components extension (required_capabilities, external_senders, …).
const (
	OpAdd OpType = iota + 1
	OpUpdate
	OpRemove
	OpComponents
	OpOtherExtensions
	OpPSK
	OpReInit
	OpExternalInit
)

// Op is one proposal of a commit.
type Op struct {
	Type     OpType
	Proposer AccountID // the proposal's sender; the committer for inline proposals
	Target   AccountID // OpRemove: the account of the removed leaf
	// SelfTarget is set for an OpRemove whose proposer removes its own leaf:
	// a leave request committed by another member (DESIGN §2).
	SelfTarget bool
}

// ErrUnauthorized is returned when a committer may not make a change.
var ErrUnauthorized = errors.New("components: committer not authorized for this change")

// Role is what a member may do under a set's admin lists.
type Role uint8

// Roles, weakest first.
const (
	RoleMember Role = iota
	RoleAdmin
	RoleSuperAdmin
)

// IsAdmin reports whether inboxID (lowercase hex account id) is an admin or a
// super admin in s.
func IsAdmin(s Set, inboxID string) bool {
	a, err := ParseInboxID(inboxID)
	return err == nil && RoleOf(s, a) >= RoleAdmin
}

// IsSuperAdmin reports whether inboxID is a super admin in s.
func IsSuperAdmin(s Set, inboxID string) bool {
	a, err := ParseInboxID(inboxID)
	return err == nil && RoleOf(s, a) == RoleSuperAdmin
}

// RoleOf returns a's role in s. A set with neither an admin policy nor a
// super admin list belongs to a group that has no admins at all (for example
// one made by a plain RFC 9420 client): everyone in it holds every role.
func RoleOf(s Set, a AccountID) Role {
	if s.Admins == nil && len(s.SuperAdmins) == 0 {
		return RoleSuperAdmin
	}
	if containsAccount(s.SuperAdmins, a) {
		return RoleSuperAdmin
	}
	if containsAccount(s.Admins, a) {
		return RoleAdmin
	}
	return RoleMember
}

func containsAccount(list []AccountID, a AccountID) bool {
	return slices.ContainsFunc(list, func(b AccountID) bool { return b == a })
}

// defaultPolicy applies when the parent has no permission policy component.
var defaultPolicy = PermissionPolicy{
	ActionAddMember:         PolicyAdmin,
	ActionRemoveMember:      PolicyAdmin,
	ActionUpdateMetadata:    PolicyAdmin,
	ActionAddAdmin:          PolicyAdmin,
	ActionRemoveAdmin:       PolicyAdmin,
	ActionUpdatePermissions: PolicySuperAdmin,
}

// Requirement returns the strongest policy a commit needs, judged against its
// parent's components (never the resulting ones): the actions its proposals
// perform, looked up in the parent's permission policy (or the defaults), and
// the fixed rules:
//   - self-update, and a Remove whose target is the proposer's own leaf or
//     account (self-remove, leave request), are ordinary;
//   - changing the protocol version floor needs a super admin;
//   - changing the conversation type is never allowed;
//   - other extension changes, PSK, ReInit and ExternalInit need an admin.
//
// next is the components of the resulting state; it tells which items a
// components change touches.
func Requirement(parent, next Set, ops []Op) Policy {
	policy := parent.Permissions
	if policy == nil {
		policy = defaultPolicy
	}
	need := PolicyAllow
	raise := func(p Policy) {
		if p > need {
			need = p
		}
	}
	act := func(a Action) {
		p, ok := policy[a]
		if !ok {
			p = defaultPolicy[a]
		}
		raise(p)
	}
	componentsChanged := false
	for _, op := range ops {
		switch op.Type {
		case OpUpdate:
		case OpRemove:
			if !op.SelfTarget && op.Target != op.Proposer {
				act(ActionRemoveMember)
			}
		case OpAdd:
			act(ActionAddMember)
		case OpComponents:
			componentsChanged = true
		default:
			raise(PolicyAdmin)
		}
	}
	if componentsChanged {
		for _, id := range changedIDs(parent, next) {
			switch id {
			case AdminPolicy:
				if len(missing(parent.Admins, next.Admins)) > 0 {
					act(ActionAddAdmin)
				}
				if len(missing(next.Admins, parent.Admins)) > 0 {
					act(ActionRemoveAdmin)
				}
				if next.Admins == nil && parent.Admins != nil {
					act(ActionRemoveAdmin)
				}
			case SuperAdmins, Permissions:
				act(ActionUpdatePermissions)
			case ProtocolFloor:
				raise(PolicySuperAdmin)
			case Conversation:
				raise(PolicyDeny)
			default:
				act(ActionUpdateMetadata)
			}
		}
	}
	return need
}

// Privileged reports whether a commit needs an active admin in its parent:
// the "privileged" of the convergence branch order.
func Privileged(parent, next Set, ops []Op) bool {
	return Requirement(parent, next, ops) >= PolicyAdmin
}

// Authorize checks that committer may commit ops against parent. A
// super-admin requirement falls back to admin when the parent has no super
// admins, so such a group stays manageable.
func Authorize(parent, next Set, committer AccountID, ops []Op) error {
	need := Requirement(parent, next, ops)
	role := RoleOf(parent, committer)
	ok := false
	switch need {
	case PolicyAllow:
		ok = true
	case PolicyAdmin:
		ok = role >= RoleAdmin
	case PolicySuperAdmin:
		ok = role == RoleSuperAdmin || (len(parent.SuperAdmins) == 0 && role >= RoleAdmin)
	}
	if !ok {
		return ErrUnauthorized
	}
	return nil
}

// changedIDs lists the component ids whose encoded bodies differ.
func changedIDs(a, b Set) []ID {
	ab, bb := rawBodies(a), rawBodies(b)
	var out []ID
	for id := range union(ab, bb) {
		x, xOK := ab[id]
		y, yOK := bb[id]
		if xOK != yOK || !bytes.Equal(x, y) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// missing returns the accounts of want that have is lacks.
func missing(have, want []AccountID) []AccountID {
	var out []AccountID
	for _, a := range want {
		if !containsAccount(have, a) {
			out = append(out, a)
		}
	}
	return out
}
