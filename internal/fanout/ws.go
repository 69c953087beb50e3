package fanout

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/fanout/filter"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// maxCredit bounds one credit frame's n; more than the bound is never owed.
const maxCredit = 1 << 20

type wsSink struct {
	ws  *websocket.Conn
	typ websocket.MessageType
	nc  *corkedConn // under ws's write buffer

	// deadline is the write deadline of the batch being written, in unix
	// nanoseconds; 0 between batches. The guard timer reads it when it
	// fires, so a batch costs two stores, not a timer reset and stop.
	deadline atomic.Int64
	mu       sync.Mutex
	guard    *time.Timer // closes the connection past a pending deadline
	armed    bool        // guard is set to fire; under mu
}

// writeFrame writes without a context: the deadline is the guard's, so a
// write does not set up and tear down a context timer per frame.
func (s *wsSink) writeFrame(b []byte) error { return s.ws.Write(context.Background(), s.typ, b) }

// setDeadline arms the guard only when it is not armed already: deadlines
// only grow, so an armed guard fires no later than t and then re-arms for
// the deadline pending then (check).
func (s *wsSink) setDeadline(t time.Time) {
	if t.IsZero() {
		s.deadline.Store(0)
		return
	}
	s.deadline.Store(t.UnixNano())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.armed {
		return
	}
	s.armed = true
	if s.guard == nil {
		s.guard = time.AfterFunc(time.Until(t), s.check)
		return
	}
	s.guard.Reset(time.Until(t))
}

// check is the guard: a batch still being written past its deadline closes
// the connection, which fails the write; a later deadline re-arms it; none
// leaves it unarmed until the next batch.
func (s *wsSink) check() {
	s.mu.Lock()
	d := s.deadline.Load()
	switch {
	case d == 0:
		s.armed = false
	case time.Now().UnixNano() >= d:
		s.armed = false
		s.mu.Unlock()
		_ = s.ws.CloseNow()
		return
	default:
		s.guard.Reset(time.Until(time.Unix(0, d)))
	}
	s.mu.Unlock()
}

func (s *wsSink) ping(ctx context.Context) error { return s.ws.Ping(ctx) }

func (s *wsSink) gather() { s.nc.cork() }

func (s *wsSink) flush() error { return s.nc.uncork() }

// stopGuard stops the guard once the connection's writer has returned.
func (s *wsSink) stopGuard() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.guard != nil {
		s.guard.Stop()
	}
	s.armed = true // nothing arms it again
}

// authorize verifies the request's bearer token and the events scope.
func (g *Gateway) authorize(r *http.Request) (auth.Claims, error) {
	claims, err := g.cfg.Verifier.FromRequest(r)
	if err != nil {
		return auth.Claims{}, err
	}
	if err := claims.Require(auth.ScopeEvents, claims.Tenant, ""); err != nil {
		return auth.Claims{}, err
	}
	return claims, nil
}

// chooseSubprotocol picks the first subprotocol the client offers that the
// gateway speaks.
func chooseSubprotocol(r *http.Request) (string, wire.Encoding, bool) {
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(h, ",") {
			p = strings.TrimSpace(p)
			if enc, ok := wire.EncodingOf(p); ok {
				return p, enc, true
			}
		}
	}
	return "", 0, false
}

// serveWS serves GET /v1/events. A request with an Authorization header is
// authenticated before the upgrade; one without (a browser's) is upgraded
// and must send connect {token} as its first frame (connectFrame).
func (g *Gateway) serveWS(w http.ResponseWriter, r *http.Request) {
	var (
		claims auth.Claims
		err    error
	)
	byHeader := r.Header.Get("Authorization") != ""
	if byHeader {
		if claims, err = g.authorize(r); err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
	}
	proto, enc, ok := chooseSubprotocol(r)
	if !ok {
		httpapi.WriteError(w, r, refusal.BadRequest("offer subprotocol %s or %s", wire.SubprotocolJSON, wire.SubprotocolMsgpack))
		return
	}
	if err := g.Ready(r.Context()); errors.Is(err, ErrDraining) {
		// Refused before the upgrade, so the SDK backs off and dials another.
		httpapi.WriteError(w, r, errDraining)
		return
	}
	if byHeader {
		if err := g.admitConn(claims.Tenant); err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
	}
	hj := &smallBuffers{ResponseWriter: w}
	ws, err := websocket.Accept(hj, r, &websocket.AcceptOptions{Subprotocols: []string{proto}, OriginPatterns: g.cfg.OriginPatterns})
	if err != nil {
		if byHeader {
			g.releaseConn(claims.Tenant)
		}
		return // Accept has answered the request
	}
	// The connection is served on a goroutine of its own and the handler
	// returns, so net/http's state for the request (its serving goroutine's
	// stack, the request, its 4 KiB buffers) is not held for the
	// connection's life.
	if !g.serve(func() { g.serveConn(ws, hj.nc, enc, claims, byHeader) }) {
		if byHeader {
			g.releaseConn(claims.Tenant)
		}
		_ = ws.Close(websocket.StatusGoingAway, "gateway is draining")
	}
}

