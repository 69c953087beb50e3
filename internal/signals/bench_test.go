package signals

import (
	"context"
	"strconv"
	"testing"

	"github.com/fabric-mls/fabric/internal/clientstore"
)

// BenchmarkReport measures one accepted signal: the idempotency lookup, the
// ordering record's compare-and-set, the publish, the outbox cleanup and
// the idempotency record.
func BenchmarkReport(b *testing.B) {
	e := newEnv(b)
	ci := e.register(tenant, 1, "")
	cl, err := clientstore.Lookup(context.Background(), e.sig.clients, tenant, ci.ClientID)
	if err != nil {
		b.Fatal(err)
	}
	ev := signalSamples()[8]
	for i := 0; b.Loop(); i++ {
		if ans, _, err := e.sig.Report(context.Background(), cl, "b"+strconv.Itoa(i), ev); err != nil || ans.Emitted != 1 {
			b.Fatal(err)
		}
	}
}

// BenchmarkSignalHTTP measures the same through the HTTP endpoint, with
// token verification and JSON decoding.
func BenchmarkSignalHTTP(b *testing.B) {
	e := newEnv(b)
	ci := e.register(tenant, 1, "")
	body, _ := signalSamples()[8].MarshalJSON()
	for i := 0; b.Loop(); i++ {
		if r := e.post(tenant, ci.ClientID, "h"+strconv.Itoa(i), body); r.status != 200 {
			b.Fatalf("%+v", r)
		}
	}
}
