package fanout

import (
	"context"
	"testing"

	"github.com/fabric-mls/fabric/pkg/schema"
)

func TestSmokeSDKReceivesEvent(t *testing.T) {
	for _, name := range []string{"msgpack", "json"} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			var c = e.connect(tenantA, []string{client1})
			if name == "json" {
				c = e.connect(tenantA, []string{client1}, jsonOpt())
			}
			s, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
			if err != nil {
				t.Fatal(err)
			}
			e.publish(tenantA, client1, published{ev: received(groupA, 1, &text)})
			ev := next(t, s)
			if msgNo(ev) != 1 || ev.MessageReceived.ContentType.TypeID != "text" {
				t.Fatalf("got %+v", ev)
			}
		})
	}
}
