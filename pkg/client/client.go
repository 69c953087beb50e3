// Package client is the Go SDK for the fabric's live client events.
//
// Connect opens one WebSocket to the gateway; Subscribe and SubscribeFunc
// create subscriptions on it, read with an iterator (Next, Events) or a
// callback. The SDK returns one credit to the gateway per completed handoff,
// so the bound of 1024 events per subscription holds end to end: queued at
// the gateway, in flight, held here, and the one whose callback runs
// (EVENT-030). Discards are reported as one lagged event before any later
// event (EVENT-031).
//
// # Reconnecting
//
// When the connection drops for a reason other than Close, the SDK dials
// again with backoff and resumes every subscription where it stopped: it
// tells the gateway the stream sequence of the last event it received, and
// the gateway replays, from the events stream, the events stored after it
// that the filter selects, in order, before the live ones. Nothing is lost
// and nothing is handed off twice, as long as the stream still holds the
// events (its retention is the limit), and the bound still applies: a long
// outage with many events surfaces as a lagged event. Events already
// received stay queued here and are handed off as usual. A subscription the
// gateway refuses to resume ends with the gateway's error. A Subscribe made
// while the connection is down waits for it to come back (or for its
// context) and, like every subscription, sees only events after its own
// registration (EVENT-014).
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// Errors a caller branches on.
var (
	// ErrEnded is returned by a read of a subscription that has ended
	// (EVENT-053); errors.Is matches every end, whatever its cause.
	ErrEnded = errors.New("client: subscription ended")
	// ErrClosed is returned by calls on a closed Client.
	ErrClosed = errors.New("client: closed")
	// ErrDisconnected fails a Subscribe the connection dropped under when
	// the client does not reconnect (WithoutReconnect).
	ErrDisconnected = errors.New("client: disconnected")
)

// GatewayError is an error frame from the gateway, such as a refused
// subscription (code forbidden, EVENT-056) or an invalid filter, or a
// connection it closed at the connect frame (WithConnectFrame).
type GatewayError struct {
	Code    string
	Message string
}

func (e *GatewayError) Error() string { return "gateway: " + e.Code + ": " + e.Message }

// EndedError says why a subscription ended; it matches ErrEnded.
type EndedError struct {
	// Reason is the gateway's reason (unsubscribed, shutdown, …), "closed"
	// when the app ended it, or the error that ended it.
	Reason string
	// Err is the error that ended it, if any.
	Err error
}

func (e *EndedError) Error() string { return "client: subscription ended: " + e.Reason }

// Is makes errors.Is(err, ErrEnded) true.
func (e *EndedError) Is(target error) bool { return target == ErrEnded }

// Unwrap returns the cause.
func (e *EndedError) Unwrap() error { return e.Err }

// CallbackPanicError is reported for a callback that panicked (EVENT-051).
type CallbackPanicError struct {
	Value any
}

func (e *CallbackPanicError) Error() string {
	return fmt.Sprintf("client: callback panicked: %v", e.Value)
}

// Option configures Connect.
type Option func(*options)

type options struct {
	enc          wire.Encoding
	httpClient   *http.Client
	reconnect    bool
	minBackoff   time.Duration
	maxBackoff   time.Duration
	onError      func(error)
	writeTimeout time.Duration
	tokenFunc    func(context.Context) (string, error)
	connectFrame bool
}

// WithJSON selects the JSON subprotocol (the default is msgpack).
func WithJSON() Option { return func(o *options) { o.enc = wire.JSON } }

// WithTokenFunc obtains the bearer token for every dial, so a reconnect
// presents a fresh one; with it, subscriptions the gateway ends because the
// token expired resume on the next connection. The token given to Connect
// is then ignored.
func WithTokenFunc(f func(context.Context) (string, error)) Option {
	return func(o *options) { o.tokenFunc = f }
}

