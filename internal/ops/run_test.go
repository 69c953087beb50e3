package ops

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

// One component failing ends the others' context; Run returns its error
// only once every component has drained.
func TestRunDrainsEveryComponentWhenOneFails(t *testing.T) {
	errBroken := errors.New("broken")
	var drained atomic.Int32
	waiter := RunFunc(func(ctx context.Context) error {
		<-ctx.Done()
		drained.Add(1)
		return ctx.Err() // a cancellation after ctx ended is no failure
	})
	failing := RunFunc(func(context.Context) error { return errBroken })
	if err := Run(context.Background(), waiter, failing, waiter); !errors.Is(err, errBroken) {
		t.Fatalf("Run = %v, want the failure", err)
	}
	if n := drained.Load(); n != 2 {
		t.Fatalf("%d components drained before Run returned, want 2", n)
	}
}

// Ending the context drains every component, and Run reports no error.
func TestRunReturnsWhenContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, RunFunc(func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			return nil
		}), RunFunc(func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		}))
	}()
	<-started
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v after its context ended", err)
	}
}
