package fanout

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// wsPair returns the gateway side of a real WebSocket connection and a
// channel closed when the peer's side sees the connection end.
func wsPair(t *testing.T) (*websocket.Conn, <-chan struct{}) {
	t.Helper()
	accepted := make(chan *websocket.Conn, 1)
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		accepted <- ws
		<-done
	}))
	t.Cleanup(srv.Close)
	peer, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ws := <-accepted
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			if _, _, err := peer.Read(context.Background()); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		_ = ws.CloseNow()
		_ = peer.CloseNow()
		<-ended
		close(done)
	})
	return ws, ended
}

// EVENT-033: a connection whose batch is still being written past its write
// deadline is closed, so a peer that stops reading cannot hold its writer.
func TestWriteDeadlineClosesConnectionStillWriting_EVENT033(t *testing.T) {
	ws, ended := wsPair(t)
	s := &wsSink{ws: ws, typ: websocket.MessageText}
	defer s.stopGuard()
	s.setDeadline(time.Now().Add(50 * time.Millisecond))
	awaitClosed(t, ended, "a batch still being written")
}

// awaitClosed fails unless ended closes: the guard closed the connection
// past the deadline of batch.
func awaitClosed(t *testing.T, ended <-chan struct{}, batch string) {
	t.Helper()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatalf("the connection stayed open past the write deadline of %s", batch)
	}
}

// A batch written in time leaves the connection open past its deadline; the
// next batch's deadline is enforced, also when the guard was armed by an
// earlier batch.
func TestWriteDeadlineOfFinishedBatchKeepsConnection(t *testing.T) {
	ws, ended := wsPair(t)
	s := &wsSink{ws: ws, typ: websocket.MessageText}
	defer s.stopGuard()
	s.setDeadline(time.Now().Add(20 * time.Millisecond))
	if err := s.writeFrame([]byte("{}")); err != nil {
		t.Fatal(err)
	}
	s.setDeadline(time.Time{})
	// The guard fires for the finished batch, finds none pending and stays quiet.
	eventually.True(t, "the guard to find no batch pending", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return !s.armed
	})
	select {
	case <-ended:
		t.Fatal("the connection closed after its batch was written in time")
	default:
	}
	// Armed by the first batch, read at a second batch's later deadline.
	s.setDeadline(time.Now().Add(20 * time.Millisecond))
	s.setDeadline(time.Time{})
	s.setDeadline(time.Now().Add(80 * time.Millisecond))
	awaitClosed(t, ended, "the batch being written")
}

// A frame the app sends in the same write as its upgrade request reaches
// the gateway's buffer before the connection is handed over: it is still
// read (the subscribe is answered), and, like every frame after it, an
// event too large for the connection's buffers is written whole.
func TestFrameSentWithUpgradeRequestIsRead(t *testing.T) {
	e := newEnv(t)
	nc, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	sub := wire.Append(wire.JSON, nil, &wire.Frame{Op: wire.OpSubscribe, ID: 1, ClientID: client1,
		Filter: &schema.EventFilter{Kinds: recvKinds}})
	req := "GET /v1/events HTTP/1.1\r\nHost: gateway\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n" +
		"Sec-WebSocket-Protocol: " + wire.SubprotocolJSON + "\r\n" +
		"Authorization: Bearer " + token(t, tenantA, client1) + "\r\n\r\n"
	if _, err := nc.Write(append([]byte(req), maskedText(sub)...)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade answered %s", resp.Status)
	}
	f, err := wire.Decode(wire.JSON, readServerFrame(t, br))
	if err != nil || f.Op != wire.OpSubscribed || f.ID != 1 {
		t.Fatalf("first frame %+v (%v), want subscribed 1", f, err)
	}
	big := received(groupA, 1, nil)
	big.MessageReceived.SenderInboxID = strings.Repeat("x", 3*wsWriteBuffer)
	e.publish(tenantA, client1, published{ev: big})
	f, err = wire.Decode(wire.JSON, readServerFrame(t, br))
	if err != nil || f.Op != wire.OpEvent {
		t.Fatalf("second frame %+v (%v), want the event", f, err)
	}
	if ev := decodeJSONEvent(t, f.Event); ev.MessageReceived == nil || ev.MessageReceived.SenderInboxID != big.MessageReceived.SenderInboxID {
		t.Fatalf("event %+v, want the large one whole", ev)
	}
}