// WithConnectFrame sends the token in the connection's first frame,
// connect {token}, instead of an Authorization header, as a browser must
// (it cannot set the header); the gateway answers connected, or closes the
// connection with a code Connect returns as a *GatewayError.
func WithConnectFrame() Option { return func(o *options) { o.connectFrame = true } }

// WithHTTPClient sets the HTTP client the WebSocket handshake uses.
func WithHTTPClient(c *http.Client) Option { return func(o *options) { o.httpClient = c } }

// WithoutReconnect ends every subscription when the connection drops,
// instead of reconnecting and resuming.
func WithoutReconnect() Option { return func(o *options) { o.reconnect = false } }

// WithBackoff sets the reconnect backoff bounds.
func WithBackoff(minBackoff, maxBackoff time.Duration) Option {
	return func(o *options) { o.minBackoff, o.maxBackoff = minBackoff, maxBackoff }
}

// WithErrorHandler receives errors that no call returns: a callback's error
// or panic (EVENT-051), an event that did not decode, a dropped connection.
// It must not block. The default logs with slog.
func WithErrorHandler(f func(error)) Option { return func(o *options) { o.onError = f } }

// Client is a connection to the gateway. Its methods are safe for concurrent
// use, including from inside a callback (EVENT-052).
type Client struct {
	url   string
	token string
	o     options

	wg      sync.WaitGroup // the run goroutine and the reader it starts
	closing chan struct{}  // closed by Close
	ctx     context.Context
	stop    context.CancelFunc // ends ctx on Close
	wake    chan struct{}      // capacity 1: the writer has work

	mu      sync.Mutex
	closed  bool
	ws      *websocket.Conn // nil while disconnected
	gen     uint64          // connection generation, bumped per connection
	nextReq uint64
	subs    map[*Subscription]struct{}
	byID    map[uint64]*Subscription // gateway ids on the current connection
	pending map[uint64]*Subscription // subscribe requests awaiting an answer
	queued  []*Subscription          // first subscribes waiting for a connection
	control [][]byte                 // frames to write
	credit  []*Subscription          // subscriptions with credit to return
}

// Connect dials the gateway at url (ws:// or wss://, path /v1/events) with a
// bearer token and returns once the connection is open.
func Connect(ctx context.Context, url, token string, opts ...Option) (*Client, error) {
	o := options{
		enc:          wire.Msgpack,
		reconnect:    true,
		minBackoff:   100 * time.Millisecond,
		maxBackoff:   10 * time.Second,
		writeTimeout: 10 * time.Second,
		onError:      func(err error) { slog.Warn("fabric client", "err", err) },
	}
	for _, opt := range opts {
		opt(&o)
	}
	cctx, stop := context.WithCancel(context.Background())
	c := &Client{
		url: url, token: token, o: o, ctx: cctx, stop: stop,
		closing: make(chan struct{}),
		wake:    make(chan struct{}, 1),
		subs:    make(map[*Subscription]struct{}),
		byID:    make(map[uint64]*Subscription),
		pending: make(map[uint64]*Subscription),
	}
	ws, err := c.dial(ctx)
	if err != nil {
		stop()
		return nil, err
	}
	c.mu.Lock()
	c.ws = ws
	c.gen = 1
	c.mu.Unlock()
	c.wg.Go(func() { c.run(ws) })
	return c, nil
}

