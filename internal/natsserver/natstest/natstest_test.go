package natstest

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/fabric-mls/fabric/internal/bus/streams"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartProvisions(t *testing.T) {
	e := Start(t)
	for _, name := range []string{streams.StreamInput, streams.StreamEvents, streams.StreamOutcomes, streams.StreamRetained} {
		if _, err := e.JS.Stream(context.Background(), name); err != nil {
			t.Errorf("stream %s: %v", name, err)
		}
	}
	if !e.Connect(t).IsConnected() {
		t.Fatal("second connection is not connected")
	}
}

func TestWithoutStreams(t *testing.T) {
	e := Start(t, WithoutStreams(), OverLoopback())
	if _, err := e.JS.Stream(context.Background(), streams.StreamEvents); err == nil {
		t.Fatal("streams provisioned")
	}
	if e.Server.ClientURL() == "" {
		t.Fatal("no client URL over loopback")
	}
}