// serveConn serves an accepted WebSocket until it ends. A connection
// authenticated by header was admitted to its tenant's quota already; one
// without authenticates with its connect frame first.
func (g *Gateway) serveConn(ws *websocket.Conn, nc *corkedConn, enc wire.Encoding, claims auth.Claims, admitted bool) {
	ws.SetReadLimit(hardFrameLimit)
	typ := websocket.MessageText
	if enc == wire.Msgpack {
		typ = websocket.MessageBinary
	}
	if !admitted {
		var ok bool
		if claims, ok = g.connectFrame(ws, enc, typ); !ok {
			return
		}
	}
	defer g.releaseConn(claims.Tenant)
	sink := &wsSink{ws: ws, typ: typ, nc: nc}
	defer sink.stopGuard()
	c := newConn(g, enc, false, claims, sink)
	if !g.addConn(c) {
		_ = ws.Close(websocket.StatusGoingAway, "gateway is draining")
		return
	}
	defer g.removeConn(c)

	// A connection lives no longer than its token.
	if !claims.ExpiresAt.IsZero() {
		expiry := time.AfterFunc(time.Until(claims.ExpiresAt), func() { c.drain(wire.ReasonTokenExpired) })
		defer expiry.Stop()
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		err := c.writeLoop(ctx)
		if err == nil {
			_ = ws.Close(websocket.StatusGoingAway, wire.ReasonShutdown)
		} else {
			_ = ws.CloseNow()
		}
		cancel()
	})
	c.readLoop(ctx, ws, typ)
	cancel()
	c.endAll("")
	// The reader has ended, so the connection is done: closing it unblocks
	// a write in progress. A drain has already closed it with its handshake.
	_ = ws.CloseNow()
	wg.Wait()
}

// Buffer sizes of an accepted WebSocket: a frame larger than them is read
// or written past the buffer, not refused.
const (
	wsReadBuffer  = 512  // app frames: subscribe, credit, unsubscribe
	wsWriteBuffer = 2048 // a frame header and most events in one write
)

// smallBuffers is the ResponseWriter websocket.Accept hijacks: it hands the
// connection over with buffers of wsReadBuffer and wsWriteBuffer bytes
// instead of net/http's 4 KiB each, which are dropped with the request,
// and the write buffer over a corkedConn.
type smallBuffers struct {
	http.ResponseWriter
	nc *corkedConn // set by Hijack
}

func (w *smallBuffers) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	if err := brw.Writer.Flush(); err != nil {
		_ = nc.Close()
		return nil, nil, fmt.Errorf("flush before hijack: %w", err)
	}
	// What the app sent right behind its upgrade request is in net/http's
	// buffer: it moves, still buffered, to the new one.
	n := brw.Reader.Buffered()
	early, _ := brw.Reader.Peek(n)
	br := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(early)), nc), max(wsReadBuffer, n))
	if _, err := br.Peek(n); err != nil {
		_ = nc.Close()
		return nil, nil, fmt.Errorf("move buffered bytes: %w", err)
	}
	w.nc = &corkedConn{Conn: nc}
	return w.nc, bufio.NewReadWriter(br, bufio.NewWriterSize(w.nc, wsWriteBuffer)), nil
}

// maxGathered bounds what a corked connection holds: past it a batch is
// written in parts.
const maxGathered = 64 << 10

