package client_test

import (
	"context"
	"fmt"
	"log"

	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Read a conversation's received messages with the iterator form.
func ExampleSubscription_Events() {
	ctx := context.Background()
	c, err := client.Connect(ctx, "wss://fabric.example/v1/events", "<bearer token>")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	sub, err := c.Subscribe(ctx, "0a1b2c", schema.EventFilter{
		Kinds:    []schema.EventKind{schema.KindMessageReceived},
		GroupIDs: []schema.Bytes{{0xaa, 0x01}},
	})
	if err != nil {
		log.Fatal(err)
	}
	for ev, err := range sub.Events(ctx) {
		if err != nil {
			log.Fatal(err)
		}
		if ev.Kind == schema.KindLagged {
			// Events were discarded: read the conversation again.
			fmt.Println("missed", ev.Lagged.Discarded)
			continue
		}
		fmt.Println("message", ev.MessageReceived.MessageID)
	}
}

// Handle consent changes with a callback; it runs one event at a time and
// may close its own subscription.
func ExampleClient_SubscribeFunc() {
	ctx := context.Background()
	c, err := client.Connect(ctx, "wss://fabric.example/v1/events", "<bearer token>")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	var sub *client.Subscription
	sub, err = c.SubscribeFunc(ctx, "0a1b2c", schema.EventFilter{Kinds: []schema.EventKind{schema.KindConsentChanged}},
		func(ctx context.Context, ev schema.ClientEvent) error {
			if ev.Kind == schema.KindConsentChanged && ev.ConsentChanged.State == schema.ConsentDenied {
				return sub.Close() // does not wait for this callback (EVENT-052)
			}
			return nil
		})
	if err != nil {
		log.Fatal(err)
	}
	<-sub.Done()
}
