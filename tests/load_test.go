package tests

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// `fabric load` drives real MLS traffic from remote members through ingest
// into hosted clients of a fresh all-in-one process and out to one
// WebSocket subscriber per client: at a tiny size every message reaches
// every subscriber, and the report names throughput, latency and each
// process's CPU and RSS (issue 21).
// With -cluster the target is ingest, converge and fanout as processes on
// a three-node NATS cluster. With -clients-per-conn one WebSocket carries
// the subscriptions of several hosted clients, of more than one group, as
// an app backend multiplexing its users would: every event still reaches
// its own client's subscription.
func TestLoadCommandDeliversEveryMessageToEverySubscriber(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		flags []string
		roles []string
		conns string // the WebSockets the report names
	}{
		{"all-in-one", nil, []string{"all-in-one", "load driver"}, "on 4 WebSockets"},
		{"cluster", []string{"-cluster"}, []string{"ingest", "converge", "fanout", "3 NATS nodes + driver"}, "on 4 WebSockets"},
		// Per tenant, two groups' four hosted clients on two connections:
		// three on the first, whose clients are of both groups, one on the second.
		{"shared connections", []string{"-groups", "2", "-clients-per-conn", "3"}, []string{"all-in-one", "load driver"}, "on 4 WebSockets, up to 3 per connection"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"load", "-tenants", "2", "-groups", "1", "-members", "2", "-rate", "20", "-duration", "1s", "-drain", "5s"}, c.flags...)
			out, code := runToExit(t, filepath.Join(binaries(t), "fabric"), nil, args...)
			if code != 0 {
				t.Fatalf("fabric load: exit status %d:\n%s", code, out)
			}
			m := regexp.MustCompile(`messages sent (\d+), events expected (\d+), delivered (\d+) \(100\.0 %\), lagged 0`).FindStringSubmatch(out)
			if m == nil || m[1] == "0" || m[2] != m[3] {
				t.Fatalf("fabric load did not deliver every message to every subscriber without lagged:\n%s", out)
			}
			for _, want := range []string{c.conns, "throughput:", "p50 ", "p99 ", "p99.9 ", "load average"} {
				if !strings.Contains(out, want) {
					t.Errorf("fabric load's report lacks %q:\n%s", want, out)
				}
			}
			for _, role := range c.roles {
				if !strings.Contains(out, "\n"+role+" ") {
					t.Errorf("fabric load's report has no line for %s:\n%s", role, out)
				}
			}
		})
	}
}