func (c *Client) dial(ctx context.Context) (*websocket.Conn, error) {
	token := c.token
	if c.o.tokenFunc != nil {
		t, err := c.o.tokenFunc(ctx)
		if err != nil {
			return nil, fmt.Errorf("client: token: %w", err)
		}
		token = t
	}
	h := http.Header{}
	if !c.o.connectFrame {
		h.Set("Authorization", "Bearer "+token)
	}
	ws, resp, err := websocket.Dial(ctx, c.url, &websocket.DialOptions{
		HTTPClient:   c.o.httpClient,
		HTTPHeader:   h,
		Subprotocols: []string{c.o.enc.Subprotocol()},
	})
	if err != nil {
		if resp != nil && resp.StatusCode >= 400 {
			return nil, fmt.Errorf("client: dial: status %d: %w", resp.StatusCode, err)
		}
		return nil, fmt.Errorf("client: dial: %w", err)
	}
	if ws.Subprotocol() != c.o.enc.Subprotocol() {
		_ = ws.CloseNow()
		return nil, errors.New("client: gateway did not accept the subprotocol")
	}
	ws.SetReadLimit(4 << 20)
	if c.o.connectFrame {
		if err := c.connect(ctx, ws, token); err != nil {
			_ = ws.CloseNow()
			return nil, err
		}
	}
	return ws, nil
}

// connect sends the connect frame and awaits connected. A refusal is the
// gateway's close code as a *GatewayError with the close reason.
func (c *Client) connect(ctx context.Context, ws *websocket.Conn, token string) error {
	if err := ws.Write(ctx, c.frameType(), wire.Append(c.o.enc, nil, &wire.Frame{Op: wire.OpConnect, Token: token})); err != nil {
		return fmt.Errorf("client: connect: %w", err)
	}
	_, b, err := ws.Read(ctx)
	var ce websocket.CloseError
	switch {
	case errors.As(err, &ce):
		code, ok := wire.CloseCodes[int(ce.Code)]
		if !ok {
			code = fmt.Sprintf("close_%d", ce.Code)
		}
		return fmt.Errorf("client: connect: %w", &GatewayError{Code: code, Message: ce.Reason})
	case err != nil:
		return fmt.Errorf("client: connect: %w", err)
	}
	f, err := wire.Decode(c.o.enc, b)
	if err != nil || f.Op != wire.OpConnected {
		return fmt.Errorf("client: connect: the gateway answered %q, not connected", f.Op)
	}
	return nil
}

func (c *Client) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Subscribe creates a subscription for clientID's events selected by filter
// (schema.EventFilter{} selects every kind; Kinds []schema.EventKind{} none)
// and returns once the gateway has registered it: it sees every matching
// event that reaches the gateway after that, and none before (EVENT-014),
// unless an option starts it from the stream (Since, FromStart).
func (c *Client) Subscribe(ctx context.Context, clientID string, filter schema.EventFilter, opts ...SubscribeOption) (*Subscription, error) {
	return c.subscribe(ctx, clientID, filter, false, opts)
}

// SubscribeOption sets where a subscription starts.
type SubscribeOption func(*Subscription)

// Since starts a subscription from the stream: the client's events stored
// at or after t come first, in order, then live ones. A t at or before the
// epoch is FromStart. The gateway replays at most its replay limit and
// reports the rest in a lagged (EVENT-031).
func Since(t time.Time) SubscribeOption {
	return func(s *Subscription) {
		if ms := t.UnixMilli(); ms > 0 {
			s.startTime, s.fromStart = ms, false
			return
		}
		s.startTime, s.fromStart = 0, true
	}
}

// FromStart starts a subscription from the first of the client's events
// the stream holds; see Since.
func FromStart() SubscribeOption {
	return func(s *Subscription) { s.startTime, s.fromStart = 0, true }
}

// SubscribeFunc creates a subscription read by a callback: fn runs for each
// event, one at a time (EVENT-050), on a goroutine the subscription owns. An
// error or panic of fn is reported to the error handler and does not end
// anything (EVENT-051). fn's context ends when the subscription does.
// Unsubscribing or closing from inside fn does not wait for fn (EVENT-052);
// Done is closed once the subscription has ended and fn has returned.
func (c *Client) SubscribeFunc(ctx context.Context, clientID string, filter schema.EventFilter,
	fn func(context.Context, schema.ClientEvent) error, opts ...SubscribeOption) (*Subscription, error) {
	s, err := c.subscribe(ctx, clientID, filter, true, opts)
	if err != nil {
		return nil, err
	}
	go s.runCallbacks(fn)
	return s, nil
}