// gathered lends corked connections their buffer for the time of a batch,
// so an idle connection holds none.
var gathered = sync.Pool{New: func() any { b := make([]byte, 0, 8<<10); return &b }}

// corkedConn is an accepted WebSocket's connection under its write buffer.
// While corked it gathers what the buffer flushes, frame by frame, and
// uncork writes it at once. A control frame the library's reader writes
// meanwhile (a pong, the close echo) goes out with the batch.
type corkedConn struct {
	net.Conn
	mu     sync.Mutex
	corked bool
	buf    *[]byte // from gathered while corked
}

func (c *corkedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.corked {
		return c.Conn.Write(p)
	}
	if len(*c.buf)+len(p) > maxGathered {
		if err := c.writeGathered(); err != nil {
			return 0, err
		}
		if len(p) > maxGathered {
			return c.Conn.Write(p)
		}
	}
	*c.buf = append(*c.buf, p...)
	return len(p), nil
}

func (c *corkedConn) cork() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.corked {
		c.corked = true
		c.buf = gathered.Get().(*[]byte)
	}
}

// uncork writes what was gathered; the writes after it go straight through.
func (c *corkedConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.corked {
		return nil
	}
	err := c.writeGathered()
	c.corked = false
	gathered.Put(c.buf)
	c.buf = nil
	return err
}

// writeGathered writes and empties the buffer. c.mu held.
func (c *corkedConn) writeGathered() error {
	if len(*c.buf) == 0 {
		return nil
	}
	_, err := c.Conn.Write(*c.buf)
	*c.buf = (*c.buf)[:0]
	return err
}

