package ingest

import (
	"context"
	"encoding/hex"
	"testing"

	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Ingest takes what hosted clients send back as input (docs/outbound.md).
// It starts, and takes input, even while it cannot create its outbound
// consumer yet, and loops the outbound messages back once it can: in the
// deploy run a clustered meta leader under load answered that create after
// the API timeout, and ingest used to exit.
func TestOutboundConsumerIsRetriedNotFatal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{none: true})
	ctx := context.Background()
	if err := e.js.DeleteStream(ctx, streams.StreamEvents); err != nil {
		t.Fatal(err)
	}
	w := e.addWorker(envOpts{})
	g := newGroup(t)
	e.hostGroup(g.ID())
	direct := text(t, g, "through intake while the outbound consumer is missing")
	wantResult(t, w.submitOne(t, direct.Transport), direct.ID, schema.StatusQueued, "")

	if err := streams.Ensure(ctx, e.js, streams.Config{}); err != nil {
		t.Fatal(err)
	}
	sent := text(t, g, "sent by a hosted client")
	subj, err := subject.Outbound(testTenant, hex.EncodeToString(g.ID()))
	if err != nil {
		t.Fatal(err)
	}
	body, err := sent.Transport.MarshalMsgpack()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.Publish(ctx, subj, body); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "the outbound message stored as input", func() bool { return len(e.inputs()) == 2 })
	w.awaitOutcome(t, sent.ID, schema.StatusQueued, "", schema.ClassApplication)
}
