package components

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
)

// Names of changed items in conversation.metadata_changed (EVENT-019): the
// META-040 field name where the item has one, else the component name, else
// "component:" and the id as four lowercase hex digits.
const (
	FieldGroupName        = "group_name"                         // Profile.Name
	FieldDescription      = "description"                        // Profile.Description
	FieldGroupImageURL    = "group_image_url_square"             // AvatarURL (url, dim, thumbhash)
	FieldDisappearInNS    = "message_disappear_in_ns"            // MessageRetention
	FieldMinProtocol      = "minimum_supported_protocol_version" // ProtocolFloor
	NameAdminList         = "admin_list"                         // AdminPolicy
	NameSuperAdminList    = "super_admin_list"                   // SuperAdmins
	NamePermissionPolicy  = "permission_policy"                  // Permissions
	NameConversationType  = "conversation_type"                  // Conversation
	unknownComponentTitle = "component:"
)

// names maps each known component to the name Diff reports for it when the
// component has no finer field split.
var names = map[ID]string{
	Profile:          "", // split into FieldGroupName and FieldDescription
	AvatarURL:        FieldGroupImageURL,
	MessageRetention: FieldDisappearInNS,
	AdminPolicy:      NameAdminList,
	SuperAdmins:      NameSuperAdminList,
	Permissions:      NamePermissionPolicy,
	ProtocolFloor:    FieldMinProtocol,
	Conversation:     NameConversationType,
}

// ComponentName returns the EVENT-019 name of a whole component: its name in
// the table above, or "component:xxxx" for an unknown or application
// component. Profile reports its two fields separately and has no single name;
// ComponentName returns "group_name" for it.
func ComponentName(id ID) string {
	if id == Profile {
		return FieldGroupName
	}
	if n, ok := names[id]; ok {
		return n
	}
	return fmt.Sprintf("%s%04x", unknownComponentTitle, uint16(id))
}

// Diff returns the EVENT-019 names of the items that differ between old and
// new, one entry per changed item, in ascending component id order (the
// profile's name before its description). Adding or removing a component
// counts as a change of each of its items that is non-empty on either side.
func Diff(old, new Set) []string {
	ob, err1 := old.bodies()
	nb, err2 := new.bodies()
	if err1 != nil || err2 != nil {
		// Sets that came from Decode always encode; an invalid set built in
		// memory is reported as changed in every component it has.
		ob, nb = rawBodies(old), rawBodies(new)
	}
	ids := slices.Sorted(maps.Keys(union(ob, nb)))
	var out []string
	for _, id := range ids {
		o, oOK := ob[id]
		n, nOK := nb[id]
		if oOK == nOK && bytes.Equal(o, n) {
			continue
		}
		if id == Profile {
			var op, np ProfileState
			if old.Profile != nil {
				op = *old.Profile
			}
			if new.Profile != nil {
				np = *new.Profile
			}
			nameChanged := op.Name != np.Name
			descChanged := op.Description != np.Description
			if !nameChanged && !descChanged {
				// Presence changed with both fields empty: the name is the
				// item that appeared or vanished.
				nameChanged = true
			}
			if nameChanged {
				out = append(out, FieldGroupName)
			}
			if descChanged {
				out = append(out, FieldDescription)
			}
			continue
		}
		out = append(out, ComponentName(id))
	}
	return out
}

func union(a, b map[ID][]byte) map[ID][]byte {
	u := maps.Clone(a)
	maps.Copy(u, b)
	return u
}

// rawBodies is bodies without validation, for Diff on sets that do not encode.
func rawBodies(s Set) map[ID][]byte {
	out := make(map[ID][]byte)
	if s.Profile != nil {
		out[Profile] = encodeProfile(*s.Profile)
	}
	if s.Avatar != nil {
		out[AvatarURL] = encodeAvatar(*s.Avatar)
	}
	if s.Retention != nil {
		out[MessageRetention] = encodeRetention(*s.Retention)
	}
	if s.Admins != nil {
		out[AdminPolicy] = encodeAccounts(s.Admins)
	}
	if s.SuperAdmins != nil {
		out[SuperAdmins] = encodeAccounts(s.SuperAdmins)
	}
	if s.Permissions != nil {
		out[Permissions] = encodePermissions(s.Permissions)
	}
	if s.ProtocolFloor != nil {
		out[ProtocolFloor] = appendVarBytes(nil, []byte(*s.ProtocolFloor))
	}
	if s.Conversation != nil {
		out[Conversation] = encodeConversation(*s.Conversation)
	}
	for id, b := range s.Other {
		out[id] = b
	}
	return out
}
