package allinone

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startFabric starts an all-in-one on free loopback ports in a fresh data
// directory unless o names one, and shuts it down when the test ends.
func startFabric(t *testing.T, o Options) *Fabric {
	t.Helper()
	if o.DataDir == "" {
		o.DataDir = t.TempDir()
	}
	o.Listen, o.NATSListen = "127.0.0.1:0", "127.0.0.1:0"
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f, err := Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return f
}

// An input answered queued is on disk: the embedded server fsyncs every
// write unless told to trade that for speed.
func TestAcknowledgedInputIsSyncedByDefault(t *testing.T) {
	jsc := startFabric(t, Options{}).ns.NATS().JetStreamConfig()
	if !jsc.SyncAlways {
		t.Errorf("default all-in-one: JetStream sync_always is off (sync interval %v)", jsc.SyncInterval)
	}
	jsc = startFabric(t, Options{SyncInterval: 2 * time.Minute}).ns.NATS().JetStreamConfig()
	if jsc.SyncAlways || jsc.SyncInterval != 2*time.Minute {
		t.Errorf("SyncInterval 2m: sync_always %t, interval %v", jsc.SyncAlways, jsc.SyncInterval)
	}
}
