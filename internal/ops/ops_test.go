package ops

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestServerEndpointsAndDrain(t *testing.T) {
	reg := NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "fabric_test_things_total", Help: "Things."})
	reg.MustRegister(c)
	c.Inc()
	s, err := New("127.0.0.1:0", reg)
	if err != nil {
		t.Fatal(err)
	}
	var notReady = errors.New("nats down")
	ready := notReady
	s.AddReady(func(context.Context) error { return ready })
	s.Handle("GET /v1/ping", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("pong")) }))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, 5*time.Second) }()
	base := "http://" + s.Addr()

	if code, body := get(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("healthz %d %q", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "nats down") {
		t.Errorf("readyz before ready %d %q", code, body)
	}
	ready = nil
	if code, _ := get(t, base+"/readyz"); code != 200 {
		t.Errorf("readyz when ready %d", code)
	}
	if _, body := get(t, base+"/metrics"); !strings.Contains(body, "fabric_test_things_total 1") || !strings.Contains(body, "go_goroutines") {
		t.Errorf("metrics lack expected series:\n%s", body)
	}
	if code, body := get(t, base+"/v1/ping"); code != 200 || body != "pong" {
		t.Errorf("route %d %q", code, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	http.DefaultClient.CloseIdleConnections()
}

// dialFrom opens a TCP connection to addr from the loopback address local.
func dialFrom(t *testing.T, local, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// served reports whether the server answers a request on c; false when it
// closed c.
func served(c net.Conn) bool {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return false
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

// Idle connections cannot fill the descriptor table: past the total and the
// per-address bound a connection is closed at accept, an idle keep-alive
// connection is closed after the idle timeout, and a freed slot is reused.
func TestConnectionBoundsKeepDescriptorsFree(t *testing.T) {
	reg := NewRegistry()
	s, err := NewWithLimits("127.0.0.1:0", reg, Limits{MaxConns: 3, MaxConnsPerAddr: 2, IdleTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, 5*time.Second) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	a1, a2 := dialFrom(t, "127.0.0.1", s.Addr()), dialFrom(t, "127.0.0.1", s.Addr())
	if !served(a1) || !served(a2) {
		t.Fatal("connections within the bounds are not served")
	}
	if served(dialFrom(t, "127.0.0.1", s.Addr())) {
		t.Error("a third connection from one address was served past the per-address bound of 2")
	}
	b1 := dialFrom(t, "127.0.0.2", s.Addr())
	if !served(b1) {
		t.Fatal("another address is not served")
	}
	if served(dialFrom(t, "127.0.0.3", s.Addr())) {
		t.Error("a fourth connection was served past the total bound of 3")
	}
	// The idle timeout closes the three; their slots are free again.
	for _, c := range []net.Conn{a1, a2, b1} {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Errorf("idle keep-alive connection not closed by the server: %v", err)
		}
	}
	eventually.True(t, "a freed slot is reused", func() bool { return served(dialFrom(t, "127.0.0.3", s.Addr())) })
	if _, body := get(t, "http://"+s.Addr()+"/metrics"); !strings.Contains(body, `fabric_http_connections_refused_total{reason="per_address"} 1`) ||
		!strings.Contains(body, `fabric_http_connections_refused_total{reason="total"}`) {
		t.Errorf("refusals not counted:\n%s", body)
	}
	http.DefaultClient.CloseIdleConnections()
}
