package bus

// Headers ingest sets on an input message, fabric.in.<tenant>.<group>.<message
// id>, and converge reads (docs/ingest.md).
const (
	// HeaderClass carries the input class (schema.InputClass).
	HeaderClass = "Fabric-Class"
	// HeaderMessageID carries the message id in lowercase hex.
	HeaderMessageID = "Fabric-Message-Id"
)