// maskedText is one client text frame (RFC 6455 §5.2) carrying p.
func maskedText(p []byte) []byte {
	key := [4]byte{1, 2, 3, 4}
	b := []byte{0x81}
	switch n := len(p); {
	case n < 126:
		b = append(b, 0x80|byte(n))
	default:
		b = append(b, 0x80|126, byte(n>>8), byte(n))
	}
	b = append(b, key[:]...)
	for i, c := range p {
		b = append(b, c^key[i%4])
	}
	return b
}

// readServerFrame reads one unfragmented, unmasked server frame's payload.
func readServerFrame(t *testing.T, br *bufio.Reader) []byte {
	t.Helper()
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		t.Fatal(err)
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var l [2]byte
		if _, err := io.ReadFull(br, l[:]); err != nil {
			t.Fatal(err)
		}
		n = uint64(binary.BigEndian.Uint16(l[:]))
	case 127:
		var l [8]byte
		if _, err := io.ReadFull(br, l[:]); err != nil {
			t.Fatal(err)
		}
		n = binary.BigEndian.Uint64(l[:])
	}
	if h[0] != 0x81 || n > 1<<20 {
		t.Fatalf("frame header %x, length %d: want one text frame", h, n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(br, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// A drain does not wait out the connect timeout of a connection still
// owing its connect frame: Shutdown closes it and returns once the goroutine
// serving it is done (every goroutine the gateway starts ends before Run
// returns).
func TestShutdownEndsConnectionAwaitingConnectFrame(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ConnectTimeout = time.Minute })
	ws, _, err := websocket.Dial(e.ctx, e.wsURL(), &websocket.DialOptions{Subprotocols: []string{wire.SubprotocolJSON}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.g.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown with a connection awaiting its connect frame: %v", err)
	}
	if _, _, err := ws.Read(ctx); err == nil || ctx.Err() != nil {
		t.Fatalf("the connection stayed open after the drain: %v", err)
	}
}

// writesConn records each write that reaches the socket.
type writesConn struct {
	net.Conn
	writes [][]byte
}

func (w *writesConn) Write(p []byte) (int, error) {
	w.writes = append(w.writes, bytes.Clone(p))
	return len(p), nil
}

// The frames of a batch leave the gateway in one write (as Centrifugo's
// writer joins queued messages), in order; outside a batch each goes
// through at once, and a batch past maxGathered is written in parts, in
// order.
func TestBatchOfFramesIsOneWrite(t *testing.T) {
	w := &writesConn{}
	c := &corkedConn{Conn: w}
	write := func(p []byte) {
		t.Helper()
		if n, err := c.Write(p); err != nil || n != len(p) {
			t.Fatalf("write: %d, %v", n, err)
		}
	}
	write([]byte("a"))
	if len(w.writes) != 1 {
		t.Fatalf("an uncorked frame made %d writes, want 1", len(w.writes))
	}
	c.cork()
	write([]byte("b"))
	write([]byte("cd"))
	write([]byte("e"))
	if len(w.writes) != 1 {
		t.Fatalf("%d writes before the batch ended, want none", len(w.writes)-1)
	}
	if err := c.uncork(); err != nil {
		t.Fatal(err)
	}
	if len(w.writes) != 2 || string(w.writes[1]) != "bcde" {
		t.Fatalf("the batch was written as %q, want one write of \"bcde\"", w.writes[1:])
	}
	c.cork()
	big := bytes.Repeat([]byte("x"), maxGathered)
	write([]byte("f"))
	write(big)
	write(append([]byte(nil), big...))
	if err := c.uncork(); err != nil {
		t.Fatal(err)
	}
	got := bytes.Join(w.writes[2:], nil)
	if want := append(append([]byte("f"), big...), big...); !bytes.Equal(got, want) || len(w.writes) > 5 {
		t.Fatalf("a batch past the bound made %d writes of %d bytes, want its %d bytes in order", len(w.writes)-2, len(got), len(want))
	}
}