func (c *Client) subscribe(ctx context.Context, clientID string, filter schema.EventFilter, callback bool, opts []SubscribeOption) (*Subscription, error) {
	if err := filter.Validate(); err != nil {
		return nil, fmt.Errorf("client: invalid filter: %w", err)
	}
	s := newSubscription(c, clientID, filter)
	s.callback = callback
	for _, o := range opts {
		o(s)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	switch {
	case c.ws != nil:
		c.requestLocked(s, 0, 0)
	case c.o.reconnect:
		// Sent once the connection is back; it returns when registered.
		c.queued = append(c.queued, s)
	default:
		c.mu.Unlock()
		return nil, ErrDisconnected
	}
	c.mu.Unlock()
	c.signal()

	select {
	case err := <-s.answer:
		if err != nil {
			return nil, err
		}
		return s, nil
	case <-ctx.Done():
		// The gateway may still register it; end it when it does.
		c.mu.Lock()
		s.abandoned = true
		if s.id != 0 {
			c.endLocked(s, &EndedError{Reason: "subscribe cancelled", Err: ctx.Err()}, true)
		}
		c.mu.Unlock()
		c.signal()
		return nil, ctx.Err()
	}
}

// requestLocked queues a subscribe frame for s. A subscription that starts
// from the stream and has received no event yet asks for its start again
// instead of resuming. c.mu held.
func (c *Client) requestLocked(s *Subscription, afterSeq uint64, held int) {
	c.nextReq++
	s.req = c.nextReq
	s.gen = c.gen
	c.pending[s.req] = s
	f := s.filter
	fr := &wire.Frame{
		Op: wire.OpSubscribe, ID: s.req, ClientID: s.clientID, Filter: &f,
		AfterSeq: afterSeq, Held: int64(held),
	}
	if afterSeq == 0 {
		fr.StartTime, fr.FromStart = s.startTime, s.fromStart
	}
	c.control = append(c.control, wire.Append(c.o.enc, nil, fr))
}

// endLocked ends s: no handoff follows (EVENT-053). With unsubscribe, the
// gateway is told. c.mu held.
func (c *Client) endLocked(s *Subscription, why *EndedError, unsubscribe bool) {
	if s.ended {
		return
	}
	s.ended = true
	s.endErr = why
	s.buf = nil
	delete(c.subs, s)
	if s.id != 0 {
		delete(c.byID, s.id)
		if unsubscribe && c.ws != nil {
			c.control = append(c.control, wire.Append(c.o.enc, nil, &wire.Frame{Op: wire.OpUnsubscribe, Sub: s.id}))
		}
	}
	// A subscribe still in flight stays pending: its answer is then
	// unsubscribed (see handle).
	s.cancel()
	s.wakeReaders()
	if !s.callback {
		s.markDone()
	}
}

// Close ends every subscription, then closes the connection; when it
// returns no subscription hands off another event (EVENT-054). It does not
// wait for a running callback, so a callback may call it (EVENT-052).
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	for s := range c.subs {
		c.endLocked(s, &EndedError{Reason: reasonClosed, Err: ErrClosed}, false)
	}
	for _, s := range c.pending {
		s.resolve(ErrClosed)
	}
	for _, s := range c.queued {
		s.resolve(ErrClosed)
	}
	c.pending = map[uint64]*Subscription{}
	c.queued = nil
	c.mu.Unlock()
	close(c.closing)
	c.stop()
	c.wg.Wait()
	return nil
}

