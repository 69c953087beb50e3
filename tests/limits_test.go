package tests

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/demo"
)

// TestDescriptorExhaustionDoesNotStopWrites runs the all-in-one under a low
// open-file limit, opens more idle keep-alive connections than it has
// descriptors, holds them past the time JetStream closes an idle block file
// (30 s), writes, releases them, and checks that writes and readiness work
// (or that the process exited non-zero, for a supervisor to restart it), and
// that a NATS client can connect during the flood (the descriptor reserve).
// Without the connection bound the idle connections filled the table, the
// block file could not be reopened, and JetStream refused every later write.
func TestDescriptorExhaustionDoesNotStopWrites(t *testing.T) {
	t.Parallel()
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit is not installed")
	}
	const limit, flood = 400, 1000
	const idleBlockClose = 35 * time.Second
	data := t.TempDir()
	p := start(t, prlimit, nil, "--nofile=400:400", filepath.Join(binaries(t), "fabric"),
		"run", "-data", data, "-listen", freeAddr(t), "-nats-listen", "127.0.0.1:0")
	url := p.waitLine(t, "HTTP API", time.Minute)
	natsURL := p.waitLine(t, "NATS", 5*time.Second)
	admin := p.waitLine(t, "admin", 5*time.Second)
	waitReady(t, url+"/readyz", 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// A connection kept alive from before the flood carries the writes made
	// while it lasts.
	kept := &demo.API{BaseURL: url, Tenant: "dev", AdminToken: admin,
		HTTP: &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1}, Timeout: 10 * time.Second}}
	register := func(api *demo.API) error {
		id := make([]byte, 32)
		rand.Read(id)
		_, err := api.Register(ctx, hex.EncodeToString(id))
		return err
	}
	if err := register(kept); err != nil {
		t.Fatal(err)
	}

	addr := strings.TrimPrefix(url, "http://")
	var idle []net.Conn
	for range flood {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			continue // the backlog is full: the flood has done its part
		}
		idle = append(idle, c)
		// One request makes it an idle keep-alive connection.
		_, _ = c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
	}
	t.Logf("%d idle connections held against a limit of %d descriptors", len(idle), limit)
	time.Sleep(idleBlockClose) // JetStream closes the idle block files meanwhile; nothing to await
	for i := range 20 {
		if err := register(kept); err != nil {
			t.Errorf("write %d during the flood: %v", i, err)
			break
		}
	}
	// The reserve keeps descriptors for NATS: a role can still join.
	var opts []nats.Option
	if pw, err := os.ReadFile(allinone.NATSPasswordFile(data, allinone.UserFanout)); err == nil {
		opts = append(opts, nats.UserInfo(allinone.UserFanout, strings.TrimSpace(string(pw))))
	}
	nc, err := nats.Connect(natsURL, append(opts, nats.Timeout(5*time.Second))...)
	if err != nil {
		t.Errorf("a NATS connection during the flood: %v", err)
	} else {
		nc.Close()
	}
	for _, c := range idle {
		c.Close()
	}

	select {
	case <-p.done:
		if code := p.cmd.ProcessState.ExitCode(); code == 0 {
			t.Fatal("the fabric exited 0 after the flood")
		}
		return
	default:
	}
	waitReady(t, url+"/readyz", 30*time.Second)
	fresh := &demo.API{BaseURL: url, Tenant: "dev", AdminToken: admin, HTTP: &http.Client{Timeout: 10 * time.Second}}
	for i := range 20 {
		if err := register(fresh); err != nil {
			t.Fatalf("write %d after the flood: %v", i, err)
		}
	}
}
