package natsserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// clusterName is the name every node of a StartCluster cluster shares.
const clusterName = "fabric-test"

// Cluster is a set of routed JetStream servers on loopback.
type Cluster struct {
	nodes []*Server
}

// StartCluster starts n routed JetStream nodes on loopback, each with its
// own store directory under baseDir, and waits until the JetStream meta
// layer has a leader and every node is current, or ctx ends.
func StartCluster(ctx context.Context, n int, baseDir string) (*Cluster, error) {
	if n < 1 {
		return nil, errors.New("natsserver: a cluster needs at least one node")
	}
	clientPorts, err := reservePorts(n)
	if err != nil {
		return nil, err
	}
	routePorts, err := reservePorts(n)
	if err != nil {
		return nil, err
	}
	routeURLs := make([]string, n)
	for i, p := range routePorts {
		routeURLs[i] = "nats://" + net.JoinHostPort(DefaultHost, strconv.Itoa(p))
	}
	routes := make([]*url.URL, n)
	for i, u := range routeURLs {
		if routes[i], err = url.Parse(u); err != nil {
			return nil, fmt.Errorf("natsserver: route url: %w", err)
		}
	}

	c := &Cluster{nodes: make([]*Server, n)}
	for i := range n {
		c.nodes[i] = &Server{opts: Options{
			StoreDir:   filepath.Join(baseDir, fmt.Sprintf("node%d", i)),
			Host:       DefaultHost,
			Port:       clientPorts[i],
			ServerName: fmt.Sprintf("node%d", i),
			Cluster: &ClusterOptions{
				Name:   clusterName,
				Host:   DefaultHost,
				Port:   routePorts[i],
				Routes: routes,
			},
		}}
	}
	// Start concurrently: a node waits for its routes before it reports
	// ready, so starting one at a time would wait out each timeout.
	errs := make(chan error, n)
	for _, s := range c.nodes {
		go func() { errs <- s.start(ctx) }()
	}
	var startErr error
	for range n {
		startErr = errors.Join(startErr, <-errs)
	}
	if startErr == nil {
		startErr = c.WaitReady(ctx)
	}
	if startErr != nil {
		c.Shutdown()
		return nil, startErr
	}
	return c, nil
}

// reservePorts picks n free loopback ports by listening on port 0. The
// listeners are closed before the servers bind, so another process could
// take a port in between; on loopback in tests that risk is accepted.
func reservePorts(n int) ([]int, error) {
	ports := make([]int, n)
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := range n {
		l, err := net.Listen("tcp", net.JoinHostPort(DefaultHost, "0"))
		if err != nil {
			return nil, fmt.Errorf("natsserver: reserve port: %w", err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// Nodes returns the cluster's nodes; index i is the node named "node<i>".
func (c *Cluster) Nodes() []*Server { return c.nodes }

// Node returns node i.
func (c *Cluster) Node(i int) *Server { return c.nodes[i] }

// ClientURLs returns the client URLs of every node, comma-separated, the
// form nats.Connect accepts for a cluster.
func (c *Cluster) ClientURLs() string {
	urls := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		urls[i] = s.ClientURL()
	}
	return strings.Join(urls, ",")
}

// Connect opens a client connection that knows every node, so it fails
// over when one stops.
func (c *Cluster) Connect(opts ...nats.Option) (*nats.Conn, error) {
	return nats.Connect(c.ClientURLs(), opts...)
}

// Restart restarts node i with its store and ports and waits until the
// cluster is ready again.
func (c *Cluster) Restart(ctx context.Context, i int) error {
	if err := c.nodes[i].Restart(ctx); err != nil {
		return err
	}
	return c.WaitReady(ctx)
}

// WaitReady waits until the running nodes agree on a JetStream meta leader,
// each is current with it, and a client can read its account's JetStream
// information.
func (c *Cluster) WaitReady(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*defaultReadyTimeout)
		defer cancel()
	}
	for {
		if c.metaReady() && c.accountReady(ctx) {
			return nil
		}
		if err := sleep(ctx, 25*time.Millisecond); err != nil {
			return fmt.Errorf("natsserver: waiting for JetStream cluster: %w", err)
		}
	}
}

// metaReady reports a meta leader that every running node follows and
// that counts every running node as a placement peer: until a peer's
// statistics reach the leader, an R3 stream is refused with "no suitable
// peers for placement".
func (c *Cluster) metaReady() bool {
	running, peers := 0, 0
	for _, s := range c.nodes {
		ns := s.NATS()
		if ns == nil {
			continue
		}
		running++
		if !ns.JetStreamIsCurrent() {
			return false
		}
		if ns.JetStreamIsLeader() {
			peers = len(ns.JetStreamClusterPeers())
		}
	}
	return running > 0 && peers >= running
}

func (c *Cluster) accountReady(ctx context.Context) bool {
	for _, s := range c.nodes {
		if !s.Running() {
			continue
		}
		nc, err := s.Connect()
		if err != nil {
			return false
		}
		js, err := jetstream.New(nc)
		if err == nil {
			_, err = js.AccountInfo(ctx)
		}
		nc.Close()
		if err != nil {
			return false
		}
	}
	return true
}

// Shutdown stops every node and waits for them.
func (c *Cluster) Shutdown() {
	for _, s := range c.nodes {
		s.Shutdown()
	}
}
