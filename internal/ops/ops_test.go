package ops

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

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
