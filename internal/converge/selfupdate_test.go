package converge

import (
	"encoding/hex"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Issue 19: self-update of the client's leaf on a configurable schedule,
// for post-compromise security. Once a hosted member's leaf is older than
// Config.SelfUpdateAfter (by converge's clock), converge runs a self-update
// operation for it in the group's transaction: one commit on the outbound
// subject, its record pending then done once the commit comes back
// accepted; the peer follows it. The renewed leaf is due again one period
// later, and not before: over two periods there are exactly two.
func TestScheduledSelfUpdateOncePerPeriod(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const period = 7 * 24 * time.Hour
	clock := &testClock{}
	e.worker("w1", func(c *Config) { c.Now, c.SelfUpdateAfter = clock.Now, period })
	e.startIngest()
	h, group, bg := e.createdWithPeer()
	create := e.outboundMsgs(group, 2)[0].opID

	var ops []string
	for i, ahead := range []time.Duration{period + time.Minute, 2*period + 2*time.Minute} {
		clock.run(ahead)
		out := e.outboundMsgs(group, 3+i)
		su := out[2+i]
		if su.class != string(schema.ClassCommit) || su.opID == create {
			t.Fatalf("period %d: outbound %+v, want a self-update commit", i+1, su)
		}
		if _, err := bg.Process(su.transport); err != nil {
			t.Fatalf("period %d: bob follows the self-update: %v", i+1, err)
		}
		rec := e.operation(must[[]byte](t)(hex.DecodeString(su.opID)), schema.OperationDone)
		if rec.Kind != schema.OpSelfUpdate || rec.ClientID != h.rec.ClientID || len(rec.MessageIDs) != 1 || hex.EncodeToString(rec.MessageIDs[0]) != su.id {
			t.Fatalf("period %d: record %+v", i+1, rec)
		}
		ops = append(ops, su.opID)
	}
	if ops[0] == ops[1] {
		t.Fatal("both periods' self-updates are one operation")
	}
	// Nothing more is due: the next message out is the client's text, and
	// bob, on the epoch of the last self-update, reads it.
	send := e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: h.rec.ClientID, GroupID: group, Payload: textOf(t, "after two updates")})
	e.operation(send, schema.OperationDone)
	out := e.outboundMsgs(group, 5)
	if out[4].class != string(schema.ClassApplication) {
		t.Fatalf("fifth outbound %+v, want the text", out[4])
	}
	if r, err := bg.Process(out[4].transport); err != nil || r.Kind != testpeer.KindApplication {
		t.Fatalf("bob reads the text: %+v %v", r, err)
	}
}
