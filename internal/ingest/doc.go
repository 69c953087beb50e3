// Package ingest is the ingest role (DESIGN §1, inbound-processing.md): it
// takes transport messages over HTTP and NATS, peels the fabric-native/1
// envelope, classifies the MLS bytes, deduplicates by message id, gives what
// fails before convergence its rejection category, and publishes the rest
// onto its own input subject fabric.in.<tenant>.<group>.<message_id>, created
// only if absent: the input is its own dedup record, one write per input.
//
// Every input has a durable outcome: a record on FABRIC_OUTCOMES, or for an
// admitted input that converge has not decided yet, the stored input itself. Sealed input
// that no candidate key opens (transport_deferred) and input for a group no
// hosted client holds (unknown_group) is retained on FABRIC_RETAINED under a
// per-tenant bound and offered again when the group's key set changes or a
// hosted client joins the group. Workers keep no state of their own: any
// number of them share the load.
package ingest
