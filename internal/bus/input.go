package bus

// Headers ingest sets on an input message, fabric.in.<tenant>.<group>.<message
// id>, and converge reads (docs/ingest.md).
const (
	// HeaderClass carries the input class (schema.InputClass).
	HeaderClass = "Fabric-Class"
	// HeaderMessageID carries the message id in lowercase hex.
	HeaderMessageID = "Fabric-Message-Id"
)

// Headers of a reply to a NATS request of the fabric (ingest's intake,
// operations): the answer's HTTP status, and a refusal's code.
const (
	// HeaderReplyStatus carries the status the same request gets on
	// HTTP: 200, 202, or its refusal's.
	HeaderReplyStatus = "Fabric-Status"
	// HeaderReplyError carries a refusal's code, as in the body.
	HeaderReplyError = "Fabric-Error"
)