// run owns the connection: it writes, starts the reader, and reconnects.
func (c *Client) run(ws *websocket.Conn) {
	for {
		readDone := make(chan struct{})
		var readErr error
		c.wg.Go(func() {
			readErr = c.readLoop(ws)
			close(readDone)
		})
		err := c.writeLoop(ws, readDone)
		select {
		case <-c.closing:
			_ = ws.Close(websocket.StatusNormalClosure, "closed")
			<-readDone
			return
		default:
		}
		_ = ws.CloseNow()
		<-readDone
		if err == nil {
			err = readErr
		}
		c.disconnected(err)
		if !c.o.reconnect {
			return
		}
		ws = c.redial()
		if ws == nil {
			return
		}
	}
}

// writeLoop writes queued frames and credit until the connection fails or
// the client closes.
func (c *Client) writeLoop(ws *websocket.Conn, readDone <-chan struct{}) error {
	for {
		c.mu.Lock()
		frames := c.control
		c.control = nil
		credits := c.credit
		c.credit = nil
		for _, s := range credits {
			s.creditQueued = false
			if s.id == 0 || s.pendingCredit == 0 {
				if s.pendingCredit > 0 {
					s.creditQueued = true
					c.credit = append(c.credit, s) // awaiting its id
				}
				continue
			}
			frames = append(frames, wire.Append(c.o.enc, nil, &wire.Frame{Op: wire.OpCredit, Sub: s.id, N: s.pendingCredit}))
			s.pendingCredit = 0
		}
		c.mu.Unlock()
		for _, b := range frames {
			ctx, cancel := context.WithTimeout(context.Background(), c.o.writeTimeout)
			err := ws.Write(ctx, c.frameType(), b)
			cancel()
			if err != nil {
				return err
			}
		}
		if len(frames) > 0 {
			continue
		}
		select {
		case <-c.wake:
		case <-c.closing:
			return ErrClosed
		case <-readDone:
			return nil
		}
	}
}

func (c *Client) frameType() websocket.MessageType {
	if c.o.enc == wire.Msgpack {
		return websocket.MessageBinary
	}
	return websocket.MessageText
}

// readLoop reads gateway frames until the connection fails.
func (c *Client) readLoop(ws *websocket.Conn) error {
	for {
		_, b, err := ws.Read(context.Background())
		if err != nil {
			return err
		}
		f, err := wire.Decode(c.o.enc, b)
		if err != nil {
			c.o.onError(fmt.Errorf("client: %w", err))
			continue
		}
		if err := c.handle(&f); err != nil {
			c.o.onError(err)
		}
	}
}

// handle acts on one gateway frame. It returns an error for the error
// handler, which is called without c.mu held so that it may call the client.
func (c *Client) handle(f *wire.Frame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch f.Op {
	case wire.OpSubscribed:
		s := c.pending[f.ID]
		if s == nil {
			return nil
		}
		delete(c.pending, f.ID)
		s.req = 0
		if s.ended {
			// Ended while its subscribe was in flight.
			c.control = append(c.control, wire.Append(c.o.enc, nil, &wire.Frame{Op: wire.OpUnsubscribe, Sub: f.Sub}))
			c.signal()
			return nil
		}
		s.id = f.Sub
		c.byID[f.Sub] = s
		if s.lastSeq < f.Seq && s.resumedFrom == 0 && !s.fromStream() {
			s.lastSeq = f.Seq // the registration point
		}
		s.resumedFrom = 0
		if s.abandoned {
			c.endLocked(s, &EndedError{Reason: "subscribe cancelled"}, true)
			c.signal()
			return nil
		}
		c.subs[s] = struct{}{}
		if s.pendingCredit > 0 {
			c.queueCreditLocked(s)
		}
		s.resolve(nil)
	case wire.OpEvent:
		s := c.byID[f.Sub]
		if s == nil {
			return nil // ended here; the gateway drops it too
		}
		var ev schema.ClientEvent
		if err := c.decodeEvent(f.Event, &ev); err != nil {
			s.pendingCredit++ // its slot must still be returned
			c.queueCreditLocked(s)
			return fmt.Errorf("client: event did not decode: %w", err)
		}
		ev.ID = f.EventID
		return s.deliver(ev, f.Seq)
	case wire.OpEnded:
		s := c.byID[f.Sub]
		if s == nil {
			return nil
		}
		resumable := f.Reason == wire.ReasonShutdown ||
			(f.Reason == wire.ReasonTokenExpired && c.o.tokenFunc != nil)
		if resumable && c.o.reconnect {
			// The gateway will close the connection; the subscription
			// resumes on the next one.
			delete(c.byID, s.id)
			s.id = 0
			return nil
		}
		c.endLocked(s, &EndedError{Reason: f.Reason}, false)
	case wire.OpError:
		gerr := &GatewayError{Code: f.Code, Message: f.Message}
		if s := c.pending[f.ID]; f.ID != 0 && s != nil {
			delete(c.pending, f.ID)
			s.req = 0
			if s.resumedFrom != 0 || s.answered {
				// A resume the gateway refused ends the subscription.
				c.endLocked(s, &EndedError{Reason: "resume refused", Err: gerr}, false)
				return nil
			}
			s.resolve(gerr)
			return nil
		}
		return gerr
	}
	return nil
}

