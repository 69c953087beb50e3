// Package bus is the contract between the roles: what ingest, converge and
// fanout pass to each other over NATS JetStream. Roles import it and never
// each other (docs/architecture.md, "Packages").
//
// It holds every record and header that crosses a role: the client event
// (published to a client's event subject with its deterministic id and the
// headers a filter needs, published atomically with converge's checkpoint,
// decoded by the gateway), the fabric-groups record, the sealed
// fabric-group-keys value and the headers of an input message. Its
// sub-packages name the rest: subject builds and parses every subject and KV
// key, streams names and provisions every stream and bucket.
//
// An event's id is sent as Nats-Msg-Id, so FABRIC_EVENTS stores it once
// within the dedup window (EVENT-001); beyond the window, converge's
// checkpoint fence (PublishBatch) keeps a replay from emitting it again.
package bus
