package engine

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// An outcome's reason (issue 28) names the operation and the cause, never
// an id, and fits schema.MaxOutcomeReason bytes of UTF-8.
func TestReasonOfIsBoundedAndRedacted(t *testing.T) {
	if r := ReasonOf(fail("join", schema.CategoryInvalidEncoding, ErrNoRatchetTree)); r != "join: "+ErrNoRatchetTree.Error() {
		t.Fatalf("reason %q", r)
	}
	id := strings.Repeat("ab", 16)
	if r := ReasonOf(fmt.Errorf("wrapped: %w", fail("join", schema.CategoryInvalidEncoding, errors.New("group "+id)))); strings.Contains(r, id) || !strings.Contains(r, "<redacted>") {
		t.Fatalf("reason %q carries the id", r)
	}
	long := ReasonOf(fail("join", schema.CategoryInvalidEncoding, errors.New(strings.Repeat("é", 300)+"\xff")))
	if len(long) > schema.MaxOutcomeReason || len(long) < schema.MaxOutcomeReason-1 || !utf8.ValidString(long) {
		t.Fatalf("reason of %d bytes, valid UTF-8 %v", len(long), utf8.ValidString(long))
	}
	if r := ReasonOf(errors.New("not an engine error")); r != "" {
		t.Fatalf("reason %q of a foreign error", r)
	}
}
