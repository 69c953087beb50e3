package fanout

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
)

// An app registers a hosted client and subscribes to it at once. On R3
// streams the registration is acknowledged once two of three replicas hold
// it, and a direct get may be answered by a replica still behind: the
// gateway must not refuse the new client as unknown_client for that
// (`fabric load -cluster` failed so at 10,000 hosted clients). Gateways on
// both nodes that do not lead the clients bucket, where the local replica
// answers direct gets, check each client right after its record is stored.
func TestClientExistsRightAfterRegistrationOnR3(t *testing.T) {
	ce := natstest.Start(t, natstest.ThreeNodes())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	info, err := ce.JS.Stream(ctx, streams.KVStream(streams.BucketClients))
	if err != nil {
		t.Fatal(err)
	}
	var kv jetstream.KeyValue
	var gateways []*Gateway
	v, err := auth.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ce.Cluster.Nodes() {
		nc, err := n.Connect()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		if n.NATS().Name() == info.CachedInfo().Cluster.Leader {
			// Registration writes through the leader's node.
			njs, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			if kv, err = njs.KeyValue(ctx, streams.BucketClients); err != nil {
				t.Fatal(err)
			}
			continue
		}
		g, err := New(Config{NATS: nc, Verifier: v})
		if err != nil {
			t.Fatal(err)
		}
		gateways = append(gateways, g)
	}
	if kv == nil || len(gateways) != 2 {
		t.Fatalf("the clients bucket's leader %q is not one of the three nodes", info.CachedInfo().Cluster.Leader)
	}
	// A replica behind is a race: on this machine 1,000 registrations
	// found one in about a third of the runs without the leader's answer.
	const registrations = 2000
	unknown := 0
	for i := range registrations {
		id := fmt.Sprintf("%04x", i+1)
		if _, err := kv.Put(ctx, tenantA+"."+id, []byte{0x80}); err != nil {
			t.Fatal(err)
		}
		for _, g := range gateways {
			ok, err := g.clientExists(ctx, tenantA, id)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				unknown++
			}
		}
	}
	if unknown > 0 {
		t.Fatalf("%d of %d checks right after the client's registration found no client", unknown, 2*registrations)
	}
}
