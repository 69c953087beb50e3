package fanout

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
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
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection stayed open past the write deadline of a batch still being written")
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
	eventually(t, "the guard to find no batch pending", func() bool {
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
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection stayed open past the write deadline of the batch being written")
	}
}
