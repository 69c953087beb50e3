package ops

import (
	"context"
	"errors"
	"time"

	"golang.org/x/sync/errgroup"
)

// Component is a part of a process with the one lifecycle of the fabric
// (docs/architecture.md, Lifecycle): New binds it and starts nothing; Run
// runs it until ctx ends, then drains it and returns. Every goroutine it
// starts ends before Run returns.
type Component interface {
	Run(ctx context.Context) error
}

// RunFunc is a function as a Component.
type RunFunc func(ctx context.Context) error

// Run calls f.
func (f RunFunc) Run(ctx context.Context) error { return f(ctx) }

// Serving is s as a Component: it serves until ctx ends, then lets
// requests in flight finish for up to drain.
func (s *Server) Serving(drain time.Duration) Component {
	return RunFunc(func(ctx context.Context) error { return s.Serve(ctx, drain) })
}

// Run runs every component together until ctx ends or one of them fails,
// which ends the others' too, and returns once all have drained, with the
// first failure. A component returning ctx's cancellation after ctx ended
// has not failed.
func Run(ctx context.Context, cs ...Component) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, c := range cs {
		g.Go(func() error {
			err := c.Run(gctx)
			if errors.Is(err, context.Canceled) && gctx.Err() != nil {
				return nil
			}
			return err
		})
	}
	return g.Wait()
}
