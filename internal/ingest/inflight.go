package ingest

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// storeFull reports whether err is a stream refusing a write at its byte
// bound (MaxBytes with discard new).
func storeFull(err error) bool {
	var ae *jetstream.APIError
	return errors.As(err, &ae) && strings.Contains(ae.Description, "maximum bytes exceeded")
}

// bytesInFlight bounds the request bodies one worker reads and processes
// at once, in bytes: 32 concurrent 8 MiB bodies are 256 MiB before any
// copy is made.
type bytesInFlight struct {
	max int64

	mu  sync.Mutex
	cur int64
}

// acquire reserves n bytes, or refuses at once: a waiting request would
// hold its connection and its body anyway.
func (b *bytesInFlight) acquire(n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cur+n > b.max && b.cur > 0 {
		return ErrOverloaded.With("the worker is reading %d bytes of requests, its bound; retry", b.max).After(time.Second)
	}
	b.cur += n
	return nil
}

func (b *bytesInFlight) release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cur -= n
}

// reservation is the bytes a request's body may take: its declared length,
// else the body bound.
func reservation(r *http.Request, maxBody int64) int64 {
	if r.ContentLength > 0 && r.ContentLength < maxBody {
		return r.ContentLength
	}
	return maxBody
}
