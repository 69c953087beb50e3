// Package engine is the fabric's MLS engine on mls-go v1.6.0: hosted
// installations (identity, KeyPackages, sealing at rest), classification of
// MLSMessage bytes before convergence, joining from a Welcome, processing
// PublicMessage commits and proposals, decrypting PrivateMessage application
// messages, retained-state snapshots, the exporter and the group event key,
// and authorization of commits under the components extension.
//
// Convergence tries messages against several retained states: [State.Authenticates]
// tells which state is a message's parent (its membership tag) before any
// check can be terminal, and [State.ProposalRef] and [ConsumedProposalRefs]
// name the proposals a commit needs applied first. [Restore] bounds a
// snapshot's structure before mls-go decodes it.
//
// A [State] is one hosted member's view of one group at one epoch. Processing
// a handshake message never mutates the state it is given: it returns a new
// State, so convergence can try a commit against any retained parent.
// Decrypting an application message advances the sender's ratchet in place,
// as RFC 9420 §9 requires for forward secrecy.
//
// Errors that a caller branches on are [*Error] values carrying a
// schema.Category; error strings never carry ids, keys or payloads.
package engine
