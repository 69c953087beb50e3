// Package components is the group components GroupContext extension: the app
// components a conversation carries (name, description, image, disappearing
// messages, admin and super admin lists, permission policy, protocol version
// floor, conversation type), their codec, the diff into the names of
// conversation.metadata_changed (EVENT-019), and the authorization rule that
// says which changes need an admin.
//
// All components travel in ONE GroupContext extension of the private-use type
// [ExtensionType]. Its body is TLS-style (RFC 9420 §2.1), lengths are MLS
// variable-length integers (RFC 9420 §2.1.2, minimal encoding only):
//
//	struct {
//	    uint16 component_id;
//	    opaque data<V>;
//	} ComponentEntry;
//
//	struct {
//	    ComponentEntry entries<V>;   // strictly ascending component_id
//	} AppComponents;
//
// Component ids follow the Marmot registry where it has one (0x8001 profile,
// 0x8003 admin policy, 0x8005 message retention, 0x8007 avatar URL) and use
// fabric ids 0xFA01–0xFA04 otherwise; see docs/mls-engine.md for the table and
// each body's layout. Unknown components are kept byte for byte.
//
// Importing this package also registers [ExtensionType] with mls-go as a
// GroupContext extension it may carry, so a joiner accepts a Welcome whose
// GroupContext has it (see register.go).
package components
