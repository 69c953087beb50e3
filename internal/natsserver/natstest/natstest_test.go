package natstest

import (
	"context"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/procstat"
)

func TestMain(m *testing.M) {
	ServeChild()
	goleak.VerifyTestMain(m)
}

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

func TestInChildProcessServesFromItsOwnProcess(t *testing.T) {
	e := Start(t, InChildProcess(""))
	if e.Server != nil || e.Process == nil || e.Process.Pid == os.Getpid() {
		t.Fatalf("server %v, process %v: not a process of its own", e.Server, e.Process)
	}
	if _, err := e.JS.Stream(context.Background(), streams.StreamEvents); err != nil {
		t.Fatalf("streams not provisioned: %v", err)
	}
	if !e.Connect(t).IsConnected() {
		t.Fatal("second connection is not connected")
	}
	if procstat.CPU(e.Process.Pid) == 0 && procstat.RSS(e.Process.Pid) == 0 {
		t.Fatal("the server's process is not readable in /proc")
	}
}
