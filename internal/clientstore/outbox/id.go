package outbox

import "github.com/fabric-mls/fabric/internal/bus"

// ID derives an event id from what caused the event, with bus.EventID:
// distinct causes never share an id and the same cause always has the same
// one (EVENT-001).
func ID(parts ...string) string {
	b := make([][]byte, len(parts))
	for i, p := range parts {
		b[i] = []byte(p)
	}
	return bus.EventID(b...)
}
