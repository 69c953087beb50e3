package ingest

import (
	"fmt"
	"testing"

	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/refusal"
)

// TestNATSReplyStatuses is the NATS mapping table, tested once: every
// refusal kind has a Fabric-Status of its own, the number HTTP answers the
// same refusal with (docs/ingest.md: gateways speaking both transports
// branch on one set), and an error that is no refusal reveals nothing.
func TestNATSReplyStatuses(t *testing.T) {
	t.Parallel()
	for _, k := range refusal.Kinds {
		err := fmt.Errorf("wrapped: %w", &refusal.Error{Kind: k, Code: "c", Message: "m"})
		re, st := replyRefusal(err)
		if re.Code != "c" || st != httpapi.Status(err) {
			t.Errorf("kind %s: reply %d %q, want %d", k, st, re.Code, httpapi.Status(err))
		}
	}
	if re, st := replyRefusal(fmt.Errorf("secret detail")); st != replyStatusInternal || re.Message != "internal error" {
		t.Errorf("internal: %d %+v", st, re)
	}
}