// connectFrame authenticates a connection opened without an Authorization
// header: its first frame must be connect {token} within ConnectTimeout
// (as Centrifugo's connect command), so a browser's token never appears in
// a URL. It admits the connection to the tenant's quota and answers
// connected; otherwise it closes the connection with a wire Close code and
// the reason, and returns false.
func (g *Gateway) connectFrame(ws *websocket.Conn, enc wire.Encoding, typ websocket.MessageType) (auth.Claims, bool) {
	refuse := func(code int, reason string) (auth.Claims, bool) {
		g.metrics.connectRefusals.WithLabelValues(wire.CloseCodes[code]).Inc()
		_ = ws.Close(websocket.StatusCode(code), closeReason(reason))
		return auth.Claims{}, false
	}
	// A read cancelled by its context closes the connection without a
	// close frame, so the timeout closes it with its code instead.
	timeout := time.AfterFunc(g.cfg.ConnectTimeout, func() {
		refuse(wire.CloseConnectTimeout, fmt.Sprintf("no connect frame within %s", g.cfg.ConnectTimeout))
	})
	// A drain ends the wait: the read's context closes the connection.
	mt, data, err := ws.Read(g.stopping)
	if !timeout.Stop() {
		return auth.Claims{}, false
	}
	if err != nil {
		_ = ws.CloseNow()
		return auth.Claims{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.ConnectTimeout)
	defer cancel()
	if len(data) > g.cfg.MaxFrameBytes || mt != typ {
		return refuse(wire.CloseBadConnect, "the first frame must be a connect frame in the subprotocol's encoding")
	}
	f, err := wire.Decode(enc, data)
	if err != nil || f.Op != wire.OpConnect || f.Token == "" {
		return refuse(wire.CloseBadConnect, `the first frame of a connection without an Authorization header must be {"op":"connect","token":...}`)
	}
	claims, err := g.cfg.Verifier.Verify(ctx, f.Token)
	if err == nil {
		err = claims.Require(auth.ScopeEvents, claims.Tenant, "")
	}
	var re *refusal.Error
	switch {
	case errors.Is(err, auth.ErrForbidden) && errors.As(err, &re):
		return refuse(wire.CloseForbidden, re.Message)
	case errors.As(err, &re):
		return refuse(wire.CloseUnauthenticated, re.Message)
	case err != nil:
		return refuse(wire.CloseUnauthenticated, "invalid token")
	}
	if err := g.admitConn(claims.Tenant); err != nil {
		return refuse(wire.CloseTooManyConnections, "the tenant has its most open connections")
	}
	if err := ws.Write(ctx, typ, wire.Append(enc, nil, &wire.Frame{Op: wire.OpConnected})); err != nil {
		g.releaseConn(claims.Tenant)
		_ = ws.CloseNow()
		return auth.Claims{}, false
	}
	return claims, true
}

// closeReason cuts reason to the 123 bytes a close frame carries, on a
// rune boundary.
func closeReason(reason string) string {
	const limit = 123
	if len(reason) <= limit {
		return reason
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(reason[cut]) {
		cut--
	}
	return reason[:cut]
}

// readLoop reads app frames until the connection ends.
func (c *conn) readLoop(ctx context.Context, ws *websocket.Conn, typ websocket.MessageType) {
	limit := int64(c.g.cfg.MaxFrameBytes)
	for {
		mt, r, err := ws.Reader(ctx)
		if err != nil {
			return
		}
		data, err := io.ReadAll(io.LimitReader(r, limit+1))
		if err != nil {
			return
		}
		if int64(len(data)) > limit {
			if _, err := io.Copy(io.Discard, r); err != nil {
				return
			}
			c.queueError(0, wire.CodeFrameTooLarge, fmt.Sprintf("frame exceeds %d bytes", limit))
			continue
		}
		if mt != typ {
			c.queueError(0, wire.CodeMalformedFrame, "frame type does not match the subprotocol")
			continue
		}
		f, err := wire.Decode(c.enc, data)
		if errors.Is(err, wire.ErrInvalidFilter) {
			c.queueError(f.ID, wire.CodeInvalidFilter, err.Error())
			continue
		}
		if err != nil {
			c.queueError(0, wire.CodeMalformedFrame, err.Error())
			continue
		}
		c.handle(ctx, &f)
	}
}

// handle acts on one app frame.
func (c *conn) handle(ctx context.Context, f *wire.Frame) {
	switch f.Op {
	case wire.OpSubscribe:
		if f.ID == 0 {
			c.queueError(0, wire.CodeMalformedFrame, "subscribe needs a non-zero id")
			return
		}
		if f.Filter == nil {
			c.queueError(f.ID, wire.CodeInvalidFilter, "filter is required")
			return
		}
		if c.count() >= c.g.cfg.MaxSubscriptions {
			c.queueError(f.ID, wire.CodeTooManySubscriptions,
				fmt.Sprintf("at most %d subscriptions per connection", c.g.cfg.MaxSubscriptions))
			return
		}
		if f.Held < 0 || f.Held > int64(c.g.cfg.QueueCapacity) {
			c.queueError(f.ID, wire.CodeMalformedFrame, "held must be between 0 and the queue bound")
			return
		}
		start, ok := startOf(f)
		if !ok {
			c.queueError(f.ID, wire.CodeMalformedFrame, "after_seq, start_time and from_start exclude each other; start_time is unix milliseconds after the epoch")
			return
		}
		s, rerr := c.subscribe(ctx, c.claims.Tenant, f.ClientID, *f.Filter, f.AfterSeq, start, int(f.Held))
		if s == nil {
			c.queueError(f.ID, rerr.Code, rerr.Message)
			return
		}
		c.announce(s, wire.Append(c.enc, nil, &wire.Frame{Op: wire.OpSubscribed, ID: f.ID, Sub: s.id, Seq: s.startSeq}))
	case wire.OpCredit:
		if f.N < 1 || f.N > maxCredit {
			c.queueError(0, wire.CodeBadCredit, fmt.Sprintf("credit n must be between 1 and %d", maxCredit))
			return
		}
		known, err := c.credit(f.Sub, int(f.N))
		switch {
		case err != nil:
			c.queueError(0, wire.CodeBadCredit, err.Error())
		case !known && !c.issued(f.Sub):
			c.queueError(0, wire.CodeUnknownSubscription, "no such subscription")
		}
		// Credit for a subscription that just ended is a harmless race.
	case wire.OpUnsubscribe:
		c.mu.Lock()
		s := c.subs[f.Sub]
		c.mu.Unlock()
		if s == nil {
			if !c.issued(f.Sub) {
				c.queueError(0, wire.CodeUnknownSubscription, "no such subscription")
			}
			return
		}
		c.end(s, wire.ReasonUnsubscribed)
	case wire.OpConnect:
		c.queueError(f.ID, wire.CodeMalformedFrame, "connect is only the first frame of a connection opened without an Authorization header")
	default:
		c.queueError(f.ID, wire.CodeUnknownOp, "unknown op")
	}
}

// startOf returns where a subscribe starts in the stream: nil for a live or
// resumed subscription (EVENT-014), the epoch for from_start. ok is false
// for more than one starting point or a start_time before the epoch.
func startOf(f *wire.Frame) (start *time.Time, ok bool) {
	n := 0
	for _, set := range []bool{f.AfterSeq != 0, f.StartTime != 0, f.FromStart} {
		if set {
			n++
		}
	}
	switch {
	case n > 1 || f.StartTime < 0:
		return nil, false
	case f.FromStart:
		t := time.UnixMilli(0)
		return &t, true
	case f.StartTime > 0:
		t := time.UnixMilli(f.StartTime)
		return &t, true
	}
	return nil, true
}

// issued reports whether id was ever a subscription of this connection.
func (c *conn) issued(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return id != 0 && id <= c.nextID
}

// subscribe checks, compiles and registers a subscription for client of
// tenant, resuming after afterSeq with held events still at the SDK when
// they are set, or starting from the events stored at or after start when
// it is set. It returns nil and the refusal when refused.
func (c *conn) subscribe(ctx context.Context, tenant, client string, f schema.EventFilter, afterSeq uint64, start *time.Time, held int) (*subscription, *refusal.Error) {
	g := c.g
	if !c.claims.ExpiresAt.IsZero() && time.Now().After(c.claims.ExpiresAt) {
		return nil, auth.ErrUnauthenticated.With("token expired")
	}
	if err := subject.ValidClient(client); err != nil {
		return nil, ErrMalformed.Because(err)
	}
	// EVENT-056: only the clients of the token's own tenant it names.
	if err := c.claims.Require(auth.ScopeEvents, tenant, client); err != nil {
		var re *refusal.Error
		if errors.As(err, &re) {
			return nil, re
		}
		return nil, auth.ErrForbidden
	}
	if g.Ready(ctx) != nil {
		return nil, ErrUnavailable.With("gateway is not taking subscriptions")
	}
	switch ok, err := g.clientExists(ctx, tenant, client); {
	case err != nil:
		g.log.Warn("fanout: read client record", "err", err)
		return nil, ErrUnavailable.With("client records are unavailable")
	case !ok:
		return nil, ErrUnknownClient
	}
	var dm resolvedDMKeys
	if len(f.GroupIDs) > 0 && len(f.GroupIDs) <= filter.MaxGroupIDs {
		dm = make(resolvedDMKeys, len(f.GroupIDs))
		for _, gid := range f.GroupIDs {
			key, ok, err := g.dm.DMKey(ctx, tenant, gid)
			if err != nil {
				g.log.Warn("fanout: resolve DM key", "err", err)
				return nil, ErrUnavailable.With("group records are unavailable")
			}
			if ok {
				dm[string(gid)] = key
			}
		}
	}
	compiled, err := filter.Compile(f, dm)
	if err != nil {
		return nil, ErrInvalidFilter.Because(err)
	}
	replay := afterSeq > 0 || start != nil
	if replay && !g.quotas.replayAllowed(tenant, time.Now()) {
		g.metrics.refusals.WithLabelValues(CodeReplayBudget).Inc()
		return nil, ErrReplayBudget
	}
	if start != nil {
		events, err := subject.Events(tenant, client)
		if err != nil {
			return nil, ErrMalformed.Because(err)
		}
		if afterSeq, err = g.afterStart(ctx, events, *start); err != nil {
			g.log.Warn("fanout: find the start in the events stream", "err", err)
			return nil, errEventSourceUnavailable
		}
	}
	s := c.newSubscription(tenant, client, compiled, held)
	if err := g.attach(ctx, s, afterSeq, replay); err != nil {
		c.mu.Lock()
		delete(c.subs, s.id)
		c.mu.Unlock()
		g.log.Warn("fanout: start tap", "err", err)
		return nil, errEventSourceUnavailable
	}
	return s, nil
}
