// Package schema is fabric's public contract, defined once: the live client
// events of the events spec (ClientEvent, EventKind and the payload
// dictionaries), the subscription filter (EventFilter), the transport
// message of the binding fabric-native/1 (TransportMessage), and the outcome
// vocabulary of Marmot's adopted foundation/errors.md (Disposition,
// Category, NamedOutcome) with the durable Outcome record.
//
// # Encodings
//
// Every type has two encodings with the same member names, the IDL's
// snake_case names: msgpack (maps keyed by member name, octets as bin) and
// JSON (octets as lowercase hexadecimal strings). Optional members are
// omitted when absent; required members are always present, and a required
// sequence that is empty is encoded as an empty array. Decoding is strict:
// unknown kinds, unknown or duplicate members at any level, missing required
// members and wrong types are errors, and everything a decoder returns has
// passed Validate.
//
// # Extension kinds
//
// Besides the 28 kinds of the spec's kind table and lagged, the package
// defines two extension kinds, outside the spec's table, for what Marmot
// branch selection withdraws:
//
//   - fabric.commit_superseded (member commit_superseded: group_id,
//     commit_digest = SHA-256 of the commit MLSMessage): a commit whose
//     events were emitted left the selected branch; its events are
//     withdrawn.
//   - fabric.message_invalidated (member message_invalidated: group_id,
//     message_id): an application message whose message.received was
//     emitted decrypts only on a losing branch; its payload is withdrawn.
//
// They sort after the spec's kinds in Order and AllKinds, and SpecKinds
// leaves them out.
package schema
