// Package converge is the converge role: ordered per-group processing of
// FABRIC_IN, every hosted member's MLS state through the engine, the group's
// canonical state, and the projection of each change into per-client events
// (package project), emitted exactly once (EVENT-001) after the change is
// stored (EVENT-010).
//
// A [Worker] owns input partitions by lease (lease.go) and consumes each in
// stream order (partition.go). A group's inputs run as transactions over its
// state (group.go, marmot.go: welcome, branch selection, cleanup), through
// the [MLS] seam (mls.go, engine.go). A transaction commits behind the
// group's checkpoint fence (fence.go, commit.go): state blobs first, then
// the events and the checkpoint in one atomic batch that a worker which lost
// its partition cannot store, then outcome records and the group's KV
// entries for ingest and fanout. docs/converge.md describes the model and
// every stored format.
package converge
