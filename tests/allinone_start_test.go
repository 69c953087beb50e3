package tests

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A busy port stops `fabric run` at once with exit status 1 and a message
// naming the address, instead of a panic or a ten-second wait: the HTTP
// listener and the embedded NATS server's client port each.
func TestAllInOneBusyPortIsNamedAndExits(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(binaries(t), "fabric")
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	for name, args := range map[string][]string{
		"http": {"-listen", addr, "-nats-listen", "127.0.0.1:0"},
		"nats": {"-listen", freeAddr(t), "-nats-listen", addr},
	} {
		t.Run(name, func(t *testing.T) {
			began := time.Now()
			out, code := runToExit(t, bin, nil, append([]string{"run", "-data", t.TempDir()}, args...)...)
			took := time.Since(began)
			if code != 1 || strings.Contains(out, "panic") {
				t.Fatalf("exit status %d, want 1 without a panic:\n%s", code, out)
			}
			if !strings.Contains(out, addr) || !strings.Contains(out, "address already in use") {
				t.Errorf("the error does not name the busy address %s:\n%s", addr, out)
			}
			// The old code waited out the server's 10 s readiness timeout.
			if took > 5*time.Second {
				t.Errorf("took %s to give up on a busy port", took)
			}
		})
	}
}

// A second fabric on a data directory in use refuses to start, at once,
// saying why; the first keeps serving.
func TestAllInOneSecondInstanceOnOneDataDirRefuses(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(binaries(t), "fabric")
	data := t.TempDir()
	first := start(t, bin, nil, "run", "-data", data, "-listen", freeAddr(t), "-nats-listen", "127.0.0.1:0")
	url := first.waitLine(t, "HTTP API", time.Minute)
	waitReady(t, url+"/readyz", 30*time.Second)

	out, code := runToExit(t, bin, nil, "run", "-data", data, "-listen", freeAddr(t), "-nats-listen", "127.0.0.1:0")
	if code != 1 || !strings.Contains(out, "in use by another fabric") || !strings.Contains(out, data) {
		t.Fatalf("second instance: exit status %d, want 1 naming the data directory in use:\n%s", code, out)
	}
	waitReady(t, url+"/readyz", 5*time.Second)
}
