package clientstore

import (
	"context"
	"testing"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// BenchmarkSetConsent measures one consent change that emits: a
// compare-and-set on the record, the publish, and the outbox cleanup.
func BenchmarkSetConsent(b *testing.B) {
	e := newEnv(b)
	s, _ := e.store()
	rec, _, err := s.RegisterClient(context.Background(), tenant, RegisterRequest{InboxID: inboxOf(1)})
	if err != nil {
		b.Fatal(err)
	}
	states := []schema.ConsentState{schema.ConsentAllowed, schema.ConsentDenied}
	for i := 0; b.Loop(); i++ {
		c := ConsentRecord{EntityKind: schema.ConsentEntityInbox, Entity: inboxOf(2), State: states[i%2]}
		if changed, err := s.SetConsent(context.Background(), tenant, rec.ClientID, c); err != nil || !changed {
			b.Fatal(err)
		}
	}
}