func (c *Client) decodeEvent(b []byte, ev *schema.ClientEvent) error {
	if c.o.enc == wire.JSON {
		return json.Unmarshal(b, ev)
	}
	return msgpack.Unmarshal(b, ev)
}

// queueCreditLocked schedules s's pending credit for the writer. c.mu held.
func (c *Client) queueCreditLocked(s *Subscription) {
	if !s.creditQueued {
		s.creditQueued = true
		c.credit = append(c.credit, s)
	}
	c.signal()
}

// disconnected forgets the connection's ids; subscriptions wait to resume.
func (c *Client) disconnected(err error) {
	if err != nil && !errors.Is(err, ErrClosed) {
		c.o.onError(fmt.Errorf("client: connection lost: %w", err))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ws = nil
	c.control = nil
	for _, s := range c.pending {
		s.req = 0
		switch {
		case s.answered:
			// A resume: it is in c.subs and resumes again.
		case c.o.reconnect && !s.abandoned:
			c.queued = append(c.queued, s) // asked again on the next connection
		default:
			s.resolve(fmt.Errorf("%w: %v", ErrDisconnected, err))
		}
	}
	c.pending = make(map[uint64]*Subscription)
	c.byID = make(map[uint64]*Subscription)
	for s := range c.subs {
		s.id = 0
		// Credit owed to the old connection dies with it; events still held
		// here are declared as held on resume.
		s.pendingCredit = 0
		if !c.o.reconnect {
			c.endLocked(s, &EndedError{Reason: "disconnected", Err: err}, false)
		}
	}
	for _, s := range c.credit {
		s.creditQueued = false // the queue is dropped with the connection
	}
	c.credit = nil
}

// redial dials with backoff until it succeeds or the client closes, then
// resumes every subscription.
func (c *Client) redial() *websocket.Conn {
	backoff := c.o.minBackoff
	for {
		select {
		case <-c.closing:
			return nil
		case <-time.After(backoff):
		}
		ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
		ws, err := c.dial(ctx)
		cancel()
		if err == nil {
			c.mu.Lock()
			if c.closed {
				c.mu.Unlock()
				_ = ws.CloseNow()
				return nil
			}
			c.ws = ws
			c.gen++
			for s := range c.subs {
				s.resumedFrom = s.lastSeq
				c.requestLocked(s, s.lastSeq, s.heldLocked())
			}
			for _, s := range c.queued {
				if !s.abandoned {
					c.requestLocked(s, 0, 0)
				}
			}
			c.queued = nil
			c.mu.Unlock()
			c.signal()
			return ws
		}
		c.o.onError(fmt.Errorf("client: reconnect: %w", err))
		backoff = min(backoff*2, c.o.maxBackoff)
	}
}
